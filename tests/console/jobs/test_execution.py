"""The worker's side, run in this process against the real engine: claiming, refusing, failing, reconciling."""

import json
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from console.audit.models import AuditEvent
from console.engine import EngineClient
from console.jobs import lifecycle, worker
from console.jobs.errors import Conflict
from console.jobs.models import Approval, Job
from contracts.attestation import verify_attestation
from tests.support.jobs import actions, apply_as_the_worker, at_once, move_engine
from tests.support.live_service import LiveService, free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queued_job(propose_cut, reviewer, handoffs):
    """queued_job() -> a job approved and queued (its hand-off recorded, not sent)."""
    def make():
        job = propose_cut()
        return lifecycle.approve(reviewer, job)
    return make


def test_a_job_runs_to_success_with_the_predicted_pool(live_engine, queued_job):
    job = queued_job()
    assert worker.execute(job.pk, worker="w1", task_id="t1") == "succeeded"
    job.refresh_from_db()
    assert (job.status, job.worker, job.task_id, job.error) == ("succeeded", "w1", "t1", "")
    assert job.measured["pool_tokens"] == job.prediction["pool_tokens"]
    assert job.operation["id"] == job.engine_operation_id and job.progress == 1.0
    assert live_engine.state()["cut"] == job.target["cut"]
    assert actions(job)[-3:] == ["job.running", "job.applied", "job.succeeded"]
    applied = AuditEvent.objects.get(subject=f"job:{job.pk}", action="job.applied")
    assert applied.payload["approvers"] == ["rita"] and applied.payload["reconciled"] is False


def test_two_workers_picking_the_same_job_only_one_claims_it(queued_job):
    job = queued_job()
    results = at_once([lambda n=n: lifecycle.start(job.pk, worker=f"w{n}") for n in range(4)])
    won = [r for r in results if isinstance(r, Job)]
    assert len(won) == 1 and all(isinstance(r, Conflict) for r in results if r not in won), results
    job.refresh_from_db()
    assert job.status == "running" and job.worker == won[0].worker
    assert actions(job).count("job.running") == 1


def test_a_second_delivery_of_a_running_job_leaves_it_alone(queued_job, settings):
    job = queued_job()
    lifecycle.start(job.pk, worker="first")
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"  # were the engine asked at all, the job would fail
    assert worker.execute(job.pk, worker="second") == "running"
    job.refresh_from_db()
    assert (job.status, job.worker, job.error) == ("running", "first", "")


def test_an_unreachable_engine_fails_the_job_with_the_reason(queued_job, settings):
    job = queued_job()
    settings.ENGINE_URL = dead = f"http://127.0.0.1:{free_port()}"
    assert worker.execute(job.pk) == "failed"
    job.refresh_from_db()
    assert job.status == "failed" and job.engine_operation_id == ""
    assert f"engine unreachable at {dead}" in job.error and "nothing was applied" in job.error


def test_a_plan_changed_after_review_is_not_applied(live_engine, queued_job):
    job = queued_job()
    before = live_engine.state()["fingerprint"]
    tampered = {**job.plan, "target": {"cut": [6, 6, 4]}}
    Job.objects.filter(pk=job.pk).update(plan=tampered)
    assert worker.execute(job.pk) == "failed"
    job.refresh_from_db()
    assert "not the reviewed one" in job.error and live_engine.state()["fingerprint"] == before


class RecordingTransport(httpx.HTTPTransport):
    """The real client's HTTP transport, noting every control API call it carries, and the bodies it sends."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []
        self.bodies: dict[str, dict] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        if request.content:
            self.bodies[request.url.path] = json.loads(request.content)
        return super().handle_request(request)


def test_the_plan_is_applied_with_an_attestation_of_its_review(live_engine, queued_job, settings):
    job = queued_job()
    recorded = RecordingTransport()
    with EngineClient(transport=recorded) as client:
        assert worker.execute(job.pk, client=client) == "succeeded"
    sent = recorded.bodies["/control/apply"]
    attested = verify_attestation(settings.SEAM_APPROVAL_KEY, sent["attestation"], job.plan_hash, time.time())
    assert (attested.job_id, attested.approvers) == (job.pk, ("rita",))
    assert time.time() - attested.issued_at < 60  # signed for this run, not earlier
    head = attested.audit_head  # the trail's newest event when the worker signed, for the engine to witness
    assert head.trail == AuditEvent.objects.get(seq=1).hash
    assert AuditEvent.objects.get(seq=head.seq).hash == head.hash and head.seq >= 4  # proposed .. queued at least


def test_without_the_approval_key_nothing_is_applied(live_engine, queued_job, settings):
    job = queued_job()
    before = live_engine.state()["fingerprint"]
    settings.SEAM_APPROVAL_KEY = ""
    recorded = RecordingTransport()
    with EngineClient(transport=recorded) as client:
        assert worker.execute(job.pk, client=client) == "failed"
    assert "POST /control/apply" not in recorded.calls
    job.refresh_from_db()
    assert "no approval key (SEAM_APPROVAL_KEY is not set)" in job.error and "nothing was applied" in job.error
    assert job.engine_operation_id == "" and live_engine.state()["fingerprint"] == before


def test_approvals_that_expired_before_the_job_ran_apply_nothing(live_engine, queued_job):
    job = queued_job()
    before = live_engine.state()["fingerprint"]
    long_ago = timezone.now() - timedelta(days=2)
    Approval.objects.filter(job=job).update(created=long_ago, expires_at=long_ago + timedelta(hours=1))
    assert worker.execute(job.pk) == "failed"
    job.refresh_from_db()
    assert "no approval of plan" in job.error and "nothing was applied" in job.error
    assert live_engine.state()["fingerprint"] == before


def test_a_stale_plan_ends_stale_without_asking_the_engine_to_apply_it(live_engine, queued_job):
    job = queued_job()
    moved = move_engine(live_engine)
    recorded = RecordingTransport()
    with EngineClient(transport=recorded) as client:
        assert worker.execute(job.pk, client=client) == "stale"
    assert recorded.calls == ["GET /control/state"]  # read the fingerprint, and nothing else (rule 4)
    job.refresh_from_db()
    assert job.engine_operation_id == "" and f"now runs layout {moved}" in job.error
    assert live_engine.state()["fingerprint"] == moved


@pytest.mark.slow  # an engine of its own, with a fault
def test_a_failed_verification_rolls_back_and_the_job_records_both(demo_checkpoint, make_user, settings, handoffs):
    faulty = LiveService(demo_checkpoint, extra_env={"SEAM_FAULT_CORRUPT_RANK": "1"})  # a fault no other test meets
    try:
        settings.ENGINE_URL = faulty.url
        before = faulty.state()
        job = lifecycle.propose(make_user("operator"), {"kind": "cut", "target": {"cut": [6, 6, 4]}})
        lifecycle.approve(make_user("reviewer"), job)
        assert worker.execute(job.pk) == "rolled_back"
        job.refresh_from_db()
        assert "checksum mismatch" in job.error
        assert job.operation["predicted"]["pool_tokens"] == job.prediction["pool_tokens"]  # what was tried
        assert job.operation["previous"]["pool_tokens"] == before["pool_tokens"]  # what was restored, measured
        assert faulty.state()["fingerprint"] == before["fingerprint"]
        event = AuditEvent.objects.get(subject=f"job:{job.pk}", action="job.rolled_back")
        assert event.payload["previous_pool_tokens"] == before["pool_tokens"]
        assert event.payload["engine_predicted_pool_tokens"] == job.prediction["pool_tokens"]
    finally:
        faulty.stop()


# --- the reconciler ------------------------------------------------------------------------------

def _left_running(job, operation_id: str = "") -> Job:
    """What a worker that died leaves behind: a running job (with the engine's operation id, if it got that far),
    whose heartbeat stopped ten minutes ago."""
    lifecycle.start(job.pk, worker="dead")
    if operation_id:
        lifecycle.record_operation(job.pk, operation_id)
    Job.objects.filter(pk=job.pk).update(updated=timezone.now() - timedelta(minutes=10))
    return Job.objects.get(pk=job.pk)


def test_the_reconciler_settles_a_job_from_the_engines_operation_record(live_engine, queued_job):
    job = queued_job()
    operation_id = apply_as_the_worker(job)  # the worker got this far, then died
    _left_running(job, operation_id)
    live_engine.wait_operation(operation_id)
    assert worker.reconcile(older_than_s=3600) == []  # a heartbeat ten minutes old is not yet too old here
    assert worker.reconcile(older_than_s=60) == [(job.pk, "succeeded")]
    job.refresh_from_db()
    assert job.status == "succeeded" and job.measured["pool_tokens"] == job.prediction["pool_tokens"]
    event = AuditEvent.objects.get(subject=f"job:{job.pk}", action="job.succeeded")
    assert event.actor is None and event.payload["reconciled"] is True
    assert event.payload["operation_id"] == operation_id


def test_the_reconciler_fails_a_job_the_engine_never_got(live_engine, queued_job):
    before = live_engine.state()["fingerprint"]
    job = _left_running(queued_job())
    assert worker.reconcile(older_than_s=60) == [(job.pk, "failed")]
    job.refresh_from_db()
    assert "no operation id" in job.error and live_engine.state()["fingerprint"] == before


def test_the_reconciler_decides_nothing_while_the_engine_is_unreachable(queued_job, settings):
    job = _left_running(queued_job(), "op-42-gone")
    live_url = settings.ENGINE_URL
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"
    [(job_id, outcome)] = worker.reconcile(older_than_s=60)
    assert job_id == job.pk and outcome.startswith("left running: engine unreachable")
    assert Job.objects.get(pk=job.pk).status == "running"
    settings.ENGINE_URL = live_url  # back, but it has no record of that operation
    assert worker.reconcile(older_than_s=60) == [(job.pk, "failed")]
    assert "no record of operation op-42-gone" in Job.objects.get(pk=job.pk).error


def test_the_reconciler_sends_a_stuck_queued_job_again(queued_job, handoffs):
    job = queued_job()
    assert handoffs == [job.pk]
    assert worker.reconcile(older_than_s=60) == []
    Job.objects.filter(pk=job.pk).update(updated=timezone.now() - timedelta(minutes=10))
    assert worker.reconcile(older_than_s=60) == [(job.pk, "sent to the worker again")]
    assert handoffs == [job.pk, job.pk]


class ReplyLost(httpx.HTTPTransport):
    """Delivers every request to the engine; the reply to the first POST /control/apply is lost on its way back (a
    read timeout), and with `then_down` nothing reaches the engine after that (the connection is refused)."""

    def __init__(self, then_down: bool = False):
        super().__init__()
        self.then_down, self.lost = then_down, False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.lost and self.then_down:
            raise httpx.ConnectError("connection refused", request=request)
        response = super().handle_request(request)
        if not self.lost and request.method == "POST" and request.url.path == "/control/apply":
            response.read()
            response.close()
            self.lost = True
            raise httpx.ReadTimeout("the reply was lost", request=request)
        return response


def test_an_apply_whose_reply_is_lost_is_found_by_plan_hash_and_followed(live_engine, queued_job):
    job = queued_job()
    with EngineClient(transport=ReplyLost()) as client:
        assert worker.execute(job.pk, client=client) == "succeeded"
    job.refresh_from_db()
    [operation] = [op for op in live_engine.client.get("/control/operations", params={"plan_hash": job.plan_hash})
                   .json()["operations"] if op["job_id"] == job.pk]  # applied once: the lookup did not apply again
    assert job.engine_operation_id == operation["id"] and job.error == ""
    assert live_engine.state()["cut"] == job.target["cut"]
    assert actions(job)[-2:] == ["job.applied", "job.succeeded"]


def test_an_apply_whose_reply_is_lost_with_the_engine_is_left_to_the_reconciler(live_engine, queued_job):
    job = queued_job()
    with EngineClient(transport=ReplyLost(then_down=True)) as client:
        assert worker.execute(job.pk, client=client) == "running"
    job.refresh_from_db()
    assert (job.status, job.phase, job.engine_operation_id) == ("running", "unconfirmed", "")
    [operation] = [op for op in live_engine.client.get("/control/operations", params={"plan_hash": job.plan_hash})
                   .json()["operations"] if op["job_id"] == job.pk]  # the engine took the plan
    live_engine.wait_operation(operation["id"])
    Job.objects.filter(pk=job.pk).update(updated=timezone.now() - timedelta(minutes=10))
    assert worker.reconcile(older_than_s=60) == [(job.pk, "succeeded")]
    job.refresh_from_db()
    assert (job.status, job.engine_operation_id) == ("succeeded", operation["id"])
    assert live_engine.state()["cut"] == job.target["cut"]

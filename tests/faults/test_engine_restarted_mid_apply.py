"""An engine killed while it applies a job's cut change, and started again on its start-up layout: the layout it comes
back on is neither the job's target nor the layout the job started from, so it is not credited to the job — the job
fails naming the restart, and one alert is raised: an `engine.restarted_mid_apply` audit event, a dashboard warning
and the webhook of that name (issue 30, item 7).

The engine really dies (SIGKILL of its service and rank processes, with a rank held so the operation is mid-apply)
and really starts again (same port and state folder, a new boot id); the worker's code follows the job, the
reconciler settles one whose worker died, the layout watch then looks, and a real Celery worker delivers the
webhooks to a real local HTTP receiver. A job whose worker lost the engine right after the operation ended, so that
its layout was never noted, is not credited by the layout watch with what a restarted engine runs either."""

from __future__ import annotations

import json
import re
import threading
from contextlib import suppress

import pytest
from django.db import connections

from console.audit.models import AuditEvent
from console.jobs import layout_watch, lifecycle, worker
from console.jobs.layout_watch import RESTARTED_MID_APPLY, UNEXPLAINED_CHANGE
from console.jobs.models import Job
from tests.support.faults import operation_phase, rank_held, rank_pids, sigkill, wait_until
from tests.support.jobs import apply_as_the_worker, other_cut, wait_for_end
from tests.support.live_service import LiveService
from tests.support.webhooks import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KEY = "restart-webhook-key"


class RestartableEngine:
    """An engine of the test's own that can be killed mid-operation and started again where it was."""

    def __init__(self, checkpoint, state_dir):
        self.checkpoint, self.state_dir = checkpoint, state_dir
        self.live = LiveService(checkpoint, state_dir=state_dir)

    def kill(self) -> None:
        """SIGKILL the service and every rank process: no clean stop, no rollback."""
        pids = rank_pids(self.live)
        sigkill(self.live.process.pid)
        self.live.process.wait()
        for pid in pids:
            with suppress(ProcessLookupError):
                sigkill(pid)

    def restart(self) -> None:
        self.live = LiveService(self.checkpoint, state_dir=self.state_dir, port=self.live.port)

    def stop(self) -> None:
        self.live.stop()


@pytest.fixture
def own_engine(demo_checkpoint, tmp_path, settings):
    engine = RestartableEngine(demo_checkpoint, tmp_path / "engine")
    settings.ENGINE_URL = engine.live.url
    yield engine
    engine.stop()


@pytest.fixture
def receiver(settings):
    """A real HTTP receiver the console's webhooks point at."""
    target = Receiver()
    settings.SEAM_WEBHOOK_URLS, settings.SEAM_WEBHOOK_KEY = [target.url], KEY
    yield target
    target.close()


@pytest.fixture
def moved_off_start(own_engine, operator, reviewer, handoffs):
    """The engine moved off its start-up layout by a console job (a shape change) that succeeded and was noted, so
    a restart brings back a layout no later job leads to. Returns (start-up state, state after the job)."""
    start = own_engine.live.state()
    assert layout_watch.watch() == f"first seen: layout {start['fingerprint']}"
    seqs = start["shape"]["max_num_seqs"]
    job = lifecycle.approve(reviewer, lifecycle.propose(operator, {"kind": "shape", "target": {
        "max_num_seqs": 6 if seqs != 6 else 7}}))
    assert worker.execute(job.pk) == "succeeded"
    moved = own_engine.live.state()
    assert moved["fingerprint"] != start["fingerprint"]
    return start, moved


def _cut_change(engine, operator, reviewer) -> Job:
    return lifecycle.approve(reviewer, lifecycle.propose(operator, {"kind": "cut",
                                                                    "target": {"cut": other_cut(engine.live)}}))


def _kill_mid_apply(engine, operation_id: str) -> None:
    """The operation is held at `acting` (rank 2 stopped); the engine then dies and starts again."""
    wait_until(lambda: operation_phase(engine.live, operation_id) == "acting", what="the operation to act")
    engine.kill()
    engine.restart()


def _warning(client) -> str | None:
    page = client.get("/").content.decode()
    found = re.search(r'data-testid="engine-restarted-mid-apply">(.*?)</p>', page, re.S)
    return " ".join(found.group(1).split()) if found else None


def _alerts(receiver: Receiver) -> list[dict]:
    return [json.loads(post["body"]) for post in receiver.received
            if post["headers"].get("X-Seam-Event") == RESTARTED_MID_APPLY]


def _assert_one_alert(job: Job, before: dict, after: dict, receiver: Receiver, viewer, client,
                      status: str = "failed") -> None:
    [event] = AuditEvent.objects.filter(action=RESTARTED_MID_APPLY)
    layout = ("fingerprint", "cut", "shape")
    assert event.actor is None and event.actor_name == "system"
    assert event.before == {key: before[key] for key in layout} and event.after == {key: after[key] for key in layout}
    assert event.payload["job"] == job.pk and event.payload["boot_id_after"] == after["boot_id"]
    assert event.payload["boot_id_before"] == job.engine_boot_id != after["boot_id"]

    # The layout watch takes the new layout neither for the job's doing nor for a change nobody explains.
    assert layout_watch.watch() == f"unchanged: layout {after['fingerprint']}"
    assert not AuditEvent.objects.filter(action=UNEXPLAINED_CHANGE).exists()
    assert AuditEvent.objects.filter(action=RESTARTED_MID_APPLY).count() == 1

    client.force_login(viewer)
    warning = _warning(client)
    assert warning is not None and f"#{job.pk}" in warning and "not the job's doing" in warning, warning
    assert f"layout {after['fingerprint']}" in warning and f"layout {before['fingerprint']}" in warning
    assert f'href="/audit/?action={RESTARTED_MID_APPLY}"' in warning

    wait_until(lambda: _alerts(receiver), timeout=60, what="the webhook")
    [alert] = _alerts(receiver)
    assert alert["event"] == RESTARTED_MID_APPLY and alert["job"]["id"] == job.pk
    assert alert["job"]["status"] == status and alert["engine"]["after"]["fingerprint"] == after["fingerprint"]
    assert alert["engine"]["before"]["fingerprint"] == before["fingerprint"]


def test_a_job_whose_engine_restarts_mid_apply_on_another_layout_fails_with_one_alert(
        own_engine, moved_off_start, operator, reviewer, viewer, client, receiver, workers, settings):
    """Pins the worker's guard (console.jobs.worker._operation_lost / _restarted_under): without it the job failed
    with "no record of operation" and the layout watch then credited the start-up layout to the job, silently."""
    start, moved = moved_off_start
    workers.start()  # delivers the webhooks
    settings.SEAM_JOB_LOST_CONTACT_S = 600  # the worker keeps following through the restart, however slow
    job = _cut_change(own_engine, operator, reviewer)

    def follow() -> None:
        try:
            worker.execute(job.pk)
        finally:
            connections.close_all()

    with rank_held(rank_pids(own_engine.live)[2]):
        following = threading.Thread(target=follow, daemon=True)
        following.start()
        operation_id = wait_until(lambda: Job.objects.get(pk=job.pk).engine_operation_id, what="the apply")
        _kill_mid_apply(own_engine, operation_id)
    following.join(timeout=180)
    assert not following.is_alive()

    after = own_engine.live.state()
    assert after["fingerprint"] == start["fingerprint"] and after["boot_id"] != start["boot_id"]
    done = wait_for_end(job.pk)
    assert done.status == "failed", (done.status, done.error)
    assert f"the engine restarted mid-apply on layout {after['fingerprint']}" in done.error
    assert "not this job's doing" in done.error and f"no record of operation {operation_id}" in done.error
    assert not done.layout_observations.filter(cause="job").exists()  # not credited
    _assert_one_alert(done, moved, after, receiver, viewer, client)


def test_a_dead_workers_job_whose_engine_restarted_is_settled_by_the_reconciler_with_one_alert(
        own_engine, moved_off_start, operator, reviewer, viewer, client, receiver, workers):
    """Pins the reconciler's guard for a job without an operation id (console.jobs.worker._settle_without_operation_id
    asking layout_watch.restarted_since): without it the job failed as "never given the plan" and the layout watch
    credited the start-up layout to it."""
    start, moved = moved_off_start
    workers.start()
    job = _cut_change(own_engine, operator, reviewer)
    lifecycle.start(job.pk, worker="dead")
    lifecycle.note_engine_boot(job, own_engine.live.state()["boot_id"])  # as its worker did before applying
    with rank_held(rank_pids(own_engine.live)[2]):
        operation_id = apply_as_the_worker(job)  # ...and died before recording the operation id
        _kill_mid_apply(own_engine, operation_id)

    after = own_engine.live.state()
    assert after["fingerprint"] == start["fingerprint"]
    assert worker.reconcile(older_than_s=0) == [(job.pk, "failed")]
    done = Job.objects.get(pk=job.pk)
    assert f"the engine restarted mid-apply on layout {after['fingerprint']}" in done.error, done.error
    assert worker.reconcile(older_than_s=0) == []  # settled once
    _assert_one_alert(done, moved, after, receiver, viewer, client)


def test_the_layout_watch_does_not_credit_a_job_with_the_layout_of_an_engine_restarted_since(
        own_engine, moved_off_start, operator, reviewer, viewer, client, receiver, workers, monkeypatch):
    """Pins the layout watch's guard (layout_watch.restarted_since in watch()): without it the watch took the
    start-up layout of the restarted engine for the doing of the job whose end was not noted."""
    start, moved = moved_off_start
    workers.start()
    job = _cut_change(own_engine, operator, reviewer)
    with monkeypatch.context() as lost:  # the worker lost the engine right after the operation ended
        lost.setattr(layout_watch, "note_job_end", lambda job, state, engine_url: None)
        assert worker.execute(job.pk) == "succeeded"
    own_engine.kill()
    own_engine.restart()

    after = own_engine.live.state()
    assert after["fingerprint"] == start["fingerprint"]
    assert layout_watch.watch() == f"restarted: job {job.pk}'s engine came back on layout {after['fingerprint']}"
    done = Job.objects.get(pk=job.pk)
    assert done.status == "succeeded" and not done.layout_observations.filter(cause="job").exists()
    _assert_one_alert(done, moved, after, receiver, viewer, client, status="succeeded")

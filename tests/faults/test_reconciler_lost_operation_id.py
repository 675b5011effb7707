"""A worker that dies between the engine accepting the plan and the job recording the operation id: the reconciler
finds the operation on the engine by the job's plan hash and settles the job from it (issue 13, item 7)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.audit.models import AuditEvent
from console.jobs import lifecycle, worker
from console.jobs.models import Job
from tests.support.faults import operation_phase, operations_total, rank_held, rank_pids, wait_until
from tests.support.jobs import actions, apply_as_the_worker, other_cut
from tests.support.live_service import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def orphaned(live_engine, operator, reviewer, handoffs):
    """orphaned() -> (job, operation id): the job's plan applied by its worker, which then died before recording the
    operation id; the job is running with no id and a heartbeat ten minutes old."""
    def make() -> tuple[Job, str]:
        job = lifecycle.approve(reviewer, lifecycle.propose(operator, {"kind": "cut",
                                                                       "target": {"cut": other_cut(live_engine)}}))
        lifecycle.start(job.pk, worker="dead")
        operation_id = apply_as_the_worker(job)
        Job.objects.filter(pk=job.pk).update(updated=timezone.now() - timedelta(minutes=10))
        return Job.objects.get(pk=job.pk), operation_id
    return make


def test_an_operation_the_engine_finished_settles_the_job_with_its_status(live_engine, orphaned):
    job, operation_id = orphaned()
    operation = live_engine.wait_operation(operation_id)
    applies = operations_total(live_engine)
    assert worker.reconcile(older_than_s=60) == [(job.pk, operation["status"])]
    job.refresh_from_db()
    assert (job.status, job.engine_operation_id) == ("succeeded", operation_id), job.error
    assert job.operation["id"] == operation_id and job.measured == operation["measured"]
    assert live_engine.state()["cut"] == job.target["cut"]
    assert operations_total(live_engine) == applies  # found, not applied again
    assert actions(job)[-2:] == ["job.applied", "job.succeeded"]
    applied = AuditEvent.objects.get(subject=f"job:{job.pk}", action="job.applied")
    assert applied.payload["operation_id"] == operation_id and applied.payload["reconciled"] is True
    settled = AuditEvent.objects.get(subject=f"job:{job.pk}", action="job.succeeded")
    assert settled.payload["reconciled"] is True and settled.payload["operation_id"] == operation_id


def test_an_operation_still_running_keeps_the_job_running_with_its_id(live_engine, orphaned):
    with rank_held(rank_pids(live_engine)[2]):  # the operation cannot finish while rank 2 is held
        job, operation_id = orphaned()
        wait_until(lambda: operation_phase(live_engine, operation_id) == "acting", what="the operation to act")
        [(job_id, outcome)] = worker.reconcile(older_than_s=60)
        assert (job_id, outcome) == (job.pk, "still running on the engine")
        job.refresh_from_db()
        assert (job.status, job.engine_operation_id) == ("running", operation_id)
    assert live_engine.wait_operation(operation_id)["status"] == "succeeded"
    assert worker.reconcile(older_than_s=0) == [(job.pk, "succeeded")]
    assert Job.objects.get(pk=job.pk).status == "succeeded"


def test_nothing_is_decided_while_the_engine_cannot_be_asked(live_engine, orphaned, settings):
    job, operation_id = orphaned()
    live_engine.wait_operation(operation_id)
    live_url = settings.ENGINE_URL
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"
    [(job_id, outcome)] = worker.reconcile(older_than_s=60)
    assert job_id == job.pk and outcome.startswith("left running: engine unreachable")
    assert Job.objects.get(pk=job.pk).engine_operation_id == ""
    settings.ENGINE_URL = live_url
    assert worker.reconcile(older_than_s=60) == [(job.pk, "succeeded")]


def test_another_jobs_operation_for_the_same_plan_is_not_taken_for_this_one(live_engine, orphaned):
    job, _ = orphaned()
    # A second running job with the very same plan, whose worker died before applying it: the engine holds an
    # operation for the plan hash, but started by the first job's attestation, not this one's.
    twin = Job.objects.create(kind=job.kind, target=job.target, plan=job.plan, plan_hash=job.plan_hash,
                              prediction=job.prediction, proposer=job.proposer, proposer_name=job.proposer_name,
                              status="running", updated=timezone.now() - timedelta(minutes=10))
    outcomes = dict(worker.reconcile(older_than_s=60))
    assert outcomes[twin.pk] == "failed" and outcomes[job.pk] in ("succeeded", "still running on the engine")
    twin.refresh_from_db()
    assert twin.engine_operation_id == "" and f"no operation of job {twin.pk}" in twin.error

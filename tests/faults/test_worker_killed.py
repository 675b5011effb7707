"""SIGKILL the Celery worker while the engine runs its cut change; a new worker's reconciler settles the job
from the engine's own operation record."""

from __future__ import annotations

import time

import pytest

from console.audit.models import AuditEvent
from console.jobs import lifecycle
from console.jobs.models import Job
from console.jobs.tasks import reconcile_jobs
from tests.support.faults import operation_phase, operations_total, rank_held, rank_pids, sigkill, wait_until
from tests.support.jobs import actions, other_cut, wait_for_end

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_worker_killed_mid_operation_is_settled_from_the_engines_record(live_engine, workers, operator, reviewer):
    first = workers.start()
    cut, applies = other_cut(live_engine), operations_total(live_engine)
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": cut}})
    with rank_held(rank_pids(live_engine)[2]):  # the engine's operation cannot finish while rank 2 is held
        lifecycle.approve(reviewer, job)  # queued, handed to the first worker on commit
        operation_id = wait_until(lambda: Job.objects.get(pk=job.pk).engine_operation_id, what="the apply")
        wait_until(lambda: operation_phase(live_engine, operation_id) == "acting", what="the operation to act")
        assert Job.objects.get(pk=job.pk).status == "running"
        sigkill(first.process.pid)  # the worker dies with the job running and the engine mid-operation
        assert first.process.wait(timeout=10) == -9
    operation = live_engine.wait_operation(operation_id)  # rank 2 let go: the engine finishes on its own
    assert operation["status"] == "succeeded", operation
    assert Job.objects.get(pk=job.pk).status == "running"  # nobody left to say so

    workers.start()  # a new worker; the reconciler runs on it, sent explicitly (beat would send the same task)
    time.sleep(0.2)
    reconcile_jobs.apply_async(kwargs={"older_than_s": 0.1})
    done = wait_for_end(job.pk, timeout=60)

    assert done.status == operation["status"] == "succeeded", done.error
    assert done.operation["id"] == operation_id and done.measured == operation["measured"]
    assert done.measured["pool_tokens"] == done.prediction["pool_tokens"]
    state = live_engine.state()  # the engine serves the layout it verified, the one the job records
    assert state["phase"] == "serving" and state["cut"] == cut
    assert state["pool_tokens"] == done.measured["pool_tokens"]
    assert operations_total(live_engine) == applies + 1  # one apply: nothing was sent twice
    assert actions(job).count("job.applied") == 1 and actions(job)[-1] == "job.succeeded"
    settled = AuditEvent.objects.get(subject=f"job:{job.pk}", action="job.succeeded")
    assert settled.payload["reconciled"] is True and settled.payload["operation_id"] == operation_id

"""The whole path through real parts: the services queue a job, a real Celery worker process takes it off the
real Redis broker, applies it to the real engine over HTTP, and the job's page hears every change live."""

import time

import pytest

from console.audit.models import AuditEvent
from console.jobs import lifecycle
from console.jobs.errors import NotAllowed
from console.jobs.tasks import run_job
from tests.support.jobs import JobListener, actions, move_engine, other_cut, wait_for_end

pytestmark = pytest.mark.django_db(transaction=True)


def test_propose_approve_run_succeeds_with_the_predicted_pool(celery_worker, live_engine, make_user, reviewer):
    before = live_engine.state()
    cut = other_cut(live_engine)
    proposer = make_user("operator", "reviewer")
    job = lifecycle.propose(proposer, {"kind": "cut", "target": {"cut": cut}})
    with pytest.raises(NotAllowed):
        lifecycle.approve(proposer, job)  # rule 1, even for a proposer who is also a reviewer
    with JobListener(job.pk) as listener:
        queued = lifecycle.approve(reviewer, job, plan_hash=job.plan_hash, request_id="req-approve-1")
        assert queued.status == "queued"
        done = wait_for_end(job.pk)
    assert done.status == "succeeded", done.error
    assert done.measured["pool_tokens"] == done.prediction["pool_tokens"] == done.operation["predicted"]["pool_tokens"]
    after = live_engine.state()
    assert after["cut"] == cut and after["fingerprint"] != before["fingerprint"]
    assert done.engine_operation_id == done.operation["id"]
    assert done.worker.startswith(celery_worker.queue) and done.task_id and done.request_id == "req-approve-1"
    assert actions(job) == ["job.proposed", "job.approve_refused", "job.approval", "job.approved", "job.queued",
                            "job.running", "job.applied", "job.succeeded"]
    # The worker's audit events carry the id of the request that queued the job.
    worker_events = AuditEvent.objects.filter(subject=f"job:{job.pk}", actor=None)
    assert {event.request_id for event in worker_events} == {"req-approve-1"}
    # The live page heard every step, in order, ending with the measured pool.
    assert listener.statuses[0] == "queued" and listener.statuses[-1] == "succeeded"
    assert "running" in listener.statuses
    assert listener.messages[-1]["job"]["measured_pool_tokens"] == done.measured["pool_tokens"]


def test_a_plan_made_stale_ends_stale_without_touching_the_engine(celery_worker, live_engine, propose_cut, reviewer):
    job = propose_cut()
    moved = move_engine(live_engine)  # someone changed the layout after the proposal was made
    lifecycle.approve(reviewer, job)
    done = wait_for_end(job.pk)
    assert done.status == "stale", done.error
    assert done.engine_operation_id == "" and "propose again" in done.error
    assert live_engine.state()["fingerprint"] == moved


def test_a_second_delivery_of_the_same_job_does_nothing(celery_worker, live_engine, propose_cut, reviewer):
    job = propose_cut()
    lifecycle.approve(reviewer, job)  # the first delivery, on commit
    run_job.delay(job.pk)  # a second one, as a broker redelivering it would
    done = wait_for_end(job.pk)
    assert done.status == "succeeded", done.error
    deadline = time.monotonic() + 30
    while not any(f"job {job.pk} not started" in line for line in celery_worker.output):
        assert time.monotonic() < deadline, "the second delivery was never taken"
        time.sleep(0.05)
    assert actions(job).count("job.running") == 1 and actions(job).count("job.applied") == 1

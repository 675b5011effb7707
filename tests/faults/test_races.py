"""Two reviewers approving the same job at the same instant, and two workers picking the same job: exactly one
wins. Real threads released by a barrier, a real database (SQLite file or PostgreSQL), real worker processes."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from console.accounts.tokens import issue_token
from console.jobs import lifecycle, worker
from console.jobs.models import Approval, Job
from console.jobs.tasks import run_job
from tests.support.faults import operations_total, wait_until
from tests.support.jobs import actions, at_once, other_cut, wait_for_end

pytestmark = pytest.mark.django_db(transaction=True)


def _approve_call(user, job_id: int, plan_hash: str):
    key = issue_token(user).secret

    def call():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return client.post(f"/api/v1/jobs/{job_id}/approve/", {"plan_hash": plan_hash}, format="json")
    return call


def test_two_reviewers_approving_at_the_same_instant_make_one_transition(live_engine, operator, make_user, handoffs):
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)}})
    calls = [_approve_call(make_user("reviewer"), job.pk, job.plan_hash) for _ in range(2)]
    answers = sorted(response.status_code for response in at_once(calls))
    assert answers == [200, 409], answers
    assert Job.objects.get(pk=job.pk).status == "queued"
    assert Approval.objects.filter(job=job).count() == 1  # the loser's approval was not kept either
    # One approval, one transition; the loser's attempt is recorded as refused, after the winner's events.
    assert actions(job) == ["job.proposed", "job.approval", "job.approved", "job.queued", "job.approve_refused"]
    assert handoffs == [job.pk]


def test_two_deliveries_run_at_once_in_one_process_apply_once(live_engine, operator, reviewer, handoffs):
    job = lifecycle.approve(reviewer, lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(
        live_engine)}}))
    applies = operations_total(live_engine)
    ends = at_once([lambda n=n: worker.execute(job.pk, worker=f"w{n}") for n in range(2)])
    assert "succeeded" in ends and all(end in ("running", "succeeded") for end in ends), ends
    assert wait_for_end(job.pk).status == "succeeded"
    assert operations_total(live_engine) == applies + 1
    assert actions(job).count("job.running") == 1 and actions(job).count("job.applied") == 1


@pytest.mark.slow
def test_two_worker_processes_given_the_same_job_apply_it_once(live_engine, workers, operator, reviewer):
    pool = [workers.start(), workers.start()]
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)}})
    applies = operations_total(live_engine)
    lifecycle.approve(reviewer, job)  # the real hand-off, on commit ...
    run_job.delay(job.pk)  # ... and a duplicate beside it, as a broker redelivering it would
    done = wait_for_end(job.pk)
    assert done.status == "succeeded", done.error
    wait_until(lambda: sum(line.count(f"job {job.pk} not started") for w in pool for line in w.output) == 1,
               what="the duplicate to be taken and dropped")
    # Each worker took one delivery (the one running the job holds no second message: prefetch 1, late acks).
    received = [sum("Task console.jobs.tasks.run_job[" in line and "received" in line for line in w.output)
                for w in pool]
    assert received == [1, 1], received
    assert operations_total(live_engine) == applies + 1  # the engine saw one apply
    assert actions(job).count("job.running") == 1 and actions(job).count("job.applied") == 1
    assert done.worker.startswith(workers.queue)

"""Scheduled changes (console.jobs.schedule): a job proposed with not_before waits `approved` until then, beat
queues it, the real worker runs it with approvals that last until not_before + TTL, or ends it stale when the layout
moved while it waited."""

import time
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone
from rest_framework.test import APIClient

from console.audit.models import AuditEvent
from console.celery import app
from console.jobs import lifecycle
from console.jobs.models import Approval, Job
from console.jobs.tasks import queue_scheduled_jobs
from tests.support.jobs import actions, at_once, move_engine, other_cut, wait_for_end

JOBS = "/api/v1/jobs/"


def propose_at(engine, operator, not_before, cut=None) -> Job:
    return lifecycle.propose(operator, {"kind": "cut", "target": {"cut": cut or other_cut(engine)},
                                        "not_before": not_before.isoformat()})


def api_post(user, body):
    client = APIClient()
    client.force_authenticate(user)
    return client.post(JOBS, body, format="json")


# --- proposing a scheduled change ----------------------------------------------------------------

@pytest.mark.django_db
def test_the_api_takes_not_before_and_shows_it(live_engine, operator):
    when = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    response = api_post(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)},
                                   "not_before": when.isoformat().replace("+00:00", "Z")})
    assert response.status_code == 201, response.content
    assert response.json()["not_before"] == when.isoformat().replace("+00:00", "Z")
    job = Job.objects.get(pk=response.json()["id"])
    assert job.not_before == when
    proposed = AuditEvent.objects.get(action="job.proposed", subject=f"job:{job.pk}")
    assert proposed.payload["not_before"] == when.isoformat()


@pytest.mark.django_db
def test_a_time_with_another_offset_is_the_same_instant(live_engine, operator):
    when = (timezone.now() + timedelta(hours=3)).replace(microsecond=0)
    at_plus_two = when.astimezone(timezone.get_fixed_timezone(120)).isoformat()
    assert at_plus_two.endswith("+02:00")
    response = api_post(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)},
                                   "not_before": at_plus_two})
    assert response.status_code == 201, response.content
    assert Job.objects.get().not_before == when


@pytest.mark.django_db
@pytest.mark.parametrize("not_before, says", [
    ("2001-01-01T00:00:00Z", "is in the past"),
    ("tomorrow at noon", "is not an ISO 8601 time"),
    ("2099-01-01T00:00:00", "has no timezone"),
    (1893456000, "expected an ISO 8601 time"),
    ("2099-01-01T00:00:00Z", "more than 365 days ahead"),
])
def test_a_bad_not_before_is_a_400_naming_the_field_and_stores_nothing(live_engine, operator, not_before, says):
    response = api_post(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)},
                                   "not_before": not_before})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == "not_before" and body["detail"].startswith("not_before: ") and says in body["detail"]
    assert not Job.objects.exists()
    refused = AuditEvent.objects.get(action="job.propose_refused")
    assert refused.payload["field"] == "not_before"


# --- approving it: it waits ----------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_last_approval_leaves_a_scheduled_job_approved_and_says_when(live_engine, operator, reviewer, handoffs):
    when = timezone.now() + timedelta(hours=1)
    job = propose_at(live_engine, operator, when)
    approved = lifecycle.approve(reviewer, job, plan_hash=job.plan_hash, request_id="req-approve-scheduled")
    assert approved.status == "approved" and approved.queued_at is None
    assert handoffs == []  # nothing reaches the worker before its time
    assert actions(job) == ["job.proposed", "job.approval", "job.approved"]
    event = AuditEvent.objects.get(action="job.approved", subject=f"job:{job.pk}")
    assert event.payload["scheduled_for"] == when.isoformat()
    assert lifecycle.queue_due() == [] and handoffs == []  # beat before the time: still waiting


@pytest.mark.django_db(transaction=True)
def test_beat_queues_a_due_job_once_and_hands_it_over_after_the_commit(live_engine, operator, reviewer, handoffs):
    when = timezone.now() + timedelta(hours=1)
    job = propose_at(live_engine, operator, when)
    lifecycle.approve(reviewer, job, plan_hash=job.plan_hash, request_id="req-approve-scheduled")
    assert lifecycle.queue_due(now=when + timedelta(seconds=1)) == [job.pk]
    assert handoffs == [job.pk]
    job.refresh_from_db()
    assert job.status == "queued" and job.queued_at is not None and job.request_id == "req-approve-scheduled"
    queued = AuditEvent.objects.get(action="job.queued", subject=f"job:{job.pk}")
    assert queued.actor_name == "system" and queued.payload["scheduled_for"] == when.isoformat()
    assert queued.request_id == "req-approve-scheduled"  # the trail links the beat's move to the approval
    assert lifecycle.queue_due(now=when + timedelta(seconds=2)) == [] and handoffs == [job.pk]


@pytest.mark.django_db(transaction=True)
def test_two_beats_at_once_queue_a_due_job_once(live_engine, operator, reviewer, handoffs):
    when = timezone.now() + timedelta(hours=1)
    job = propose_at(live_engine, operator, when)
    lifecycle.approve(reviewer, job, plan_hash=job.plan_hash)
    results = at_once([lambda: lifecycle.queue_due(now=when), lambda: lifecycle.queue_due(now=when)])
    assert sorted(results, key=len) == [[], [job.pk]], results
    assert handoffs == [job.pk] and actions(job).count("job.queued") == 1


@pytest.mark.django_db(transaction=True)
def test_a_scheduled_job_can_be_cancelled_while_it_waits(live_engine, operator, reviewer, handoffs):
    when = timezone.now() + timedelta(hours=1)
    job = propose_at(live_engine, operator, when)
    lifecycle.approve(reviewer, job, plan_hash=job.plan_hash)
    assert lifecycle.cancel(operator, job).status == "cancelled"
    assert lifecycle.queue_due(now=when + timedelta(seconds=1)) == [] and handoffs == []


@pytest.mark.django_db(transaction=True)
def test_an_approval_after_not_before_has_passed_queues_at_once(live_engine, operator, reviewer, handoffs):
    job = propose_at(live_engine, operator, timezone.now() + timedelta(hours=1))
    Job.objects.filter(pk=job.pk).update(not_before=timezone.now() - timedelta(seconds=5))  # its time came unreviewed
    assert lifecycle.approve(reviewer, job, plan_hash=job.plan_hash).status == "queued"
    assert handoffs == [job.pk]


@pytest.mark.django_db
def test_approvals_of_a_scheduled_job_last_until_not_before_plus_the_ttl(live_engine, operator, reviewer, settings):
    settings.SEAM_APPROVAL_TTL_S = 60
    when = timezone.now() + timedelta(hours=1)
    job = propose_at(live_engine, operator, when)
    lifecycle.approve(reviewer, job, plan_hash=job.plan_hash)
    approval = Approval.objects.get(job=job)
    assert approval.expires_at == when + timedelta(seconds=60)
    job.refresh_from_db()
    assert lifecycle.approvals_counting(job, now=when + timedelta(seconds=59)) == 1  # still counts when it runs
    assert lifecycle.approvals_counting(job, now=when + timedelta(seconds=61)) == 0  # but not forever


# --- beat's task ---------------------------------------------------------------------------------

def test_beat_sends_the_scheduling_task_every_poll_interval():
    entry = django_settings.CELERY_BEAT_SCHEDULE["seam-queue-scheduled-jobs"]
    assert entry == {"task": "console.jobs.tasks.queue_scheduled_jobs", "schedule": 15.0}
    assert django_settings.SEAM_SCHEDULE_POLL_S == 15.0
    assert entry["task"] in app.tasks and queue_scheduled_jobs.name == entry["task"]  # the name beat sends resolves


# --- on the real worker --------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_due_job_runs_on_the_worker_with_approvals_that_outlived_the_plain_ttl(celery_worker, live_engine, operator,
                                                                               reviewer, settings):
    settings.SEAM_APPROVAL_TTL_S = 3
    cut = other_cut(live_engine)
    when = timezone.now() + timedelta(seconds=6)
    job = propose_at(live_engine, operator, when, cut=cut)
    lifecycle.approve(reviewer, job, plan_hash=job.plan_hash)
    approval = Approval.objects.get(job=job)
    # Counted from the approval, it would have lapsed before the job's time: counted from not_before it lasts.
    assert approval.created + timedelta(seconds=3) < when and approval.expires_at == when + timedelta(seconds=3)
    deadline = time.monotonic() + 30
    while not queue_scheduled_jobs():  # what beat sends every SEAM_SCHEDULE_POLL_S
        assert time.monotonic() < deadline, "the job never came due"
        time.sleep(0.2)
    assert timezone.now() >= when
    done = wait_for_end(job.pk)
    assert done.status == "succeeded", done.error
    assert live_engine.state()["cut"] == cut
    applied = AuditEvent.objects.get(action="job.applied", subject=f"job:{job.pk}")
    assert applied.payload["approvers"] == ["rita"]


@pytest.mark.django_db(transaction=True)
def test_a_due_job_whose_layout_moved_while_it_waited_ends_stale(celery_worker, live_engine, operator, reviewer):
    when = timezone.now() + timedelta(hours=1)
    job = propose_at(live_engine, operator, when)
    lifecycle.approve(reviewer, job, plan_hash=job.plan_hash)
    moved = move_engine(live_engine)  # the engine changed layout while the job waited for its time
    assert lifecycle.queue_due(now=when + timedelta(seconds=1)) == [job.pk]
    done = wait_for_end(job.pk)
    assert done.status == "stale", done.error
    assert done.engine_operation_id == "" and "propose again" in done.error
    assert live_engine.state()["fingerprint"] == moved  # the engine was not touched

"""The review gate (docs/architecture.md §4, rules 1-3), enforced by the service layer every page and endpoint calls."""

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from console.audit.errors import AuditWriteRefused
from console.jobs import lifecycle
from console.jobs.errors import Conflict, NotAllowed
from console.jobs.models import Approval, Job
from tests.support.jobs import actions, at_once, move_engine

pytestmark = pytest.mark.django_db


# --- rule 1: only a reviewer approves, never the proposer ---------------------------------------

def test_self_approval_is_refused(propose_cut, make_user):
    both = make_user("operator", "reviewer")
    job = propose_cut(user=both)
    with pytest.raises(NotAllowed, match="cannot approve it"):
        lifecycle.approve(both, job)
    job.refresh_from_db()
    assert job.status == "proposed" and not job.approvals.exists()
    assert actions(job) == ["job.proposed", "job.approve_refused"]  # the attempt is on the trail (issue 6)


@pytest.mark.parametrize("roles", [("operator",), ("viewer",), ()])
def test_only_a_reviewer_approves(propose_cut, make_user, roles):
    job = propose_cut()
    with pytest.raises(NotAllowed, match="needs the reviewer role"):
        lifecycle.approve(make_user(*roles), job)
    assert not job.approvals.exists()


def test_a_superuser_outside_the_reviewer_group_cannot_approve(propose_cut, make_user):
    admin = make_user()
    admin.is_superuser = True
    admin.save()
    with pytest.raises(NotAllowed):
        lifecycle.approve(admin, propose_cut())


@pytest.mark.django_db(transaction=True)
def test_an_approval_queues_the_job_and_hands_it_over_after_the_commit(propose_cut, reviewer, handoffs):
    job = propose_cut()
    with transaction.atomic():
        queued = lifecycle.approve(reviewer, job, plan_hash=job.plan_hash)
        assert queued.status == "queued" and queued.queued_at is not None
        assert handoffs == []  # a worker must never see the job before it is committed
    assert handoffs == [job.pk]
    assert actions(job) == ["job.proposed", "job.approval", "job.approved", "job.queued"]
    approval = Approval.objects.get(job=job)
    assert (approval.reviewer, approval.reviewer_name, approval.plan_hash) == (reviewer, "rita", job.plan_hash)


def test_a_reviewer_approves_a_plan_once(propose_cut, make_user, settings):
    settings.SEAM_REQUIRED_APPROVALS = 2
    job, reviewer = propose_cut(), make_user("reviewer")
    lifecycle.approve(reviewer, job)
    with pytest.raises(Conflict, match="already approved"):
        lifecycle.approve(reviewer, job)
    assert lifecycle.approvals_counting(job) == 1


# --- rule 2: an approval is bound to the plan_hash it saw ---------------------------------------

def test_an_approval_of_a_plan_the_job_no_longer_carries_is_refused(propose_cut, reviewer):
    job = propose_cut()
    with pytest.raises(Conflict, match="changed since you saw it"):
        lifecycle.approve(reviewer, job, plan_hash="0" * 64)
    assert not job.approvals.exists()


def test_a_changed_plan_dismisses_the_approvals_given_so_far(live_engine, propose_cut, operator, make_user, settings):
    settings.SEAM_REQUIRED_APPROVALS = 2
    first, second = make_user("reviewer"), make_user("reviewer")
    job = propose_cut()
    lifecycle.approve(first, job)
    move_engine(live_engine)  # the layout changed: planning again gives another plan
    revised = lifecycle.revise(operator, job)
    assert revised.plan_hash != job.plan_hash and revised.incumbent_fingerprint == live_engine.state()["fingerprint"]
    assert lifecycle.approvals_counting(revised) == 0
    assert lifecycle.approve(second, revised).status == "proposed"  # first's approval was for the old plan
    assert lifecycle.approve(first, revised).status == "queued"
    assert "job.revised" in actions(job)


def test_a_plan_changed_behind_the_services_back_has_no_approvals(propose_cut, make_user, settings):
    settings.SEAM_REQUIRED_APPROVALS = 2
    first, second = make_user("reviewer"), make_user("reviewer")
    job = propose_cut()
    lifecycle.approve(first, job)
    Job.objects.filter(pk=job.pk).update(plan_hash="f" * 64)
    assert lifecycle.approve(second, job).status == "proposed"


# --- rule 3: approvals expire; the required number is configurable -------------------------------

def test_an_approval_expires_after_the_configured_ttl(propose_cut, reviewer, settings):
    settings.SEAM_APPROVAL_TTL_S = 90
    job = lifecycle.approve(reviewer, propose_cut())
    approval = job.approvals.get()
    assert approval.expires_at - approval.created == timedelta(seconds=90)


def test_an_expired_approval_does_not_count(propose_cut, make_user, settings):
    settings.SEAM_REQUIRED_APPROVALS = 2
    first, second = make_user("reviewer"), make_user("reviewer")
    job = propose_cut()
    lifecycle.approve(first, job)
    hour = timedelta(hours=1)
    Approval.objects.filter(job=job).update(created=timezone.now() - 2 * hour, expires_at=timezone.now() - hour)
    assert lifecycle.approve(second, job).status == "proposed"
    assert lifecycle.approve(first, job).status == "queued"  # a fresh approval counts again


def test_the_required_number_of_approvals_is_configurable(propose_cut, make_user, settings):
    settings.SEAM_REQUIRED_APPROVALS = 3
    job = propose_cut()
    assert [lifecycle.approve(make_user("reviewer"), job).status for _ in range(3)] == \
        ["proposed", "proposed", "queued"]


# --- reject and cancel ---------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_rejected_job_never_touches_the_engine(live_engine, propose_cut, reviewer, handoffs):
    from console.jobs import worker

    before = live_engine.state()["fingerprint"]
    job = propose_cut()
    rejected = lifecycle.reject(reviewer, job, reason="not during the peak")
    assert rejected.status == "rejected" and rejected.error == "rejected by rita: not during the peak"
    with pytest.raises(Conflict, match="is rejected"):
        lifecycle.approve(reviewer, job)
    assert worker.execute(job.pk) == "rejected"  # even a stray delivery finds nothing to run
    job.refresh_from_db()
    assert (job.status, job.engine_operation_id, job.started_at) == ("rejected", "", None)
    assert handoffs == [] and live_engine.state()["fingerprint"] == before


def test_only_a_reviewer_rejects(propose_cut, operator):
    with pytest.raises(NotAllowed, match="reviewer role"):
        lifecycle.reject(operator, propose_cut())


def test_the_proposer_cancels_their_own_job_before_it_runs(propose_cut, operator, make_user, reviewer, handoffs):
    from console.jobs import worker

    job = propose_cut()
    with pytest.raises(NotAllowed, match="only the proposer"):
        lifecycle.cancel(make_user("operator"), job)
    with pytest.raises(NotAllowed, match="operator role"):
        lifecycle.cancel(reviewer, job)
    assert lifecycle.approve(reviewer, job).status == "queued"
    assert lifecycle.cancel(operator, job).status == "cancelled"
    assert worker.execute(job.pk) == "cancelled"  # the queued message finds nothing to run

    running = propose_cut()
    lifecycle.approve(reviewer, running)
    lifecycle.start(running)
    with pytest.raises(Conflict, match="has not started"):
        lifecycle.cancel(operator, running)


# --- fail closed, and races ----------------------------------------------------------------------

def test_a_failed_audit_write_rolls_the_approval_back(propose_cut, reviewer, monkeypatch):
    job = propose_cut()
    real = lifecycle.record  # every transition's audit write

    def record(**event):
        if event["action"] == "job.queued":
            raise AuditWriteRefused("the audit trail is down")
        return real(**event)

    monkeypatch.setattr(lifecycle, "record", record)
    with pytest.raises(AuditWriteRefused):
        lifecycle.approve(reviewer, job)
    job.refresh_from_db()
    assert job.status == "proposed" and not job.approvals.exists() and actions(job) == ["job.proposed"]


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_approving_at_once_queue_the_job_once(propose_cut, make_user, handoffs):
    job, first, second = propose_cut(), make_user("reviewer"), make_user("reviewer")
    results = at_once([lambda: lifecycle.approve(first, job.pk), lambda: lifecycle.approve(second, job.pk)])
    won = [r for r in results if isinstance(r, Job)]
    lost = [r for r in results if not isinstance(r, Job)]
    assert len(won) == 1 and won[0].status == "queued", results
    assert len(lost) == 1 and isinstance(lost[0], Conflict) and "is queued" in str(lost[0])
    assert handoffs == [job.pk] and Approval.objects.filter(job=job).count() == 1
    assert actions(job).count("job.queued") == 1


@pytest.mark.django_db(transaction=True)
def test_two_approvals_at_once_both_count(propose_cut, make_user, handoffs, settings, monkeypatch):
    """With two required, two reviewers approving together must queue the job: each count sees the other."""
    settings.SEAM_REQUIRED_APPROVALS = 2
    counting = lifecycle.approvals_counting

    def slow_count(job, now=None):  # widen the window between writing an approval and counting them
        time.sleep(0.2)
        return counting(job, now)

    monkeypatch.setattr(lifecycle, "approvals_counting", slow_count)
    job, first, second = propose_cut(), make_user("reviewer"), make_user("reviewer")
    results = at_once([lambda: lifecycle.approve(first, job.pk), lambda: lifecycle.approve(second, job.pk)])
    assert sorted(r.status for r in results) == ["proposed", "queued"], results
    assert handoffs == [job.pk]

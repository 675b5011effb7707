"""An approval counts only while its reviewer is active and still holds the reviewer role: a scheduled job approved
by a reviewer who is then deactivated, or taken out of the role, is refused when it comes to run, audited as
`job.approval_unverified`, with nothing applied; the job page counts it the same way (issue 30, item 5)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from console.audit.models import AuditEvent
from console.jobs import lifecycle, worker
from console.jobs.attestation import APPROVAL_UNVERIFIED
from console.jobs.models import Approval
from tests.support.jobs import other_cut

pytestmark = pytest.mark.django_db(transaction=True)


def deactivate(user) -> str:
    user.is_active = False
    user.save(update_fields=["is_active"])
    return f"{user.get_username()} has been deactivated"


def take_out_of_the_role(user) -> str:
    user.groups.remove(Group.objects.get(name="reviewer"))
    return f"{user.get_username()} no longer holds the reviewer role"


def make_superuser_instead(user) -> str:
    """An admin account is no reviewer unless it is in the group (console.jobs.roles)."""
    take_out_of_the_role(user)
    user.is_superuser = user.is_staff = True
    user.save(update_fields=["is_superuser", "is_staff"])
    return f"{user.get_username()} no longer holds the reviewer role"


@pytest.mark.parametrize("lose_the_right", [deactivate, take_out_of_the_role, make_superuser_instead],
                         ids=lambda change: change.__name__)
def test_a_scheduled_job_whose_reviewer_lost_the_right_is_refused_when_it_runs(live_engine, operator, reviewer,
                                                                               handoffs, client, get, lose_the_right):
    """Pins Approval.objects.counting_for's role rule (roles.held_through: active and in the reviewer group, no
    superuser shortcut), as the worker's approvers_of and the job page both apply it: without it the job runs on the
    approval of someone who may no longer give one."""
    before = live_engine.state()["fingerprint"]
    when = timezone.now() + timedelta(hours=1)
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)},
                                       "not_before": when.isoformat()})
    job = lifecycle.approve(reviewer, job, plan_hash=job.plan_hash)
    assert job.status == "approved" and lifecycle.approvals_counting(job) == 1  # waiting for its time
    approval = Approval.objects.get(job=job)

    reason = lose_the_right(reviewer)
    assert lifecycle.approvals_counting(job) == 0  # the job page and the API count as the worker will
    client.force_login(operator)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "(0 of 1 needed approvals count for this plan)" in page

    assert lifecycle.queue_due(now=when + timedelta(seconds=1)) == [job.pk] and handoffs == [job.pk]
    assert worker.execute(job.pk) == "failed"  # what the Celery task runs for the job handed off

    job.refresh_from_db()
    assert f"approval {approval.pk} by rita: {reason}" in job.error and "nothing was applied" in job.error
    assert job.engine_operation_id == "" and live_engine.state()["fingerprint"] == before
    [event] = AuditEvent.objects.filter(action=APPROVAL_UNVERIFIED, subject=f"job:{job.pk}")
    assert event.payload["approvals"] == [{"approval": approval.pk, "reviewer": "rita", "reasons": [reason]}]
    assert (event.payload["counting"], event.payload["required"], event.payload["refused"]) == (0, 1, True)
    assert not AuditEvent.objects.filter(action="job.applied", subject=f"job:{job.pk}").exists()
    # The reason is shown where every refusal of a job is: the job page and the API.
    assert get(f"/api/v1/jobs/{job.pk}/", user=operator)["error"] == job.error
    assert f"approval {approval.pk} by rita: {reason}" in client.get(f"/jobs/{job.pk}/").content.decode()


def test_a_reviewer_still_in_the_role_at_run_time_still_counts(live_engine, operator, reviewer, handoffs):
    """The control: the same scheduled job, its reviewer unchanged, runs when it comes due."""
    when = timezone.now() + timedelta(hours=1)
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)},
                                       "not_before": when.isoformat()})
    lifecycle.approve(reviewer, job, plan_hash=job.plan_hash)
    assert lifecycle.queue_due(now=when + timedelta(seconds=1)) == [job.pk]
    assert worker.execute(job.pk) == "succeeded"
    assert not AuditEvent.objects.filter(action=APPROVAL_UNVERIFIED).exists()

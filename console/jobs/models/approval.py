"""A reviewer's approval of one job, bound to the plan_hash the reviewer saw, valid until it expires and only while
its reviewer still holds the reviewer role."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

from console.jobs.roles import REVIEWER, held_through

if TYPE_CHECKING:
    from console.jobs.models.job import Job

__all__ = ["Approval"]


class ApprovalQuerySet(models.QuerySet):
    def counting(self, plan_hash: str, now: datetime | None = None) -> ApprovalQuerySet:
        """Approvals that still count: given for exactly this plan (rule 2) and not expired (rule 3)."""
        return self.filter(plan_hash=plan_hash, expires_at__gt=now or timezone.now())

    def given_for(self, job: Job, now: datetime | None = None) -> ApprovalQuerySet:
        """The job's approvals of its current plan, unexpired, by a reviewer other than its proposer (rules 1-3),
        whatever that reviewer may do now."""
        return (self.counting(job.plan_hash, now).filter(job=job).exclude(reviewer=None)
                .exclude(reviewer_id=job.proposer_id))

    def counting_for(self, job: Job, now: datetime | None = None) -> ApprovalQuerySet:
        """The approvals that count for the job now: given_for, by a reviewer still active and in the reviewer role
        (issue 30, item 5: an approval lasts only as long as its author's right to give it). The pages, the API and
        the worker all count with this."""
        return self.given_for(job, now).filter(held_through("reviewer", REVIEWER))


class Approval(models.Model):
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="approvals")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                 related_name="job_approvals")
    reviewer_name = models.CharField(max_length=150, help_text="The reviewer's username, frozen.")
    plan_hash = models.CharField(max_length=64, help_text="The plan the reviewer saw; another plan dismisses it.")
    created = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["created", "id"]
        constraints = [models.CheckConstraint(condition=models.Q(expires_at__gt=models.F("created")),
                                              name="jobs_approval_expires_after_created")]

    def __str__(self) -> str:
        return f"approval of job {self.job_id} by {self.reviewer_name}"

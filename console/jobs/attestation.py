"""The console's side of the approval attestation (solvers/attestation.py): what the worker sends beside a reviewed
plan so that the engine applies it.

The engine applies a plan only with an attestation signed with the approval key, which only the console's processes
hold: a caller who reaches the engine, even with its control token, cannot change the layout without a job that
passed the review gate. The worker signs one right before it applies the job's plan, naming the reviewers whose
approvals count for that plan at that moment (docs/architecture.md §4, rules 1-3).
"""

from __future__ import annotations

import time

from django.conf import settings

from console.audit.services import audit_head
from console.jobs.models import Approval, Job
from solvers.attestation import APPROVAL_KEY_ENV, sign_attestation

__all__ = ["CannotAttest", "approvers_of", "attest"]


class CannotAttest(Exception):
    """The console cannot vouch for this job's review; the message says why and that nothing was applied."""


def approvers_of(job: Job) -> list[str]:
    """The reviewers (their usernames, frozen) whose approvals count for the job's current plan now: given for this
    plan_hash, not expired, and not the proposer's (as services.approvals_counting counts them)."""
    counting = (Approval.objects.counting(job.plan_hash).filter(job=job).exclude(reviewer=None)
                .exclude(reviewer_id=job.proposer_id))
    return sorted(set(counting.values_list("reviewer_name", flat=True)))


def attest(job: Job) -> dict:
    """The signed `{job_id, approvers, issued_at, audit_head, signature}` for the job's plan, carrying the audit
    trail's head so that the engine witnesses it (engine/audit_witness.py); CannotAttest saying why not."""
    key = settings.SEAM_APPROVAL_KEY
    if not key:
        raise CannotAttest(f"this console holds no approval key ({APPROVAL_KEY_ENV} is not set), so it cannot attest "
                           f"the review of job {job.pk} and the engine would refuse the plan; nothing was applied")
    approvers = approvers_of(job)
    if not approvers:
        raise CannotAttest(f"no approval of plan {job.plan_hash[:16]} counts any more (expired since the job was "
                           "queued); nothing was applied: propose again")
    return sign_attestation(key, job.plan_hash, job.pk, approvers, time.time(), audit_head())

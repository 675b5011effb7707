"""The console's side of the approval attestation (contracts/attestation.py): what the worker sends beside a reviewed
plan so that the engine applies it.

The engine applies a plan only with an attestation signed with the approval key, which only the console's processes
hold: a caller who reaches the engine, even with its control token, cannot change the layout without a job that
passed the review gate. The worker signs one right before it applies the job's plan, naming the reviewers whose
approvals count for that plan at that moment (docs/architecture.md §4, rules 1-3).
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.audit.services import audit_head, record
from console.jobs.lifecycle import required_approvals, subject_of
from console.jobs.models import Approval, Job
from console.jobs.roles import REVIEWER
from console.jobs.vouching import unvouched
from contracts.attestation import APPROVAL_KEY_ENV, sign_attestation

__all__ = ["APPROVAL_UNVERIFIED", "CannotAttest", "approvers_of", "attest"]

# The audit event naming approvals that would have counted but were set aside when the job was attested.
APPROVAL_UNVERIFIED = "job.approval_unverified"


class CannotAttest(Exception):
    """The console cannot vouch for this job's review; the message says why and that nothing was applied."""


def approvers_of(job: Job) -> list[str]:
    """The reviewers (their usernames, frozen) whose approvals count for the job's current plan now, as the pages
    count them (Approval.objects.counting_for: this plan, unexpired, not the proposer's, by a reviewer still active
    and in the role), each vouched for by its keyed audit event (console.jobs.vouching).

    An approval of this plan that is set aside (its reviewer lost the right, or no keyed event vouches for it) is
    audited as `job.approval_unverified`; CannotAttest, saying why, when fewer than SEAM_REQUIRED_APPROVALS
    reviewers are left.
    """
    now = timezone.now()
    entitled = set(Approval.objects.counting_for(job, now).values_list("pk", flat=True))
    approvers, set_aside = set(), []
    for approval in Approval.objects.given_for(job, now).select_related("job", "reviewer"):
        reasons = [reason for reason in (None if approval.pk in entitled else _lost_right(approval),
                                         unvouched(approval)) if reason]
        if reasons:
            set_aside.append({"approval": approval.pk, "reviewer": approval.reviewer_name, "reasons": reasons})
        else:
            approvers.add(approval.reviewer_name)
    required = required_approvals()
    if set_aside:
        with transaction.atomic():
            record(actor=None, action=APPROVAL_UNVERIFIED, subject=subject_of(job),
                   payload={"plan_hash": job.plan_hash, "approvals": set_aside, "counting": len(approvers),
                            "required": required, "refused": len(approvers) < required})
    if len(approvers) < required:
        raise CannotAttest(_short(job, len(approvers), required, set_aside))
    return sorted(approvers)


def _lost_right(approval: Approval) -> str:
    name = approval.reviewer_name
    if not approval.reviewer.is_active:
        return f"{name} has been deactivated"
    return f"{name} no longer holds the {REVIEWER} role"


def _short(job: Job, counting: int, required: int, set_aside: list[dict]) -> str:
    plan = job.plan_hash[:16]
    if not set_aside and not counting:
        return (f"no approval of plan {plan} counts any more (expired since the job was queued); nothing was "
                "applied: propose again")
    if not set_aside:
        return (f"only {counting} of the {required} approvals plan {plan} needs still count (the others expired "
                "since the job was queued); nothing was applied: propose again")
    why = "; ".join(f"approval {item['approval']} by {item['reviewer']}: {', '.join(item['reasons'])}"
                    for item in set_aside)
    return (f"{counting} of the {required} approvals plan {plan} needs count: set aside ({APPROVAL_UNVERIFIED}) "
            f"{why}; nothing was applied")


def attest(job: Job) -> dict:
    """The signed `{job_id, approvers, issued_at, audit_head, signature}` for the job's plan, carrying the audit
    trail's head so that the engine witnesses it (engine/control/audit_witness.py); CannotAttest saying why not."""
    key = settings.SEAM_APPROVAL_KEY
    if not key:
        raise CannotAttest(f"this console holds no approval key ({APPROVAL_KEY_ENV} is not set), so it cannot attest "
                           f"the review of job {job.pk} and the engine would refuse the plan; nothing was applied")
    approvers = approvers_of(job)
    return sign_attestation(key, job.plan_hash, job.pk, approvers, time.time(), audit_head())

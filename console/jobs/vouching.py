"""Whether an approval row is one the console made: each is vouched for by its keyed audit event (issue 30, item 4).

console.jobs.lifecycle.approve writes the Approval row and, in the same transaction, a `job.approval` audit event
whose hash is HMAC(SEAM_AUDIT_KEY, prev_hash + content) (console.audit.chain). The event binds the approval: its
subject is the job, its actor the reviewer (link and frozen name), its payload the approval's id, plan_hash and expiry
(`lifecycle.approval_binding`). Someone who writes the database without the audit key can insert an Approval row, or
edit one, but cannot make an event that binds it and whose hash recomputes under the key. So before the worker attests
a job it holds every approval that would count against its event (`unvouched`), and sets aside any that has none.

Why the audit event rather than a MAC stored on the row: the approval key is held only by the worker and the engine,
so the web process, which makes approvals, could sign only with the audit key anyway, and it already does so for
this very event, in the approval's own transaction. Reading it back needs no new column, no migration and no second
keyed scheme beside the chain, and approvals given before this check existed (whose events carry the same fields) are
vouched for as well. The cost is one lookup per approval when a job is attested.
"""

from __future__ import annotations

import hmac
from datetime import datetime

from console.audit.chain import compute_hash, event_content
from console.audit.models import AuditEvent, ChainScheme
from console.jobs.lifecycle import APPROVAL_EVENT, subject_of
from console.jobs.models import Approval
from contracts.errors import ContractError

__all__ = ["unvouched"]


def unvouched(approval: Approval) -> str | None:
    """None when a keyed `job.approval` event records exactly this approval; else why not, for the job's error."""
    events = AuditEvent.objects.filter(action=APPROVAL_EVENT, subject=subject_of(approval.job),
                                       payload__approval=approval.pk).order_by("seq")
    reasons = [_mismatch(event, approval) or _unkeyed(event) for event in events]
    if not reasons:
        return f"no {APPROVAL_EVENT} audit event records approval {approval.pk}: it was not made by the console"
    return None if None in reasons else reasons[0]


def _mismatch(event: AuditEvent, approval: Approval) -> str | None:
    """Why the event records another approval than this row says (an edited row: another reviewer, plan or expiry)."""
    payload = event.payload
    if (event.actor_id, event.actor_name) != (approval.reviewer_id, approval.reviewer_name):
        return f"audit event #{event.seq} records approval {approval.pk} by {event.actor_name}, not the row's reviewer"
    if payload.get("plan_hash") != approval.plan_hash:
        return f"audit event #{event.seq} records approval {approval.pk} of another plan than the row's"
    if _instant(payload.get("expires_at")) != approval.expires_at:
        return f"audit event #{event.seq} records approval {approval.pk} expiring at another time than the row's"
    return None


def _unkeyed(event: AuditEvent) -> str | None:
    """Why the event's hash does not prove it was recorded by a holder of SEAM_AUDIT_KEY."""
    if event.scheme != ChainScheme.HMAC_SHA256:
        return f"audit event #{event.seq} is not keyed (scheme {event.scheme}): anyone could have made it"
    try:
        recomputed = compute_hash(event.prev_hash, event_content(event))
    except ContractError as error:
        return f"audit event #{event.seq} cannot be hashed ({error})"
    if hmac.compare_digest(recomputed, event.hash):
        return None
    return f"audit event #{event.seq}'s hash does not recompute under SEAM_AUDIT_KEY: it was forged or changed"


def _instant(value: object) -> datetime | None:
    """An ISO 8601 time as an aware instant (the event may carry another offset than the database returns)."""
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None

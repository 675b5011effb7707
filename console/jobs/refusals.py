"""Refused attempts leave a trace: a proposal or a review verb the console refuses is an audit event, like every
change it makes (`job.propose_refused`; `job.approve_refused`, `job.reject_refused`, `job.cancel_refused`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import wraps

from django.db import transaction

from console.audit.services import record

__all__ = ["REFUSED_SUBJECT", "body_digest", "records_refusals", "refuse_proposal"]

REFUSED_SUBJECT = "jobs"  # no job exists for a refused proposal: the event is about the job list


def refuse_proposal(user, digest: str, refusal: Exception, *, request_id: str | None = None) -> None:
    """Record a refused proposal (`job.propose_refused`): who tried, the body's digest and why it was refused.

    Bodies are not stored (a hostile one can be anything); the digest identifies a repeated attempt. Like every
    audit write this fails closed: if the event cannot be written, the caller gets that error, not the refusal.
    """
    actor = user if getattr(user, "is_authenticated", False) else None
    payload = {"reason": str(refusal)[:2000], "code": type(refusal).__name__, "body_sha256": digest,
               "field": getattr(refusal, "field", None), "user": user.get_username() if actor else "anonymous"}
    with transaction.atomic():
        record(actor=actor, action="job.propose_refused", subject=REFUSED_SUBJECT, request_id=request_id,
               payload=payload)


def body_digest(body: object) -> str:
    """sha256 of a body as JSON (sorted keys); of its repr when it has no JSON form (NaN, a huge integer)."""
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=repr)
    except (ValueError, TypeError, RecursionError):
        text = repr(body)[:1_000_000]
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def records_refusals(verb: str) -> Callable:
    """Wrap a job verb (`verb(user, job, **kwargs)`) so that a refusal (a JobError: not allowed, another plan,
    not in that state, no such job) is recorded as `job.<verb>_refused` on the job, after the refused
    transaction has rolled back, and then raised as before."""
    from console.jobs.errors import JobError

    def wrap(function: Callable) -> Callable:
        @wraps(function)
        def recorded(user, job, **kwargs):
            try:
                return function(user, job, **kwargs)
            except JobError as refusal:
                key = getattr(job, "pk", job)
                subject = f"job:{key}" if isinstance(key, int) or str(key).isdigit() else REFUSED_SUBJECT
                actor = user if getattr(user, "is_authenticated", False) else None
                payload = {"reason": str(refusal)[:2000], "code": type(refusal).__name__,
                           "user": user.get_username() if actor else "anonymous"}
                if kwargs.get("plan_hash") is not None:
                    payload["plan_hash"] = str(kwargs["plan_hash"])[:64]
                with transaction.atomic():
                    record(actor=actor, action=f"job.{verb}_refused", subject=subject[:64],
                           request_id=kwargs.get("request_id"), payload=payload)
                raise
        return recorded
    return wrap

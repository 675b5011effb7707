"""Refused attempts leave a trace: a proposal or a review verb the console refuses is an audit event, like every
change it makes (`job.propose_refused`; `job.approve_refused`, `job.reject_refused`, `job.cancel_refused`), and so
is a state-changing request turned away at the door because its user holds none of the console roles
(`access.refused`: the API's HasRole, the pages' console_page), before any service sees it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import wraps

from django.db import transaction

from console.audit.services import record

__all__ = ["REFUSED_SUBJECT", "body_digest", "records_refusals", "refuse_access", "refuse_proposal", "refuse_verb"]

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


def refuse_access(user, *, method: str, path: str, why: str, job_id: object = None,
                  request_id: str | None = None) -> None:
    """Record a state-changing request refused for want of a role (`access.refused`), on the job it named
    (`job:<id>`) or else on its path: who tried, the method and path, and why.

    Call it before answering the refusal: the event commits in its own transaction, whatever the refused request
    then does, and like every audit write it fails closed (if it cannot be written the caller gets that error).
    `user` is an authenticated user: callers send an anonymous request to log in, which is no one's attempt.
    """
    key = str(job_id)
    subject = f"job:{key}" if key.isascii() and key.isdigit() else path
    payload = {"method": method[:16], "path": path[:500], "reason": why[:2000], "user": user.get_username()}
    with transaction.atomic():
        record(actor=user, action="access.refused", subject=subject[:64], request_id=request_id, payload=payload)


def body_digest(body: object) -> str:
    """sha256 of a body as JSON (sorted keys); of its repr when it has no JSON form (NaN, a huge integer)."""
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=repr)
    except (ValueError, TypeError, RecursionError):
        text = repr(body)[:1_000_000]
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def refuse_verb(verb: str, user, job: object, reason: str, code: str, *, plan_hash: object = None,
                request_id: str | None = None) -> None:
    """Record a refused job verb (`job.<verb>_refused`) on the job it named: who tried, why (`reason`) and the
    kind of refusal (`code`: the exception's class name)."""
    key = getattr(job, "pk", job)
    subject = f"job:{key}" if isinstance(key, int) or str(key).isdigit() else REFUSED_SUBJECT
    actor = user if getattr(user, "is_authenticated", False) else None
    payload = {"reason": reason[:2000], "code": code, "user": user.get_username() if actor else "anonymous"}
    if plan_hash is not None:
        payload["plan_hash"] = str(plan_hash)[:64]
    with transaction.atomic():
        record(actor=actor, action=f"job.{verb}_refused", subject=subject[:64], request_id=request_id,
               payload=payload)


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
                refuse_verb(verb, user, job, str(refusal), type(refusal).__name__, plan_hash=kwargs.get("plan_hash"),
                            request_id=kwargs.get("request_id"))
                raise
        return recorded
    return wrap

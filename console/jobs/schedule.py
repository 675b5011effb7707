"""Scheduled changes: a job proposed with `not_before` runs no earlier than then (docs/console.md, "Schedule a
change").

    split_schedule(body)            the proposal body without `not_before`, and `not_before` checked: an aware ISO 8601
                                    time in the future (else InvalidProposal naming the field, a 400)
    waits(job, now)                 whether an approved job must wait for its time rather than queue now
    approval_expiry(job, now, ttl)  when an approval given now stops counting

The last approval a scheduled job needs leaves it `approved`; beat's `queue_scheduled_jobs` (lifecycle.queue_due)
queues it once `not_before` has come. The worker then checks the engine's fingerprint as for any job, so a layout
that moved while the job waited ends it `stale`.

Approvals expire SEAM_APPROVAL_TTL_S after they are given, and the worker attests only approvals that still count
when it runs. An approval of a job that waits would expire before the job could run, so it lasts TTL after
`not_before` instead: the reviewer approved a change to be made at that time, and the TTL bounds how late after
it the change may still be made on that approval.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from console.jobs.errors import InvalidProposal
from console.jobs.models import Job

__all__ = ["FIELD", "MAX_AHEAD", "approval_expiry", "parse_not_before", "split_schedule", "waits"]

FIELD = "not_before"
# A bound on how far ahead a change may be scheduled: the review was of today's engine, and beyond it a time is more
# likely a typo (and `not_before + TTL` could leave the calendar).
MAX_AHEAD = timedelta(days=365)


def parse_not_before(value: object, now: datetime | None = None) -> datetime | None:
    """None, or an ISO 8601 time with its timezone that lies ahead (within MAX_AHEAD); InvalidProposal otherwise."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidProposal(f"{FIELD}: expected an ISO 8601 time with a timezone, e.g. 2026-12-03T18:00:00Z, got "
                              f"{type(value).__name__}", FIELD)
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidProposal(f"{FIELD}: {value[:64]!r} is not an ISO 8601 time; e.g. 2026-12-03T18:00:00Z",
                              FIELD) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidProposal(f"{FIELD}: {value[:64]!r} has no timezone; add one, e.g. Z or +01:00", FIELD)
    now = now or timezone.now()
    if when <= now:
        raise InvalidProposal(f"{FIELD}: {when.isoformat()} is in the past (the console's clock reads "
                              f"{now.isoformat(timespec='seconds')}); give a later time, or leave it out to run "
                              "once approved", FIELD)
    if when - now > MAX_AHEAD:
        raise InvalidProposal(f"{FIELD}: {when.isoformat()} is more than {MAX_AHEAD.days} days ahead", FIELD)
    return when


def split_schedule(body: object, now: datetime | None = None) -> tuple[object, datetime | None]:
    """(the plan body without `not_before`, the checked `not_before` or None); a body that is not an object is
    returned as it is, for the plan body's own check to refuse."""
    if not isinstance(body, dict) or FIELD not in body:
        return body, None
    plan_body = {key: value for key, value in body.items() if key != FIELD}
    return plan_body, parse_not_before(body[FIELD], now)


def waits(job: Job, now: datetime) -> bool:
    return job.not_before is not None and job.not_before > now


def approval_expiry(job: Job, now: datetime, ttl_s: int) -> datetime:
    """TTL after the approval is given, or after the job's `not_before` when that is later (see the module's doc)."""
    start = job.not_before if waits(job, now) else now
    return start + timedelta(seconds=ttl_s)

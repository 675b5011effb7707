"""Job statuses and kinds, declared once, with the named groups and the transition table (docs/architecture.md §3.5).

    proposed → approved → queued → running → succeeded | failed | rolled_back
    side exits: rejected (a reviewer says no), stale (the engine moved on), cancelled (the proposer withdrew)

Everything else in the console (lifecycle, worker, pages, API) reads these; nobody keeps its own list.
"""

from __future__ import annotations

from django.db import models

__all__ = ["ACTIVE", "CANCELLABLE", "TERMINAL", "TRANSITIONS", "UNJUDGED", "JobKind", "JobStatus",
           "SpeedVerdict", "can_move"]


class JobKind(models.TextChoices):
    CUT = "cut", "Cut change"
    SHAPE = "shape", "Shape change"
    LADDER = "ladder", "Ladder move"


class JobStatus(models.TextChoices):
    PROPOSED = "proposed", "Proposed"
    APPROVED = "approved", "Approved"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    ROLLED_BACK = "rolled_back", "Rolled back"
    REJECTED = "rejected", "Rejected"
    STALE = "stale", "Stale"
    CANCELLED = "cancelled", "Cancelled"


class SpeedVerdict(models.TextChoices):
    """A succeeded job's measured speedup against its predicted one (console.jobs.verdicts); blank: no verdict (the
    job did not succeed, or nothing was predicted for it). The job's status stays `succeeded` whatever this says."""

    PENDING = "pending", "awaiting a speed measurement"
    MET = "met", "met prediction"
    MISSED = "missed", "missed prediction"
    UNMEASURED = "unmeasured", "speed not judged"


# Verdicts that may still change (to met or missed, by the first measurement of the new layout); the others are final.
UNJUDGED: frozenset[str] = frozenset({"", SpeedVerdict.PENDING})

S = JobStatus

# from -> the statuses it may move to; a status missing here has no way out.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PROPOSED: frozenset({S.APPROVED, S.REJECTED, S.CANCELLED}),
    S.APPROVED: frozenset({S.QUEUED, S.CANCELLED}),
    S.QUEUED: frozenset({S.RUNNING, S.CANCELLED}),
    # The worker claims the job (queued -> running) before it looks at the engine, so stale leaves running.
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.ROLLED_BACK, S.STALE}),
}

ACTIVE: frozenset[str] = frozenset(TRANSITIONS)
TERMINAL: frozenset[str] = frozenset(S) - ACTIVE
# What the proposer may still withdraw: everything the worker has not picked up yet.
CANCELLABLE: frozenset[str] = frozenset(s for s, targets in TRANSITIONS.items() if S.CANCELLED in targets)


def can_move(from_status: str, to_status: str) -> bool:
    return to_status in TRANSITIONS.get(from_status, frozenset())

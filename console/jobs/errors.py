"""What the job lifecycle refuses, each with the HTTP status the API should answer and a message that says why.

Pages and the API map these generically (`error.status_code`, `str(error)`); NotAllowed is also a Django
PermissionDenied, so DRF answers it 403 on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import PermissionDenied

if TYPE_CHECKING:
    from console.jobs.shape_fit import LengthAdvice

__all__ = ["Conflict", "EngineUnavailable", "InvalidProposal", "JobError", "JobNotFound", "NotAllowed",
           "PlanInfeasible"]


class JobError(Exception):
    status_code = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidProposal(JobError):
    """A body the console or the engine cannot plan from; `field` names the offending part when known."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class PlanInfeasible(InvalidProposal):
    """The engine priced the plan and refused it; `reasons` are the engine's own. For a shape, `advice` is the
    longest max_model_len that fits instead (console.jobs.shape_fit), said in the message too."""

    status_code = 422

    def __init__(self, reasons: list[str], advice: LengthAdvice | None = None):
        message = "the plan is infeasible: " + ("; ".join(reasons) or "the engine gave no reason")
        super().__init__(message + (f"; {advice.sentence()}" if advice is not None else ""), "target")
        self.reasons = list(reasons)
        self.advice = advice


class NotAllowed(JobError, PermissionDenied):
    status_code = 403


class Conflict(JobError):
    """The job is not in a state that allows this any more (another reviewer, worker or the proposer won)."""

    status_code = 409


class JobNotFound(JobError):
    status_code = 404


class EngineUnavailable(JobError):
    """The engine could not be asked (down, too slow, or it answered with a server error)."""

    status_code = 503

"""Who may open the pages, and which job buttons a page offers; the job services still decide every change.

Every page needs a login and one of the console roles (viewer, operator, reviewer), as the API does. The
buttons follow the review-gate rules so nobody is offered what the service would refuse; the service checks
again on every POST, so a hand-made request is refused there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS

from console.jobs.choices import ACTIVE, CANCELLABLE, JobStatus, SpeedVerdict
from console.jobs.models import Approval, Job
from console.jobs.refusals import refuse_access
from console.jobs.roles import OPERATOR, REVIEWER, roles_of

__all__ = ["JobActions", "console_page", "job_actions"]


def console_page(view: Callable) -> Callable:
    """Login required (redirect to the login page); a logged-in user without a console role gets 403, and a
    POST so refused (a job form, hand-made: no page offers one) is audited as `access.refused`."""
    @wraps(view)
    def guarded(request, *args, **kwargs):
        if not roles_of(request.user):
            why = (f"{request.user.get_username()} has none of the console roles (viewer, operator or reviewer); "
                   "ask an administrator for one")
            if request.method not in SAFE_METHODS:
                refuse_access(request.user, method=request.method, path=request.path, why=why,
                              job_id=kwargs.get("job_id"), request_id=getattr(request, "request_id", None))
            raise PermissionDenied(why)
        return view(request, *args, **kwargs)
    return login_required(guarded)


@dataclass(frozen=True)
class JobActions:
    review: bool  # approve or reject
    cancel: bool
    revert: bool  # propose a revert of a succeeded job that missed its predicted speedup


def job_actions(user, job: Job) -> JobActions:
    roles = roles_of(user)
    review = (REVIEWER in roles and job.proposer_id != user.pk and job.status == JobStatus.PROPOSED
              and not Approval.objects.counting(job.plan_hash).filter(job=job, reviewer=user).exists())
    cancel = OPERATOR in roles and job.proposer_id == user.pk and job.status in CANCELLABLE
    revert = (OPERATOR in roles and job.status == JobStatus.SUCCEEDED and job.speed_verdict == SpeedVerdict.MISSED
              and not job.reverted_by.filter(status__in=ACTIVE).exists())
    return JobActions(review=review, cancel=cancel, revert=revert)

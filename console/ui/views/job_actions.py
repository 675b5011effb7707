"""The job page's buttons: approve (bound to the plan hash shown), reject, cancel and propose a revert, each one
service call.

A refusal from the service comes back to the job page as a message; a user without the role the action needs
gets 403 (the service's NotAllowed is a PermissionDenied).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.jobs import lifecycle
from console.jobs.errors import JobError, JobNotFound, NotAllowed
from console.jobs.refusals import refuse_verb
from console.ui.access import console_page


def _act(request, job_id: int, doing, done: str, follow: bool = False):
    """Run `doing`, say `done` (formatted with the job it returns and `job_id`) or why not, and go back to the job's
    page, or on to the returned job's page when `follow` (a verb that makes a new job)."""
    try:
        job = doing()
    except NotAllowed:
        raise
    except JobNotFound as error:
        raise Http404(str(error)) from error
    except JobError as error:
        messages.error(request, str(error))
    else:
        messages.success(request, done.format(job=job, job_id=job_id))
        if follow:
            return redirect("job", job_id=job.pk)
    return redirect("job", job_id=job_id)


@require_POST
@console_page
def approve(request, job_id: int):
    plan_hash = request.POST.get("plan_hash", "").strip()
    if not plan_hash:
        why = "approve: the form carried no plan_hash; reload the job page and approve the plan it shows"
        # Refused before the service sees it, so recorded here, as the API records the same refusal.
        refuse_verb("approve", request.user, job_id, why, "ValidationError",
                    request_id=getattr(request, "request_id", None))
        messages.error(request, why)
        return redirect("job", job_id=job_id)
    return _act(request, job_id, lambda: lifecycle.approve(request.user, job_id, plan_hash=plan_hash),
                "You approved plan {job.plan_hash:.16}: job {job.pk} is {job.status}.")


@require_POST
@console_page
def reject(request, job_id: int):
    reason = request.POST.get("reason", "")
    return _act(request, job_id, lambda: lifecycle.reject(request.user, job_id, reason=reason),
                "You rejected job {job.pk}; it never reaches the engine.")


@require_POST
@console_page
def cancel(request, job_id: int):
    return _act(request, job_id, lambda: lifecycle.cancel(request.user, job_id), "You cancelled job {job.pk}.")


@require_POST
@console_page
def revert(request, job_id: int):
    """Propose a revert of a job that missed its prediction; the new job's page follows, awaiting review."""
    return _act(request, job_id,
                lambda: lifecycle.propose_revert(request.user, job_id, request_id=getattr(request, "request_id", None)),
                "You proposed job {job.pk} to revert job {job_id}; it awaits review.", follow=True)

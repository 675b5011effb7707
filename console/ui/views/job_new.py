"""New job `/jobs/new/`: the engine's prediction for the plan on the form, and proposing it through the service.

`?kind=cut&cut=8,4,4` prefills the form (the frontier links here) and shows the engine's prediction; the
form's "Show prediction" asks again; "Propose" calls services.propose and opens the new job's page.
"""

from __future__ import annotations

from django.shortcuts import redirect, render

from console.jobs import planning, services
from console.jobs.errors import EngineUnavailable, InvalidProposal, JobError, NotAllowed
from console.jobs.refusals import body_digest, refuse_proposal
from console.jobs.roles import OPERATOR, has_role
from console.ui.access import console_page
from console.ui.forms import ProposeForm


@console_page
def job_new(request):
    may_propose = has_role(request.user, OPERATOR)
    if request.method == "POST":
        if not may_propose:
            refusal = NotAllowed(f"proposing a job needs the operator role, which {request.user.get_username()} "
                                 "does not have")
            _refused(request, refusal)  # as the API's services.propose records a viewer's proposal
            raise refusal
        form = ProposeForm(request.POST)
        if request.POST.get("action") == "propose" and form.is_valid():
            try:
                job = services.propose(request.user, form.cleaned_data["body"])
            except NotAllowed:
                raise
            except JobError as error:
                return _page(request, form, may_propose, error=str(error), status=error.status_code)
            return redirect("job", job_id=job.pk)
    else:
        form = ProposeForm(request.GET) if "kind" in request.GET else ProposeForm()
    if not form.is_bound:
        return _page(request, form, may_propose)
    if not form.is_valid():
        if request.method == "POST" and request.POST.get("action") == "propose":
            reasons = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())
            _refused(request, InvalidProposal(reasons))
        return _page(request, form, may_propose, status=400)
    return _page(request, form, may_propose, **_prediction(form))


def _refused(request, refusal: JobError) -> None:
    """A proposal the page refuses before the services see it is audited like one the API refuses."""
    fields = {name: value for name, value in request.POST.items() if name != "csrfmiddlewaretoken"}
    refuse_proposal(request.user, body_digest(fields), refusal, request_id=getattr(request, "request_id", None))


def _prediction(form: ProposeForm) -> dict:
    """Ask the engine to price the form's plan against its current layout (nothing is stored); say why when it
    cannot or will not."""
    try:
        kind, target, _seen = planning.parse_body(form.cleaned_data["body"])
        plan, plan_hash = planning.plan(kind, target, None, None)  # priced against the layout running now
    except EngineUnavailable as error:
        return {"engine_error": str(error), "status": 503}
    except JobError as error:
        return {"error": str(error), "status": error.status_code}
    # Propose exactly what was predicted: the plan's layout, so a moved engine refuses rather than re-prices.
    form.data = form.data.copy()
    form.data["incumbent_fingerprint"] = plan["incumbent_fingerprint"]
    return {"plan": plan, "plan_hash": plan_hash, "predicted": plan["predicted"]}


def _page(request, form: ProposeForm, may_propose: bool, *, status: int = 200, **context):
    return render(request, "ui/job_new.html", {"form": form, "may_propose": may_propose, **context}, status=status)

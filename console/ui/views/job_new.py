"""New job `/jobs/new/`: the engine's prediction for the plan on the form, and proposing it through the service.

`?kind=cut&cut=8,4,4` prefills the form (the frontier links here) and shows the engine's prediction; the
form's "Show prediction" asks again; "Propose" calls lifecycle.propose and opens the new job's page. The shape
fields start at the engine's current shape (GET /control/state), and a shape the engine refuses comes back with
the longest max_model_len that fits (console.jobs.shape_fit) and a link that proposes it.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.shortcuts import redirect, render
from django.urls import reverse

from console.engine import EngineClient, EngineError
from console.jobs import lifecycle, planning, schedule
from console.jobs.choices import JobKind
from console.jobs.errors import EngineUnavailable, InvalidProposal, JobError, NotAllowed, PlanInfeasible
from console.jobs.refusals import body_digest, refuse_proposal
from console.jobs.roles import OPERATOR, has_role
from console.ui.access import console_page
from console.ui.forms import SHAPE_FIELDS, ProposeForm

SHAPE_TIMEOUT_S = 2.0  # the form opens without the running shape rather than wait on a slow engine


@console_page
def job_new(request):
    may_propose = has_role(request.user, OPERATOR)
    if request.method == "POST":
        if not may_propose:
            refusal = NotAllowed(f"proposing a job needs the operator role, which {request.user.get_username()} "
                                 "does not have")
            _refused(request, refusal)  # as the API's lifecycle.propose records a viewer's proposal
            raise refusal
        form = ProposeForm(request.POST)
        if request.POST.get("action") == "propose" and form.is_valid():
            try:
                job = lifecycle.propose(request.user, form.cleaned_data["body"])
            except NotAllowed:
                raise
            except JobError as error:
                return _page(request, form, may_propose, error=str(error), status=error.status_code,
                             **_advice(form, error))
            return redirect("job", job_id=job.pk)
    elif _names_a_plan(request.GET):
        form = ProposeForm(request.GET)
    else:  # nothing to predict yet: the form starts at what the engine runs
        form = ProposeForm(initial=_running_shape(may_propose) | _kind(request.GET))
    if not form.is_bound:
        return _page(request, form, may_propose)
    if not form.is_valid():
        if request.method == "POST" and request.POST.get("action") == "propose":
            reasons = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())
            _refused(request, InvalidProposal(reasons))
        return _page(request, form, may_propose, status=400)
    return _page(request, form, may_propose, **_prediction(form))


def _names_a_plan(query) -> bool:
    """A query that asks for a prediction: a kind, and for a shape at least one shape field (`?kind=shape` alone
    opens the form at the running shape)."""
    if "kind" not in query:
        return False
    return query["kind"] != JobKind.SHAPE or any(query.get(name) for name in SHAPE_FIELDS)


def _kind(query) -> dict:
    return {"kind": query["kind"]} if query.get("kind") in JobKind.values else {}


def _running_shape(may_propose: bool) -> dict:
    """The engine's current shape as the form's initial shape fields; nothing if it cannot be asked (the prediction
    will say why) or the user has no form."""
    if not may_propose:
        return {}
    try:
        with EngineClient(timeout_s=SHAPE_TIMEOUT_S) as engine:
            shape = engine.state().shape
    except EngineError:
        return {}
    return {name: getattr(shape, name) or "" for name in SHAPE_FIELDS}


def _refused(request, refusal: JobError) -> None:
    """A proposal the page refuses before the lifecycle sees it is audited like one the API refuses."""
    fields = {name: value for name, value in request.POST.items() if name != "csrfmiddlewaretoken"}
    refuse_proposal(request.user, body_digest(fields), refusal, request_id=getattr(request, "request_id", None))


def _prediction(form: ProposeForm) -> dict:
    """Ask the engine to price the form's plan against its current layout (nothing is stored); say why when it
    cannot or will not."""
    try:
        plan_body, _not_before = schedule.split_schedule(form.cleaned_data["body"])
        kind, target, _seen = planning.parse_body(plan_body)
        plan, plan_hash, _incumbent = planning.plan(kind, target, None, None)  # priced against the layout running now
    except EngineUnavailable as error:
        return {"engine_error": str(error), "status": 503}
    except JobError as error:
        return {"error": str(error), "status": error.status_code, **_advice(form, error)}
    # Propose exactly what was predicted: the plan's layout, so a moved engine refuses rather than re-prices.
    form.data = form.data.copy()
    form.data["incumbent_fingerprint"] = plan["incumbent_fingerprint"]
    return {"plan": plan, "plan_hash": plan_hash, "predicted": plan["predicted"]}


def _advice(form: ProposeForm, error: JobError) -> dict:
    """For a refused shape, the longest max_model_len that fits, and the form prefilled with it (the other fields
    as asked)."""
    advice = error.advice if isinstance(error, PlanInfeasible) else None
    if advice is None:
        return {}
    context = {"advice": advice}
    if advice.max_model_len is not None:
        asked = {name: form.data.get(name) for name in (*SHAPE_FIELDS, "not_before") if form.data.get(name)}
        query = {"kind": JobKind.SHAPE, **asked, "max_model_len": advice.max_model_len}
        context["advice_url"] = f"{reverse('job-new')}?{urlencode(query)}"
    return context


def _page(request, form: ProposeForm, may_propose: bool, *, status: int = 200, **context):
    return render(request, "ui/job_new.html", {"form": form, "may_propose": may_propose, **context}, status=status)

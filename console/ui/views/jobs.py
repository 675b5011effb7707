"""Jobs list `/jobs/` and the job page `/jobs/<id>/` (live progress: static/js/job.js)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from console.jobs.choices import ACTIVE, TERMINAL, JobStatus
from console.jobs.lifecycle import approvals_counting, required_approvals
from console.jobs.models import Approval, Job
from console.jobs.roles import OPERATOR, has_role
from console.ui.access import console_page, job_actions

PAGE_SIZE = 50


@console_page
def job_list(request):
    jobs = Job.objects.all()
    status = request.GET.get("status", "")
    if status in JobStatus.values:
        jobs = jobs.filter(status=status)
    page = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "ui/job_list.html", {
        "page": page, "status": status, "statuses": JobStatus.choices, "may_propose": has_role(request.user, OPERATOR),
        "query": urlencode({"status": status}) if status else "",
    })


@console_page
def job_detail(request, job_id: int):
    job = get_object_or_404(Job, pk=job_id)
    now = timezone.now()
    counting = set(Approval.objects.counting_for(job, now).values_list("pk", flat=True))
    reviews = [{"approval": approval, "counts": approval.pk in counting} for approval in job.approvals.all()]
    return render(request, "ui/job_detail.html", {
        "job": job, "actions": job_actions(request.user, job), "reviews": reviews,
        "counting": approvals_counting(job, now), "required": required_approvals(),
        "comparison": _comparison(job), "live": job.status in ACTIVE, "terminal": sorted(TERMINAL),
    })


def _comparison(job: Job) -> list[dict]:
    """Predicted vs measured per rank (pool cap, KV tokens held), once the engine has measured."""
    if not isinstance(job.measured, dict):
        return []
    predicted = {row.get("rank"): row for row in job.prediction.get("ranks") or []}
    rows = []
    for measured in job.measured.get("ranks") or []:
        rank = measured.get("rank")
        plan_row = predicted.get(rank) or {}
        # A rank without attention layers holds no KV: the engine still reports the pipeline's pool there.
        holds_kv = plan_row.get("attention_layers") != 0
        rows.append({"rank": rank, "name": plan_row.get("name", ""),
                     "predicted_tokens": plan_row.get("used") if holds_kv else None,
                     "measured_tokens": measured.get("kv_pool_tokens") if holds_kv else None,
                     "predicted_weights": plan_row.get("weights"),
                     "measured_weights": measured.get("weights_bytes")})
    return rows

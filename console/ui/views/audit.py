"""Audit `/audit/`: the trail newest first, filtered and paginated; chain, anchor and witness verification; JSON-lines
export."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import StreamingHttpResponse
from django.shortcuts import render

from console.audit.models import AuditEvent
from console.audit.services import export_jsonl, verify_chain
from console.audit.witness import engine_witness
from console.ui.access import console_page
from console.ui.forms import AuditFilterForm

PAGE_SIZE = 50


@console_page
def audit(request):
    form = AuditFilterForm(request.GET)
    verified = verify_chain(engine_witness) if request.GET.get("verify") else None
    if not form.is_valid():
        return render(request, "ui/audit.html", {"form": form, "page": None, "verified": verified}, status=400)
    events = form.filter(AuditEvent.objects.order_by("-seq"))
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    for name in ("page", "verify"):
        query.pop(name, None)
    return render(request, "ui/audit.html", {"form": form, "page": page, "verified": verified,
                                             "query": query.urlencode()})


@console_page
def audit_export(request):
    """The filtered events as canonical JSON lines in chain order (console.audit.services.export_jsonl)."""
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return render(request, "ui/audit.html", {"form": form, "page": None}, status=400)
    response = StreamingHttpResponse(export_jsonl(form.filter(AuditEvent.objects.all())),
                                     content_type="application/x-ndjson")
    response["Content-Disposition"] = 'attachment; filename="seam-audit.jsonl"'
    return response

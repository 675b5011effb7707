"""Dashboard `/`: the engine's latest telemetry snapshot, updated live over /ws/live/ (static/js/dashboard.js), and
a warning when the engine's layout changed with no job of the console causing it, and one when the engine restarted
under a job's apply and came back on a layout the job did not lead to (console.jobs.layout_watch).

`?range=15m|1h|6h|24h` limits the charts to that time range (the server sends only that history and the page keeps
only that much as it follows); without it they show the recent snapshots. An unknown range is a 400 naming them."""

from __future__ import annotations

from django.shortcuts import render

from console.jobs.layout_watch import (
    RESTARTED_MID_APPLY,
    UNEXPLAINED_CHANGE,
    recent_restart_mid_apply,
    recent_unexplained_change,
)
from console.ui.access import console_page
from console.ui.forms import TimeRangeForm
from console.ui.telemetry import read_telemetry, summary


@console_page
def dashboard(request):
    form = TimeRangeForm(request.GET)
    valid = form.is_valid()
    range_s = form.seconds() if valid else None
    telemetry = read_telemetry(range_s)
    latest = telemetry.latest
    return render(request, "ui/dashboard.html", {
        "range_form": form, "range_key": form.cleaned_data.get("range", "") if valid else "", "range_s": range_s,
        "time_ranges": form.fields["range"].choices,
        "snapshot": latest.to_dict() if latest else None, "seq": latest.seq if latest else None,
        "history": telemetry.history, "summary": summary(latest) if latest else None,
        "telemetry_error": telemetry.error,
        "unexplained_change": recent_unexplained_change(), "unexplained_action": UNEXPLAINED_CHANGE,
        "restart_mid_apply": recent_restart_mid_apply(), "restart_action": RESTARTED_MID_APPLY,
    }, status=200 if valid else 400)

"""Dashboard `/`: the engine's latest telemetry snapshot, updated live over /ws/live/ (static/js/dashboard.js)."""

from __future__ import annotations

from django.shortcuts import render

from console.ui.access import console_page
from console.ui.telemetry import read_telemetry, summary


@console_page
def dashboard(request):
    telemetry = read_telemetry()
    latest = telemetry.latest
    return render(request, "ui/dashboard.html", {
        "snapshot": latest, "seq": latest["seq"] if latest else None, "history": telemetry.history,
        "summary": summary(latest) if latest else None, "telemetry_error": telemetry.error,
    })

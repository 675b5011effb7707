"""Calibration `/calibration/` and predictions `/predictions/`: the API's own computations, as pages."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import render

from console.api.calibration_views import executed_predictions
from console.calibration.coverage import calibration_report, parse_target
from console.calibration.predictions import prediction_dict, summary
from console.ui.access import console_page
from solvers.errors import SolverError

PAGE_SIZE = 50


@console_page
def calibration(request):
    try:
        target = parse_target(request.GET.get("target"))
    except ValueError as error:
        return render(request, "ui/calibration.html", {"error": f"target: {error}"}, status=400)
    try:
        report = calibration_report(target)
    except SolverError as error:  # SEAM_MODEL / SEAM_RIG name something the planner cannot price
        return render(request, "ui/calibration.html", {"error": str(error)}, status=503)
    return render(request, "ui/calibration.html", {"report": report, "target_percent": target * 100})


@console_page
def predictions(request):
    rows = executed_predictions()
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "ui/predictions.html", {
        "page": page, "predictions": [prediction_dict(row) for row in page], "summary": summary(rows)})

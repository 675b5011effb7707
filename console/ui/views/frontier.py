"""Frontier `/frontier/`: the running model and rig's complete Pareto frontier, the API's own computation."""

from __future__ import annotations

from django.shortcuts import render
from django.urls import reverse

from console.api.frontier import running_frontier, running_rig
from console.ui.access import console_page
from solvers.errors import SolverError


@console_page
def frontier(request):
    try:
        rig = running_rig()
        computed = running_frontier(rig=rig).to_dict()
    except SolverError as error:  # SEAM_MODEL / SEAM_RIG name something the planner cannot price
        return render(request, "ui/frontier.html", {"error": str(error)}, status=503)
    points = computed["points"]
    incumbent = computed["incumbent"]
    rows = [{"point": point, "incumbent": point["cut"] == incumbent["cut"]} for point in points]
    if not any(row["incumbent"] for row in rows):
        rows.insert(0, {"point": incumbent, "incumbent": True})
    # The noise floor the frontier used: measured from repeats of one layout once there are enough, else the rig's.
    return render(request, "ui/frontier.html", {
        "frontier": computed, "rows": rows, "noise_floor": computed["noise_floor"],
        "chart": {"frontier": computed, "noise_floor": computed["noise_floor"], "propose_url": reverse("job-new")},
    })

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
    # The timing's own notes say where the timing came from, which the provenance list shows: each note once.
    timing_notes = computed["timing"]["notes"]
    notes = [note for note in computed["notes"] if note not in timing_notes]
    # The noise floor the frontier used: measured from repeats of one layout once there are enough, else the rig's.
    return render(request, "ui/frontier.html", {
        "frontier": computed, "rows": rows, "notes": notes, "timing_notes": timing_notes,
        "noise_floor": computed["noise_floor"],
        "chart": {"frontier": computed, "noise_floor": computed["noise_floor"], "propose_url": reverse("job-new")},
    })

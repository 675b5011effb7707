"""Calibration coverage of the running model on the rig: the one computation behind /api/v1/calibration/, the
calibration page and the calibration gauges.

Per rank (docs/domain.md §6): whether the measured layouts identify its ms per layer (its layer count took two
values), ms per layer with its standard error (console.calibration.fitting), and the samples per arm needed to
resolve it to `target`; the noise floor and whether it was measured or is the rig's; and, for every unidentified
rank, calibration arms from the running cut that move it both ways, each with a link that proposes it.
"""

from __future__ import annotations

import math
import statistics
from urllib.parse import urlencode

from django.urls import reverse

from console.calibration.fitting import timing_for
from console.calibration.running import RunningLayout, fit_samples, matching_measurements, model_label, running_layout
from solvers.calibration import ArmPlan, Sample, coverage
from solvers.capacity import CutPricer

__all__ = ["DEFAULT_TARGET", "MIN_TARGET", "TARGET_BELOW", "calibration_report", "parse_target"]

DEFAULT_TARGET = 0.05
MIN_TARGET = 0.0001  # finer than 0.01% is beyond any stage timer, and squared counts past it overflow a float
TARGET_BELOW = 1.0  # a precision of 100% or worse resolves nothing


def parse_target(raw: str | None) -> float:
    """?target=: a relative precision in [MIN_TARGET, TARGET_BELOW), e.g. 0.05 for 5%; ValueError naming what is
    wrong. The API reads the same limits (console/api/calibration_views.py)."""
    if raw in (None, ""):
        return DEFAULT_TARGET
    try:
        target = float(raw)
    except ValueError:
        target = math.nan
    if not MIN_TARGET <= target < TARGET_BELOW:  # NaN fails this too
        raise ValueError(f"expected a relative precision between {MIN_TARGET} and {TARGET_BELOW:g}, e.g. 0.05 for 5% "
                         f"(got {raw[:40]!r})")
    return target


def _repeat_sd(samples: list[Sample]) -> list[float] | None:
    """Per rank SD of the stage ms over the repeats of the most repeated cut (A-vs-A); None under two repeats."""
    by_cut: dict[tuple[int, ...], list[tuple[float, ...]]] = {}
    for sample in samples:
        by_cut.setdefault(sample.cut, []).append(sample.stage_ms)
    repeats = max(by_cut.values(), key=len)
    return [statistics.stdev(rank) for rank in zip(*repeats, strict=True)] if len(repeats) > 1 else None


def _arms(plan: ArmPlan, pricer: CutPricer) -> dict:
    arms = []
    for arm in plan.arms:
        reasons = list(pricer.price(arm.cut).reasons)
        query = urlencode({"kind": "cut", "cut": ",".join(map(str, arm.cut))}, safe=",")
        arms.append({**arm.to_dict(), "feasible": not reasons, "reasons": reasons,
                     "propose_url": f"{reverse('job-new')}?{query}"})
    return {"rank": plan.rank, "from": list(plan.incumbent), "step": plan.step, "arms": arms, "notes": list(plan.notes)}


def _head(layout: RunningLayout, target: float) -> dict:
    return {"model": model_label(layout.census), "rig": layout.rig.name, "engine_model": layout.model_name,
            "incumbent": list(layout.incumbent), "incumbent_source": layout.source, "fingerprint": layout.fingerprint,
            "target": target}


def calibration_report(target: float = DEFAULT_TARGET, layout: RunningLayout | None = None) -> dict:
    """Coverage of the measured layouts of the running model and rig (see the module's docstring)."""
    layout = layout or running_layout()
    rows, notes = matching_measurements(layout)
    samples = fit_samples(rows)
    timing = timing_for(samples, layout.incumbent, layout.rig)
    notes += list(layout.notes)
    report = {**_head(layout, target), "samples": len(samples), "noise_floor": timing.model.noise_floor,
              "noise_floor_source": timing.noise_floor_source,
              "noise_floor_samples": timing.fit.noise_floor_samples if timing.fit else 0,
              "validation": timing.validation.to_dict(),
              "layouts": [layout.to_dict() for layout in timing.fit.layouts] if timing.fit else []}
    if not samples:
        return {**report, "explanation": (
            f"nothing is measured yet of {layout.model_name or model_label(layout.census)} on {layout.rig.name}: the "
            "console records what the engine measured of its layout at each job's end and every SEAM_MEASURE_S "
            "while it serves decode steps; send it traffic, and every rank counts as unidentified until then"),
            "cuts": [], "unidentified": list(range(layout.rig.size)), "ranks": [], "arms": [], "warnings": [],
            "notes": notes}
    sd = _repeat_sd(samples)
    found = coverage(samples, target, sd_ms=sd, incumbent=layout.incumbent, step=1)
    fit = timing.fit
    ranks = [{**rank.to_dict(), "ms_per_layer_se": fit.ms_per_layer_se[rank.rank] if fit else None,
              "sd_source": "repeats" if sd is not None else "fit residual"} for rank in found.ranks]
    pricer = CutPricer(layout.census, layout.rig, layout.shape)
    return {**report, "explanation": None, "cuts": [list(cut) for cut in sorted({s.cut for s in samples})],
            "unidentified": list(found.unidentified), "ranks": ranks,
            "arms": [_arms(plan, pricer) for plan in found.arms],
            "warnings": [warning.to_dict() for warning in found.warnings], "notes": notes + list(timing.notes)}

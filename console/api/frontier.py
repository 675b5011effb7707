"""The running frontier: the one computation behind /api/v1/frontier/ and the frontier page.

The incumbent is the layout the engine runs (its cut and shape from GET /control/state; when the engine cannot be
reached, the newest measured layout, else the rig's: `incumbent_source` says which). Cuts are timed by the model
fitted across every measured layout of the running model on the rig (console.calibration.fitting; the rig's stage
ms until something is measured), each point carries the fit's speedup interval, and measured cuts carry what was
measured there. Which measurements count is console.calibration.running's to say.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from django.conf import settings

from console.calibration.fitting import Timing, timing_for
from console.calibration.models import MeasuredLayout
from console.calibration.running import RunningLayout, fit_samples, matching_measurements, running_layout
from solvers.census import load_census
from solvers.frontier import CutReport, Frontier, compute_frontier
from solvers.rig import Rig, load_rig

__all__ = ["RunningFrontier", "running_frontier", "running_rig"]


def running_rig() -> Rig:
    """The rig the engine runs on (settings.SEAM_RIG)."""
    return load_rig(settings.SEAM_RIG)


@dataclass(frozen=True)
class MeasuredCut:
    stage_ms: list[float] | None  # per rank, the median over its samples' decode medians; None: no decode steps
    pool_tokens: int | None  # the pool the ranks allocated, newest measurement at the incumbent's shape
    samples: int  # measurements with decode steps

    def to_dict(self) -> dict:
        return {"stage_ms": self.stage_ms, "pool_tokens": self.pool_tokens, "samples": self.samples}


def _measured_cuts(rows: list[MeasuredLayout], layout: RunningLayout) -> dict[tuple[int, ...], MeasuredCut]:
    shape = layout.shape.to_dict() if layout.shape is not None else layout.rig.shape.to_dict()
    by_cut: dict[tuple[int, ...], list[MeasuredLayout]] = {}
    for row in rows:  # newest first
        by_cut.setdefault(tuple(row.cut), []).append(row)
    measured = {}
    for cut, at_cut in by_cut.items():
        stages = [sample.stage_ms for sample in fit_samples(at_cut)]
        pool = next((row.pool_allocated for row in at_cut if row.shape == shape), None)
        median = [round(statistics.median(rank), 4) for rank in zip(*stages, strict=True)] if stages else None
        measured[cut] = MeasuredCut(median, pool, len(stages))
    return measured


@dataclass(frozen=True)
class RunningFrontier:
    frontier: Frontier
    layout: RunningLayout
    timing: Timing
    measured: dict[tuple[int, ...], MeasuredCut]
    notes: tuple[str, ...]

    @property
    def noise_floor(self) -> float:
        return self.timing.model.noise_floor

    def _point(self, report: CutReport) -> dict:
        point = report.to_dict()
        point["x_pipelined_interval"] = self.timing.speedup_interval(report.cut)
        if report.cut in self.measured:
            point["measured"] = self.measured[report.cut].to_dict()
        return point

    def to_dict(self) -> dict:
        data = self.frontier.to_dict()
        data.update(incumbent=self._point(self.frontier.incumbent),
                    points=[self._point(point) for point in self.frontier.points],
                    notes=list(self.notes) + data["notes"], incumbent_source=self.layout.source,
                    engine={"model": self.layout.model_name, "fingerprint": self.layout.fingerprint},
                    shape=(self.layout.shape or self.layout.rig.shape).to_dict(), timing=self.timing.to_dict(),
                    noise_floor=self.noise_floor, noise_floor_source=self.timing.noise_floor_source)
        return data


def running_frontier(min_pool_ratio: float | None = None, rig: Rig | None = None) -> RunningFrontier:
    """The complete Pareto frontier of settings.SEAM_MODEL on the running rig, against the running layout."""
    layout = running_layout(load_census(settings.SEAM_MODEL), rig or running_rig())
    rows, notes = matching_measurements(layout)
    timing = timing_for(fit_samples(rows), layout.incumbent, layout.rig)
    measured = _measured_cuts(rows, layout)
    frontier = compute_frontier(layout.census, layout.rig, shape=layout.shape, timing=timing.model,
                                min_pool_ratio=min_pool_ratio, incumbent=layout.cut,
                                measured_cuts=list(measured))
    return RunningFrontier(frontier, layout, timing, measured, (*layout.notes, *notes, *timing.notes))

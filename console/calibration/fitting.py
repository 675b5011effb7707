"""The timing the console prices cuts with: fitted across the measured layouts when there are any, else the rig's.

One place decides it, for the frontier, the calibration report and each job's prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solvers.calibration import Sample
from solvers.errors import SolverError
from solvers.frontier import default_timing
from solvers.rig import Rig
from solvers.timing import TimingModel
from solvers.timing_fit import TimingFit, fit_timing
from solvers.timing_validation import TimingValidation, validate_timing

__all__ = ["MEASURED", "RIG", "Timing", "timing_for"]

MEASURED = "measured"
RIG = "rig"


@dataclass(frozen=True)
class Timing:
    model: TimingModel
    fit: TimingFit | None  # None: the rig's stage ms (nothing measured, or the fit refused)
    source: str  # "measured" (fitted) or "rig"
    notes: tuple[str, ...]
    validation: TimingValidation  # leave-one-layout-out over the same samples

    @property
    def noise_floor_source(self) -> str:
        return self.fit.noise_floor_source if self.fit is not None else RIG

    def speedup_interval(self, cut: Sequence[int]) -> list[float] | None:
        """[low, high] of the pipelined speedup, both finite; None without a fit to bound it."""
        if self.fit is None:
            return None
        return [round(bound, 6) for bound in self.fit.speedup_interval(cut)]

    def to_dict(self) -> dict:
        if self.fit is not None:
            return {**self.fit.to_dict(), "source": MEASURED, "notes": list(self.notes) + list(self.fit.notes),
                    "validation": self.validation.to_dict()}
        model = self.model
        return {"source": RIG, "incumbent": list(model.incumbent), "fixed_measured": model.fixed_measured,
                "ranks": [{"rank": i, "identified": False, "ms_per_layer": ms, "ms_per_layer_se": None,
                           "fixed_ms": fixed, "fixed_ms_se": None, "fixed_published": False}
                          for i, (ms, fixed) in enumerate(zip(model.ms_per_layer, model.fixed_ms, strict=True))],
                "noise_floor": model.noise_floor, "noise_floor_source": RIG, "noise_floor_samples": 0, "samples": 0,
                "notes": list(self.notes), "layouts": [], "unexplained": [], "validation": self.validation.to_dict()}


def timing_for(samples: Sequence[Sample], incumbent: Sequence[int], rig: Rig) -> Timing:
    """fit_timing over `samples` with `incumbent` as the running cut; the rig's timing (noted) without samples."""
    incumbent = tuple(incumbent)
    notes: list[str] = []
    if samples:
        try:
            fit = fit_timing(samples, incumbent, rig.noise_floor)
            return Timing(fit.model, fit, MEASURED, (f"timing fitted over {fit.samples} measured layout sample(s)",),
                          validate_timing(samples, rig.noise_floor))
        except SolverError as error:
            notes.append(f"the measured layouts could not be fitted ({error})")
    else:
        notes.append("no measured layout with decode steps yet: the rig's stage ms are used")
    return Timing(default_timing(rig, incumbent, notes), None, RIG, tuple(notes),
                  TimingValidation(measured=0, layouts=()))

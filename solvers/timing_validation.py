"""How well the fitted timing model predicts layouts it has not seen: leave-one-layout-out validation.

For every measured layout (cut), the model is fitted on the samples of every other layout and asked for the held-out
layout's pipelined ms; the error is predicted / measured - 1, where measured is the largest of the layout's ranks'
mean stage ms (timing_fit.measured_pipelined_ms). A model is "validated" once MIN_LAYOUTS layouts are measured, so
that every fold is fitted on at least two layouts; below that the report says how many more are needed.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from solvers.calibration import Sample, parse_samples
from solvers.timing_fit import fit_timing, measured_pipelined_ms, samples_by_layout

__all__ = ["MIN_LAYOUTS", "HeldOut", "TimingValidation", "validate_timing"]

MIN_LAYOUTS = 3


@dataclass(frozen=True)
class HeldOut:
    """One layout predicted by a model fitted without it."""

    cut: tuple[int, ...]
    samples: int
    measured_ms: float
    predicted_ms: float

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1

    def to_dict(self) -> dict:
        return {"cut": list(self.cut), "samples": self.samples, "measured_ms": self.measured_ms,
                "predicted_ms": self.predicted_ms, "error": self.error}


@dataclass(frozen=True)
class TimingValidation:
    measured: int  # distinct layouts measured
    layouts: tuple[HeldOut, ...]  # empty below two measured layouts: nothing to fit a fold on

    @property
    def layouts_needed(self) -> int:
        """More measured layouts before the figure counts as validated; 0 once it does."""
        return max(MIN_LAYOUTS - self.measured, 0)

    @property
    def validated(self) -> bool:
        return self.layouts_needed == 0

    @property
    def mean_abs_error(self) -> float | None:
        return statistics.fmean(abs(h.error) for h in self.layouts) if self.layouts else None

    @property
    def max_abs_error(self) -> float | None:
        return max(abs(h.error) for h in self.layouts) if self.layouts else None

    @property
    def summary(self) -> str:
        if not self.validated:
            return f"not yet validated: {self.layouts_needed} more measured layout(s) needed"
        return (f"validated to ±{self.mean_abs_error:.1%} (max {self.max_abs_error:.1%}) on {len(self.layouts)} "
                "held-out layouts")

    def to_dict(self) -> dict:
        return {"validated": self.validated, "measured_layouts": self.measured,
                "layouts_needed": self.layouts_needed, "min_layouts": MIN_LAYOUTS,
                "mean_abs_error": self.mean_abs_error, "max_abs_error": self.max_abs_error,
                "summary": self.summary, "layouts": [h.to_dict() for h in self.layouts]}


def validate_timing(samples: Iterable[Sample | tuple | dict], rig_noise_floor: float) -> TimingValidation:
    """Leave-one-layout-out: each measured layout predicted by fit_timing over the others' samples."""
    by_cut = samples_by_layout(parse_samples(samples))
    if len(by_cut) < 2:
        return TimingValidation(len(by_cut), ())
    held_out = []
    for cut, own in by_cut.items():
        others = [sample for other, group in by_cut.items() if other != cut for sample in group]
        fit = fit_timing(others, others[0].cut, rig_noise_floor)
        held_out.append(HeldOut(cut, len(own), measured_pipelined_ms(own), fit.model.pipelined_ms(cut)))
    return TimingValidation(len(by_cut), tuple(held_out))

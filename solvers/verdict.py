"""Did a change deliver the speed it promised? (docs/domain.md §6 and §10: verify measured against predicted.)

Three small formulas, the only ones the console uses for them:

- `speedup(before_ms, after_ms)`: how much faster the layout after is, from the pipelined ms of each (> 1 faster);
- `relative_error(measured, predicted)`: (measured - predicted) / predicted, a fraction of the prediction;
- `check_speed(predicted, measured, noise_floor)`: the measured speedup against the predicted one. The error is
  measured / predicted - 1; a miss is an error larger in size than the noise floor the prediction was made with
  (the A-vs-A spread of repeated identical runs): inside the floor the measurement cannot tell the two apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from solvers.errors import SolverError

__all__ = ["SpeedCheck", "check_speed", "relative_error", "speedup"]


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise SolverError(f"{name}: expected a finite number > 0 (got {value!r:.40})")
    return float(value)


def speedup(before_ms: float, after_ms: float) -> float:
    """The speedup of the layout after over the one before, from their pipelined ms: before / after."""
    return _positive(before_ms, "before_ms") / _positive(after_ms, "after_ms")


def relative_error(measured: float, predicted: float) -> float:
    """(measured - predicted) / predicted."""
    if isinstance(measured, bool) or not isinstance(measured, int | float) or not math.isfinite(measured):
        raise SolverError(f"measured: expected a finite number (got {measured!r:.40})")
    if isinstance(predicted, bool) or not isinstance(predicted, int | float) or not math.isfinite(predicted) \
            or predicted == 0:
        raise SolverError(f"predicted: expected a finite number other than 0 (got {predicted!r:.40})")
    return (measured - predicted) / predicted


@dataclass(frozen=True)
class SpeedCheck:
    predicted: float  # the predicted speedup (x, > 1 faster)
    measured: float  # the measured speedup
    noise_floor: float  # the fraction the prediction was made with
    error: float  # measured / predicted - 1

    @property
    def missed(self) -> bool:
        return abs(self.error) > self.noise_floor

    def to_dict(self) -> dict:
        return {"predicted": self.predicted, "measured": self.measured, "noise_floor": self.noise_floor,
                "error": round(self.error, 6), "missed": self.missed}


def check_speed(predicted: float, measured: float, noise_floor: float) -> SpeedCheck:
    """The measured speedup against the predicted one, judged by `noise_floor` (a fraction in [0, 1))."""
    predicted, measured = _positive(predicted, "predicted"), _positive(measured, "measured")
    if isinstance(noise_floor, bool) or not isinstance(noise_floor, int | float) or not 0 <= noise_floor < 1:
        raise SolverError(f"noise_floor: expected a fraction in [0, 1), e.g. 0.141 (got {noise_floor!r:.40})")
    return SpeedCheck(predicted, measured, float(noise_floor), relative_error(measured, predicted))

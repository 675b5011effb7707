"""The calibrated timing model (docs/domain.md §6): ms per layer per rank, serial and pipelined time.

The fixed per-stage cost cannot be identified from one cut, so it defaults to 0: every speedup is
then an upper bound (flag `optimistic`) until a fixed cost is measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solvers.errors import SolverError
from solvers.rig import DEFAULT_NOISE_FLOOR


@dataclass(frozen=True)
class CutTiming:
    cut: tuple[int, ...]
    stage_ms: tuple[float, ...]
    serial_ms: float
    pipelined_ms: float
    x_serial: float  # speedup vs the incumbent, serial
    x_pipelined: float  # speedup vs the incumbent, pipelined
    flags: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "cut": list(self.cut), "stage_ms": [round(ms, 6) for ms in self.stage_ms],
            "serial_ms": round(self.serial_ms, 6), "pipelined_ms": round(self.pipelined_ms, 6),
            "x_serial": round(self.x_serial, 6), "x_pipelined": round(self.x_pipelined, 6), "flags": list(self.flags),
        }


@dataclass(frozen=True)
class TimingModel:
    incumbent: tuple[int, ...]
    ms_per_layer: tuple[float, ...]
    fixed_ms: tuple[float, ...]
    fixed_measured: bool
    noise_floor: float = DEFAULT_NOISE_FLOOR

    def stage_ms(self, cut: Sequence[int]) -> tuple[float, ...]:
        if len(cut) != len(self.ms_per_layer):
            raise SolverError(f"cut {list(cut)} has {len(cut)} ranks; the timing model has {len(self.ms_per_layer)}")
        return tuple(layers * ms + fixed for layers, ms, fixed in zip(cut, self.ms_per_layer, self.fixed_ms,
                                                                      strict=True))

    def serial_ms(self, cut: Sequence[int]) -> float:
        return sum(self.stage_ms(cut))

    def pipelined_ms(self, cut: Sequence[int]) -> float:
        return max(self.stage_ms(cut))

    def evaluate(self, cut: Sequence[int]) -> CutTiming:
        cut = tuple(cut)
        stages = self.stage_ms(cut)
        serial, pipelined = sum(stages), max(stages)
        x_serial = self.serial_ms(self.incumbent) / serial
        x_pipelined = self.pipelined_ms(self.incumbent) / pipelined
        return CutTiming(cut, stages, serial, pipelined, x_serial, x_pipelined,
                         self.flags(cut, x_serial, x_pipelined))

    def flags(self, cut: tuple[int, ...], x_serial: float, x_pipelined: float) -> tuple[str, ...]:
        flags = []
        if cut != self.incumbent and abs(x_pipelined - 1.0) < self.noise_floor:
            flags.append("below_noise")  # a predicted gain inside the A-vs-A spread is not a finding
        if x_pipelined > 1.0 and x_serial < 1.0:
            flags.append("needs_pipelining")  # faster only while stages overlap
        if not self.fixed_measured:
            flags.append("optimistic")  # fixed per-stage cost assumed 0: an upper bound
        return tuple(flags)


def calibrate(incumbent: Sequence[int], stage_ms: Sequence[float], fixed_ms: Sequence[float] | None = None,
              noise_floor: float = DEFAULT_NOISE_FLOOR) -> TimingModel:
    """ms per layer per rank from stage times measured at `incumbent`: (stage - fixed) / layers."""
    incumbent, stage_ms = tuple(incumbent), tuple(float(ms) for ms in stage_ms)
    if len(incumbent) != len(stage_ms):
        raise SolverError(f"incumbent {list(incumbent)} has {len(incumbent)} ranks but {len(stage_ms)} stage times")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in incumbent):
        raise SolverError(f"incumbent {list(incumbent)}: every rank needs a positive whole number of layers")
    if any(not ms > 0 for ms in stage_ms):
        raise SolverError(f"stage times {list(stage_ms)}: every measured stage time must be positive")
    fixed = tuple(float(ms) for ms in fixed_ms) if fixed_ms is not None else (0.0,) * len(incumbent)
    if len(fixed) != len(incumbent):
        raise SolverError(f"fixed_ms has {len(fixed)} entries; the incumbent has {len(incumbent)} ranks")
    if any(f < 0 or f >= ms for f, ms in zip(fixed, stage_ms, strict=True)):
        raise SolverError(f"fixed_ms {list(fixed)}: each must be >= 0 and below its stage time {list(stage_ms)}")
    per_layer = tuple((ms - f) / layers for ms, f, layers in zip(stage_ms, fixed, incumbent, strict=True))
    return TimingModel(incumbent, per_layer, fixed, fixed_measured=fixed_ms is not None, noise_floor=noise_floor)

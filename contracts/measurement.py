"""What the engine measures of the layout it serves: the one shape engine and console exchange for it.

The engine reports a LayoutMeasurement as `measurement` in GET /control/state and in every telemetry snapshot's
`engine` (engine/control/snapshot.py builds it); the console parses it back with `LayoutMeasurement.from_dict`,
records it (console.calibration) and calibrates the timing model from its decode stage times
(solvers.timing_fit). Nobody else reads these keys.

- `decode` / `prefill`: per kind of step over the engine's recent window (steps of a layout only: the window is
  cleared when the layout changes), the step count, the median tokens a step, and per rank the median stage ms
  and its spread (the sample standard deviation over those steps; 0 with one step), and the driver's host time a
  step, median and 90th percentile: the step's wall time in the driver's loop less its wait on the ranks (scheduling,
  the step plan, sampling, committing and handing tokens out); absent from engines that do not measure it.
- `pool`: three figures of one quantity, the KV pool in tokens: `predicted` is the planner's pool (the `pool_tokens`
  of the plan and the state), `allocated` the smallest pool the attention ranks allocated, `real` the tokens the
  scheduler can hand out (whole blocks of that pool).
- `latency`: medians over the engine's recent finished requests: time to first token and time between output
  tokens, in ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.errors import ContractError
from contracts.layout import Cut
from contracts.reading import count, field, number

__all__ = ["NO_STEPS", "STEP_KINDS", "LayoutMeasurement", "Latency", "PoolFigures", "StageStats"]

STEP_KINDS = ("decode", "prefill")


def _per_rank(value: Any, where: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not value:
        raise ContractError(f"{where}: expected one number per rank, got {value!r}")
    return tuple(number(v, f"{where}[{i}]") for i, v in enumerate(value))


@dataclass(frozen=True)
class StageStats:
    """One kind of step over the recent window: how many, their median tokens, each rank's median and spread."""

    steps: int
    median_tokens: float | None
    median_ms: tuple[float, ...] | None  # per rank; None without steps
    spread_ms: tuple[float, ...] | None  # per rank, sample SD over the steps; None without steps
    host_ms: float | None = None  # the driver's median host time a step; None without steps (or not measured)
    host_p90_ms: float | None = None  # its 90th percentile

    def to_dict(self) -> dict:
        return {"steps": self.steps, "median_tokens": self.median_tokens,
                "median_ms": None if self.median_ms is None else list(self.median_ms),
                "spread_ms": None if self.spread_ms is None else list(self.spread_ms),
                "host_ms": self.host_ms, "host_p90_ms": self.host_p90_ms}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> StageStats:
        steps = count(field(data, "steps", where), f"{where}.steps")
        stats = cls(steps, number(field(data, "median_tokens", where), f"{where}.median_tokens", allow_none=True),
                    _per_rank(field(data, "median_ms", where), f"{where}.median_ms"),
                    _per_rank(field(data, "spread_ms", where), f"{where}.spread_ms"),
                    # Optional: an engine from before the front end's split does not measure its host time.
                    *(number(data.get(name), f"{where}.{name}", allow_none=True)
                      for name in ("host_ms", "host_p90_ms")))
        if (steps > 0) != (stats.median_ms is not None) or (stats.median_ms is None) != (stats.spread_ms is None):
            raise ContractError(f"{where}: median_ms and spread_ms are given exactly when steps > 0 (steps={steps})")
        if stats.median_ms is not None and len(stats.median_ms) != len(stats.spread_ms):
            raise ContractError(f"{where}: median_ms and spread_ms need one entry per rank each")
        return stats


NO_STEPS = StageStats(0, None, None, None)


@dataclass(frozen=True)
class PoolFigures:
    predicted: int | None  # the planner's pool tokens
    allocated: int | None  # the smallest KV pool an attention rank allocated
    real: int | None  # what the scheduler can hand out: whole blocks of the pool

    def to_dict(self) -> dict:
        return {"predicted": self.predicted, "allocated": self.allocated, "real": self.real}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> PoolFigures:
        return cls(*(count(field(data, name, where), f"{where}.{name}", allow_none=True)
                     for name in ("predicted", "allocated", "real")))


@dataclass(frozen=True)
class Latency:
    requests: int  # finished requests the medians are over
    ttft_ms: float | None  # median time to first token
    itl_ms: float | None  # median time between output tokens

    def to_dict(self) -> dict:
        return {"requests": self.requests, "ttft_ms": self.ttft_ms, "itl_ms": self.itl_ms}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Latency:
        return cls(count(field(data, "requests", where), f"{where}.requests"),
                   number(field(data, "ttft_ms", where), f"{where}.ttft_ms", allow_none=True),
                   number(field(data, "itl_ms", where), f"{where}.itl_ms", allow_none=True))


@dataclass(frozen=True)
class LayoutMeasurement:
    model: str
    rig: str
    fingerprint: str
    cut: Cut
    shape: dict  # the ServingShape's fields, as the engine wrote them
    decode: StageStats
    prefill: StageStats
    decode_tok_s: float
    prefill_tok_s: float
    pool: PoolFigures
    latency: Latency

    def stats(self, kind: str) -> StageStats:
        if kind not in STEP_KINDS:
            raise ContractError(f"step kind {kind!r}: expected one of {', '.join(STEP_KINDS)}")
        return self.decode if kind == "decode" else self.prefill

    def to_dict(self) -> dict:
        return {"model": self.model, "rig": self.rig, "fingerprint": self.fingerprint, "cut": self.cut.to_list(),
                "shape": dict(self.shape), "decode": self.decode.to_dict(), "prefill": self.prefill.to_dict(),
                "decode_tok_s": self.decode_tok_s, "prefill_tok_s": self.prefill_tok_s,
                "pool": self.pool.to_dict(), "latency": self.latency.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str = "measurement") -> LayoutMeasurement:
        """Parse what the engine sent, naming the field that is wrong (ContractError)."""
        texts = {}
        for name in ("model", "rig", "fingerprint"):
            value = field(data, name, where)
            if not isinstance(value, str) or not value:
                raise ContractError(f"{where}.{name}: expected a non-empty string, got {value!r}")
            texts[name] = value
        cut = field(data, "cut", where)
        if not isinstance(cut, list | tuple) or not cut or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in cut):
            raise ContractError(f"{where}.cut: expected positive layer counts per rank, got {cut!r}")
        shape = field(data, "shape", where)
        if not isinstance(shape, dict):
            raise ContractError(f"{where}.shape: expected an object, got {shape!r}")
        measurement = cls(cut=Cut(tuple(cut)), shape=shape, **texts,
                          decode=StageStats.from_dict(field(data, "decode", where), f"{where}.decode"),
                          prefill=StageStats.from_dict(field(data, "prefill", where), f"{where}.prefill"),
                          decode_tok_s=number(field(data, "decode_tok_s", where), f"{where}.decode_tok_s"),
                          prefill_tok_s=number(field(data, "prefill_tok_s", where), f"{where}.prefill_tok_s"),
                          pool=PoolFigures.from_dict(field(data, "pool", where), f"{where}.pool"),
                          latency=Latency.from_dict(field(data, "latency", where), f"{where}.latency"))
        for kind in STEP_KINDS:
            per_rank = measurement.stats(kind).median_ms
            if per_rank is not None and len(per_rank) != len(measurement.cut):
                raise ContractError(f"{where}.{kind}.median_ms: {len(per_rank)} ranks, the cut has {len(cut)}")
        return measurement

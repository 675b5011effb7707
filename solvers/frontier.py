"""The cut frontier (docs/domain.md §7): the complete Pareto set over (pipelined time ↓, KV pool ↑).

Every composition of the model's layers over the rig's ranks is a candidate cut. The pool is the PP
min rule (capacity.CutPricer), the times come from the calibrated TimingModel, and refused cuts are
absent from the frontier but listed with the pricer's reasons. The search is exact and never
enumerates the cuts (frontier_search.py); every reported number is re-priced through
`CutPricer.price` and `TimingModel.evaluate`, so a point says exactly what pricing that cut says.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from math import comb, isfinite

from contracts.layout import ServingShape
from solvers.capacity import CutPricer
from solvers.census import ModelCensus
from solvers.errors import SolverError
from solvers.frontier_search import CutSearch, time_key
from solvers.rig import Rig
from solvers.timing import TimingModel, calibrate

DEFAULT_REFUSED_LIMIT = 200


@dataclass(frozen=True)
class CutReport:
    """One priced cut: a frontier point, or the incumbent (which may be refused: see `reasons`)."""

    cut: tuple[int, ...]
    attention_split: tuple[int, ...]
    caps: tuple[int | None, ...]  # allowed tokens per rank; None for a rank without attention (never binds)
    pool_tokens: int | None
    pool_ratio: float | None  # vs the incumbent's pool; None when either is refused
    binding_rank: int | None
    serial_ms: float
    pipelined_ms: float
    x_serial: float
    x_pipelined: float
    flags: tuple[str, ...]
    provenance: str  # "measured" only for a booted or measured layout, else "extrapolated"
    reasons: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return not self.reasons

    def dominates(self, other: CutReport) -> bool:
        """No slower and no smaller, and strictly better in one (a refused cut dominates nothing)."""
        if self.pool_tokens is None:
            return False
        if other.pool_tokens is None:
            return True
        mine, theirs = time_key(self.pipelined_ms), time_key(other.pipelined_ms)
        no_worse = mine <= theirs and self.pool_tokens >= other.pool_tokens
        return no_worse and (mine, self.pool_tokens) != (theirs, other.pool_tokens)

    def to_dict(self) -> dict:
        return {
            "cut": list(self.cut), "attention_split": list(self.attention_split), "caps": list(self.caps),
            "pool_tokens": self.pool_tokens,
            "pool_ratio": None if self.pool_ratio is None else round(self.pool_ratio, 6),
            "binding_rank": self.binding_rank, "serial_ms": round(self.serial_ms, 6),
            "pipelined_ms": round(self.pipelined_ms, 6), "x_serial": round(self.x_serial, 6),
            "x_pipelined": round(self.x_pipelined, 6), "flags": list(self.flags), "provenance": self.provenance,
            "feasible": self.feasible, "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class RefusedCut:
    cut: tuple[int, ...]
    reasons: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"cut": list(self.cut), "reason": "; ".join(self.reasons), "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Frontier:
    model: str
    rig: str
    incumbent: CutReport
    points: tuple[CutReport, ...]  # sorted by pipelined time, fastest first (pool rises along it)
    refused: tuple[RefusedCut, ...]  # the first `refused_limit` refused cuts, lexicographic
    refused_total: int  # exact
    total_cuts: int
    notes: tuple[str, ...]
    elapsed_s: float

    def to_dict(self) -> dict:
        return {
            "model": self.model, "rig": self.rig, "incumbent": self.incumbent.to_dict(),
            "points": [point.to_dict() for point in self.points],
            "refused": [refused.to_dict() for refused in self.refused], "refused_total": self.refused_total,
            "total_cuts": self.total_cuts, "notes": list(self.notes), "elapsed_s": round(self.elapsed_s, 6),
        }


def report_cut(pricer: CutPricer, timing: TimingModel, cut: tuple[int, ...], incumbent_pool: int | None = None,
               measured_cuts: Collection[tuple[int, ...]] = frozenset()) -> CutReport:
    """Price one cut through the public pricer and timing model: the single source of every number.

    Provenance is "measured" for a cut the rig booted or one in `measured_cuts` (layouts measured live).
    """
    priced, timed = pricer.price(cut), timing.evaluate(cut)
    pool = priced.pool_tokens
    ratio = pool / incumbent_pool if pool is not None and incumbent_pool else None
    return CutReport(
        cut=priced.cut, attention_split=priced.attention_split,
        caps=tuple(rank.allowed_tokens for rank in priced.ranks), pool_tokens=pool, pool_ratio=ratio,
        binding_rank=priced.binding_rank, serial_ms=timed.serial_ms, pipelined_ms=timed.pipelined_ms,
        x_serial=timed.x_serial, x_pipelined=timed.x_pipelined, flags=timed.flags,
        provenance="measured" if priced.cut in measured_cuts or pricer.rig.is_booted(priced.cut) else "extrapolated",
        reasons=priced.reasons,
    )


def default_timing(rig: Rig, incumbent: tuple[int, ...], notes: list[str]) -> TimingModel:
    """Calibrate from the rig's measured stage times; rescale them per layer when the incumbent was rescaled."""
    stage_ms = rig.stage_ms
    if stage_ms is None or rig.incumbent_cut is None:
        raise SolverError(
            f"rig {rig.name!r}: the frontier's timing needs stage ms measured at a declared incumbent cut on every "
            "rank (set ranks[].stage_ms and incumbent_cut), or pass a calibrated TimingModel as timing=")
    declared = tuple(rig.incumbent_cut)
    if incumbent != declared:
        # ms per layer is what was measured; a stage time at a different cut is not.
        stage_ms = [ms / layers * new for ms, layers, new in zip(stage_ms, declared, incumbent, strict=True)]
        notes.append(f"stage ms rescaled per layer from the declared incumbent {list(declared)} to "
                     f"{list(incumbent)}: {[round(ms, 3) for ms in stage_ms]} (extrapolated, not measured)")
    return calibrate(incumbent, stage_ms, noise_floor=rig.noise_floor)


def _composition(cut: object, layers: int, ranks: int, what: str) -> tuple[int, ...]:
    """`cut` as a tuple when it puts `layers` on `ranks` ranks, a positive whole number each; else SolverError."""
    if not isinstance(cut, Sequence) or isinstance(cut, str) or len(cut) != ranks or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in cut) or sum(cut) != layers:
        raise SolverError(f"{what} {cut!r}: expected {ranks} positive whole layer counts (one per rank) summing to "
                          f"the model's {layers} layers")
    return tuple(cut)


def compute_frontier(model: ModelCensus, rig: Rig, *, shape: ServingShape | None = None,
                     timing: TimingModel | None = None, min_pool_ratio: float | None = None,
                     refused_limit: int = DEFAULT_REFUSED_LIMIT, incumbent: Sequence[int] | None = None,
                     measured_cuts: Collection[Sequence[int]] = ()) -> Frontier:
    """The exact Pareto frontier over (pipelined ms ↓, pool tokens ↑) of every cut of `model` on `rig`.

    `incumbent`: the cut speedups and pool ratios are against (default: the rig's); pass the running cut.
    `measured_cuts`: layouts measured live, reported with provenance "measured" like the rig's booted ones.
    """
    started = time.perf_counter()
    n, layers = rig.size, model.num_layers
    if layers < n:
        raise SolverError(f"model has {layers} layers but rig {rig.name!r} has {n} ranks: every rank needs a layer")
    if not model.attention_layers:
        raise SolverError("the model has no layer whose KV grows with tokens, so no rank binds and the PP pool is "
                          "unbounded: there is no pool objective to trade against time")
    if isinstance(refused_limit, bool) or not isinstance(refused_limit, int) or refused_limit < 0:
        raise SolverError(f"refused_limit must be a whole number >= 0 (got {refused_limit!r})")
    if min_pool_ratio is not None and (isinstance(min_pool_ratio, bool) or not isinstance(min_pool_ratio, int | float)
                                       or not isfinite(min_pool_ratio) or min_pool_ratio < 0):
        # NaN compares false with everything, so it would silently keep every point.
        raise SolverError(f"min_pool_ratio must be a finite number >= 0, e.g. 0.9 (got {min_pool_ratio!r})")

    if isinstance(measured_cuts, str | bytes) or not isinstance(measured_cuts, Collection):
        raise SolverError(f"measured_cuts {measured_cuts!r}: expected a collection of cuts (layer counts per rank)")
    measured = frozenset(_composition(cut, layers, n, "measured cut") for cut in measured_cuts)
    if incumbent is None:
        incumbent, note = rig.incumbent_for(layers)
        notes = [note] if note else []
    else:
        incumbent, notes = _composition(incumbent, layers, n, "incumbent"), []
        if timing is not None and tuple(timing.incumbent) != incumbent:
            raise SolverError(f"the timing model's incumbent {list(timing.incumbent)} is not the incumbent "
                              f"{list(incumbent)}: speedups would be against a different cut")
    if timing is None:
        timing = default_timing(rig, incumbent, notes)
    elif len(timing.ms_per_layer) != n:
        raise SolverError(f"timing model has {len(timing.ms_per_layer)} ranks; rig {rig.name!r} has {n}")
    if any(ms < 0 for ms in timing.ms_per_layer):
        raise SolverError(f"timing ms_per_layer {list(timing.ms_per_layer)}: must be >= 0 on every rank")
    if not timing.fixed_measured:
        notes.append("fixed per-stage cost assumed 0 (unidentified from one cut): every speedup is an upper bound")

    pricer = CutPricer(model, rig, shape)
    head = report_cut(pricer, timing, incumbent, measured_cuts=measured)
    head = report_cut(pricer, timing, incumbent, head.pool_tokens, measured)  # its own ratio: 1.0 with a pool
    if not head.feasible:
        notes.append(f"incumbent {list(incumbent)} is refused: {'; '.join(head.reasons)}")

    search = CutSearch(pricer, timing.ms_per_layer, timing.fixed_ms)
    points = []
    for budget, pool in search.steps():
        point = report_cut(pricer, timing, search.representative(budget, pool), head.pool_tokens, measured)
        if (time_key(point.pipelined_ms), point.pool_tokens) != (budget, pool):  # search and pricer must agree
            raise AssertionError(f"cut {list(point.cut)} prices to {(point.pipelined_ms, point.pool_tokens)}, "
                                 f"the search expected {(budget, pool)}")
        points.append(point)
    if min_pool_ratio is not None:
        if head.pool_tokens is None:
            raise SolverError("min_pool_ratio is relative to the incumbent's pool, but the incumbent "
                              f"{list(incumbent)} is refused: {'; '.join(head.reasons)}")
        before = len(points)
        points = [point for point in points if point.pool_tokens >= min_pool_ratio * head.pool_tokens]
        notes.append(f"min_pool_ratio {min_pool_ratio}: kept {len(points)} of {before} frontier points "
                     f"(pool >= {min_pool_ratio} x {head.pool_tokens} tokens)")
    dominating = [point for point in points if point.dominates(head)] if head.feasible else []
    if dominating:
        notes.append(f"{len(dominating)} frontier cut(s) dominate the incumbent {list(incumbent)}")

    total = comb(layers - 1, n - 1)
    suffix = search.feasible_suffix()
    refused = []
    if refused_limit:
        for cut in search.refused_cuts(suffix):
            refused.append(RefusedCut(cut, pricer.price(cut).reasons))
            if len(refused) >= refused_limit:
                break
    refused_total = total - int(suffix[0][0])
    if refused_total > len(refused):
        notes.append(f"listing {len(refused)} of {refused_total} refused cuts (refused_limit {refused_limit})")
    return Frontier(
        model=model.name or model.model_type, rig=rig.name, incumbent=head, points=tuple(points),
        refused=tuple(refused), refused_total=refused_total, total_cuts=total, notes=tuple(notes),
        elapsed_s=time.perf_counter() - started,
    )

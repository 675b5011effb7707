"""Calibration coverage (docs/domain.md §6): what the measured cuts identify, and what to measure next.

A rank's ms per layer and fixed ms are the slope and intercept of its stage time against its layer
count. They are identified only when that count took at least two values across the samples: no
number of repeats of one cut separates them, so such a rank needs math.inf samples, never a big number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from solvers.errors import SolverError
from solvers.line_fit import fit_line


@dataclass(frozen=True)
class Sample:
    """One measured run: the cut it ran and the stage time of every rank, in ms."""

    cut: tuple[int, ...]
    stage_ms: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"cut": list(self.cut), "stage_ms": list(self.stage_ms)}


def parse_samples(samples: Iterable[Sample | tuple | dict]) -> tuple[Sample, ...]:
    """Samples as Sample, (cut, stage_ms) pairs or {"cut": ..., "stage_ms": ...}; all over one rig and model."""
    parsed: list[Sample] = []
    for i, item in enumerate(samples):
        if isinstance(item, dict):
            if set(item) != {"cut", "stage_ms"}:
                raise SolverError(f"sample {i}: expected fields cut and stage_ms (got {sorted(item)})")
            item = (item["cut"], item["stage_ms"])
        if isinstance(item, Sample):
            item = (item.cut, item.stage_ms)
        if not isinstance(item, Sequence) or len(item) != 2 or not all(isinstance(v, Sequence) for v in item):
            raise SolverError(f"sample {i}: expected (cut, stage_ms per rank), got {item!r}")
        cut, ms = item
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in cut):
            raise SolverError(f"sample {i}: cut {list(cut)} needs a positive whole number of layers per rank")
        if len(ms) != len(cut) or any(isinstance(v, bool) or not isinstance(v, int | float) for v in ms):
            raise SolverError(f"sample {i}: needs one stage time in ms per rank of cut {list(cut)} (got {list(ms)})")
        if any(not (0 < v < math.inf) for v in ms):
            raise SolverError(f"sample {i}: stage times {list(ms)} must be positive finite milliseconds")
        parsed.append(Sample(tuple(cut), tuple(float(v) for v in ms)))
    if not parsed:
        raise SolverError("calibration needs at least one measured sample (cut, stage_ms per rank)")
    first = parsed[0].cut
    for i, sample in enumerate(parsed):
        if len(sample.cut) != len(first) or sum(sample.cut) != sum(first):
            raise SolverError(f"sample {i}: cut {list(sample.cut)} is not a cut of the same rig and model as "
                              f"sample 0 {list(first)} (rank count and layer total must match)")
    return tuple(parsed)


def samples_needed(sd_ms: float, target: float, delta_layers: int, ms_per_layer: float) -> float | int:
    """N = (sqrt(2) x SD / (target x |Δlayers| x ms_per_layer))^2 per arm; math.inf when Δlayers is 0."""
    if not sd_ms >= 0 or not target > 0 or not ms_per_layer > 0:
        raise SolverError(f"samples_needed: need sd_ms >= 0, target > 0 and ms_per_layer > 0 (got sd_ms={sd_ms}, "
                          f"target={target}, ms_per_layer={ms_per_layer})")
    if delta_layers == 0:
        return math.inf  # the arms do not move the rank: no sample count resolves it
    n = (math.sqrt(2) * sd_ms / (target * abs(delta_layers) * ms_per_layer)) ** 2
    return max(1, math.ceil(n - 1e-9))  # at least one run per arm; the epsilon absorbs float noise


@dataclass(frozen=True)
class Intercept:
    """The fixed per-stage ms, published only when it is distinguishable from zero."""

    estimate: float | None
    standard_error: float | None
    dof: int
    refusal: str | None

    @property
    def published(self) -> bool:
        return self.refusal is None

    def to_dict(self) -> dict:
        # `value` is None when refused: a refused intercept must never read as a measured 0.
        return {"value": self.estimate if self.published else None, "estimate": self.estimate,
                "standard_error": self.standard_error, "dof": self.dof, "published": self.published,
                "refusal": self.refusal}


def publish_intercept(value: float | None, standard_error: float | None, dof: int) -> Intercept:
    """Gate: publish only with a standard error, N (residual dof) > 0 and |value| >= 2 SE; say what failed."""
    failed = []
    if value is None:
        failed.append("no estimate: the rank's layer count never changed, so the intercept is unidentified")
    if standard_error is None or not math.isfinite(standard_error):
        failed.append("no standard error")
    if dof <= 0:
        failed.append(f"N = {dof} residual degrees of freedom (need > 0: measure more runs than parameters)")
    if not failed and abs(value) < 2 * standard_error:
        failed.append(f"|value| {abs(value):.4g} ms < 2 SE = {2 * standard_error:.4g} ms: indistinguishable from 0")
    return Intercept(value, standard_error, dof, "; ".join(failed) or None)


@dataclass(frozen=True)
class Arm:
    cut: tuple[int, ...]
    rank: int
    delta_layers: int  # + the rank takes layers from the neighbour, - it gives them
    neighbour: int

    def to_dict(self) -> dict:
        return {"cut": list(self.cut), "rank": self.rank, "delta_layers": self.delta_layers,
                "neighbour": self.neighbour}


@dataclass(frozen=True)
class ArmPlan:
    incumbent: tuple[int, ...]
    rank: int
    step: int
    arms: tuple[Arm, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"incumbent": list(self.incumbent), "rank": self.rank, "step": self.step,
                "arms": [arm.to_dict() for arm in self.arms], "notes": list(self.notes)}


def suggest_arms(incumbent: Sequence[int], rank: int, step: int = 1) -> ArmPlan:
    """Calibration cuts moving `rank`'s layer count up and down by `step`, trading with each neighbour."""
    cut = tuple(incumbent)
    if not cut or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in cut):
        raise SolverError(f"incumbent {list(cut)}: every rank needs a positive whole number of layers")
    if len(cut) < 2:
        raise SolverError("a single-rank rig has no neighbour to trade layers with; its count can never change")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(cut):
        raise SolverError(f"rank {rank!r}: must be an index in 0..{len(cut) - 1}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise SolverError(f"step {step!r}: must be a positive whole number of layers")
    arms, notes = [], []
    for delta in (step, -step):  # both directions: a one-sided arm confounds the slope with drift
        found = False
        for neighbour in (rank - 1, rank + 1):
            if not 0 <= neighbour < len(cut):
                continue
            moved = list(cut)
            moved[rank] += delta
            moved[neighbour] -= delta
            if min(moved) >= 1:  # same total by construction; every rank keeps a layer
                arms.append(Arm(tuple(moved), rank, delta, neighbour))
                found = True
        if not found:
            verb = "take" if delta > 0 else "give"
            notes.append(f"rank {rank} cannot {verb} {step} layer(s) at {list(cut)} without leaving a rank empty; "
                         f"try a smaller step")
    return ArmPlan(cut, rank, step, tuple(arms), tuple(notes))


@dataclass(frozen=True)
class RankCoverage:
    rank: int
    identified: bool
    layer_counts: tuple[int, ...]  # the distinct counts measured
    samples: int
    delta_layers: int  # spread of the measured counts (max - min): 0 means unidentified
    ms_per_layer: float  # least-squares slope, or stage/layers (intercept assumed 0) when unidentified
    intercept: Intercept
    sd_ms: float | None  # the SD used for samples_needed: given, else the fit's residual SD
    samples_needed: float | int | None  # runs per arm at delta_layers; math.inf unidentified; None: no SD
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        needed = "inf" if self.samples_needed == math.inf else self.samples_needed  # JSON has no infinity
        return {"rank": self.rank, "identified": self.identified, "layer_counts": list(self.layer_counts),
                "samples": self.samples, "delta_layers": self.delta_layers, "ms_per_layer": self.ms_per_layer,
                "intercept": self.intercept.to_dict(), "sd_ms": self.sd_ms, "samples_needed": needed,
                "notes": list(self.notes)}


@dataclass(frozen=True)
class CalibrationWarning:
    """A rank the timing model cannot trust yet, with the measurement that fixes it."""

    rank: int
    problem: str  # "unidentified", "negative_ms_per_layer" or "negative_fixed_ms"
    message: str  # names the rank, what is wrong and the cut to measure

    def to_dict(self) -> dict:
        return {"rank": self.rank, "problem": self.problem, "message": self.message}


@dataclass(frozen=True)
class Coverage:
    samples: tuple[Sample, ...]
    target: float
    ranks: tuple[RankCoverage, ...]
    arms: tuple[ArmPlan, ...]  # proposals for every unidentified rank
    warnings: tuple[CalibrationWarning, ...] = ()

    @property
    def unidentified(self) -> tuple[int, ...]:
        return tuple(rank.rank for rank in self.ranks if not rank.identified)

    def to_dict(self) -> dict:
        return {"samples": len(self.samples), "cuts": [list(cut) for cut in sorted({s.cut for s in self.samples})],
                "target": self.target, "unidentified": list(self.unidentified),
                "ranks": [rank.to_dict() for rank in self.ranks], "arms": [plan.to_dict() for plan in self.arms],
                "warnings": [warning.to_dict() for warning in self.warnings]}


def coverage(samples: Iterable[Sample | tuple | dict], target: float = 0.05,
             sd_ms: float | Sequence[float] | None = None, incumbent: Sequence[int] | None = None,
             step: int = 1) -> Coverage:
    """Per-rank identification, fit and samples needed; arms for every unidentified rank.

    `sd_ms`: the A-vs-A SD of a stage time (one for all ranks or one per rank); without it the fit's
    residual SD is used. `incumbent` (default: the first sample's cut) is where arms start from.
    """
    parsed = parse_samples(samples)
    ranks = len(parsed[0].cut)
    if not target > 0:
        raise SolverError(f"target {target!r}: a relative precision must be positive, e.g. 0.05 for 5%")
    sds = [sd_ms] * ranks if sd_ms is None or isinstance(sd_ms, int | float) else list(sd_ms)
    if len(sds) != ranks or any(sd is not None and (isinstance(sd, bool) or not isinstance(sd, int | float)
                                                      or not sd >= 0) for sd in sds):
        raise SolverError(f"sd_ms {sd_ms!r}: give one non-negative SD in ms, or one per rank ({ranks})")
    report = []
    for i in range(ranks):
        xs, ys = [s.cut[i] for s in parsed], [s.stage_ms[i] for s in parsed]
        counts = tuple(sorted(set(xs)))
        notes: list[str] = []
        if len(counts) < 2:
            ms = sum(y / x for x, y in zip(xs, ys, strict=True)) / len(xs)
            report.append(RankCoverage(i, False, counts, len(xs), 0, ms, publish_intercept(None, None, 0),
                                       sds[i], math.inf, (f"layer count never changed ({counts[0]}): ms per layer "
                                                          f"assumes fixed ms = 0, an optimistic bound",)))
            continue
        fit = fit_line(xs, ys)
        slope, residual_sd = fit.slope, fit.residual_sd
        sd = sds[i] if sds[i] is not None else residual_sd
        needed: float | int | None = None
        if slope <= 0:
            notes.append(f"fitted ms per layer {slope:.4g} is not positive: too noisy for layer counts {list(counts)}")
        elif sd is None:
            notes.append("no SD: give sd_ms (A-vs-A spread) or measure more runs than two distinct cuts")
        else:
            needed = samples_needed(sd, target, counts[-1] - counts[0], slope)
        intercept = publish_intercept(fit.intercept, fit.intercept_se, fit.dof)
        report.append(RankCoverage(i, True, counts, len(xs), counts[-1] - counts[0], slope, intercept, sd, needed,
                                   tuple(notes)))
    start = tuple(incumbent) if incumbent is not None else parsed[0].cut
    if len(start) != ranks or sum(start) != sum(parsed[0].cut):
        raise SolverError(f"incumbent {list(start)} is not a cut of the sampled rig and model "
                          f"({ranks} ranks, {sum(parsed[0].cut)} layers)")
    arms = tuple(suggest_arms(start, r.rank, step) for r in report if not r.identified and ranks > 1)
    return Coverage(parsed, float(target), tuple(report), arms,
                    tuple(warning for r in report for warning in _warnings(r, start, step)))


def _warnings(rank: RankCoverage, start: tuple[int, ...], step: int) -> list[CalibrationWarning]:
    """An unidentified rank, or a fit no stage can have (negative ms per layer or fixed cost)."""
    i, counts = rank.rank, list(rank.layer_counts)
    if not rank.identified:
        if len(start) < 2:
            return [CalibrationWarning(i, "unidentified", f"rank {i}: ms/layer cannot be identified on a one-rank rig "
                                                          "(its layer count can never change): it stays the optimistic "
                                                          "stage ms / layers bound")]
        return [CalibrationWarning(i, "unidentified", f"rank {i}: ms/layer cannot be identified: its layer count "
                                                      f"never changed ({counts[0]} in every sample); measure a cut "
                                                      f"that moves rank {i}{_examples(start, i, step)}")]
    # A wider spread of layer counts resolves the slope against the same noise.
    further = f"measure a cut that moves rank {i} further than {rank.delta_layers} layer(s)" + _examples(
        start, i, 2 * rank.delta_layers)
    found = []
    if rank.ms_per_layer <= 0:
        found.append(CalibrationWarning(i, "negative_ms_per_layer", (
            f"rank {i}: fitted ms/layer {rank.ms_per_layer:.4g} is not positive (layer counts {counts}): the "
            f"samples are noisier than that spread resolves; {further}")))
    estimate = rank.intercept.estimate
    if estimate is not None and estimate < 0:
        found.append(CalibrationWarning(i, "negative_fixed_ms", (
            f"rank {i}: fitted fixed cost {estimate:.4g} ms per stage is negative (no stage takes less than no "
            f"time): the samples at layer counts {counts} do not support it; {further}")))
    return found


def _examples(start: tuple[int, ...], rank: int, step: int) -> str:
    cuts = [list(arm.cut) for arm in suggest_arms(start, rank, step).arms]
    return f", e.g. {' or '.join(str(cut) for cut in cuts)}" if cuts else ""

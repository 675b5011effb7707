"""The timing model fitted across measured layouts (docs/domain.md §6), with its uncertainty.

Each measured layout is a Sample (calibration.py): a cut and every rank's median stage ms. Per rank
the stage time is fitted against the layer count (line_fit.py); the slope is ms per layer, and the
intercept becomes the fixed per-stage cost only when calibration.publish_intercept publishes it. The
noise floor is measured from repeats of one layout when there are enough, else the rig's is used.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from solvers.calibration import Sample, parse_samples, publish_intercept
from solvers.errors import SolverError
from solvers.line_fit import fit_line
from solvers.timing import TimingModel

NOISE_MIN_REPEATS = 5
_BELOW_ONE = math.nextafter(1.0, 0.0)  # a noise floor is a fraction in [0, 1)


def _most_repeated(parsed: Sequence[Sample]) -> tuple[tuple[int, ...], list[float]]:
    """The cut with the most samples (ties: first in sample order) and its pipelined ms, one per sample."""
    by_cut: dict[tuple[int, ...], list[float]] = {}  # insertion order is sample order
    for sample in parsed:
        by_cut.setdefault(sample.cut, []).append(max(sample.stage_ms))
    return max(by_cut.items(), key=lambda item: len(item[1]))  # max keeps the first of equals


def measured_noise_floor(samples: Iterable[Sample | tuple | dict], min_repeats: int = NOISE_MIN_REPEATS
                         ) -> tuple[float, tuple[int, ...], int] | None:
    """A-vs-A spread of the pipelined time at the most repeated cut: 2 x SD / mean, or None below min_repeats."""
    if isinstance(min_repeats, bool) or not isinstance(min_repeats, int) or min_repeats < 2:
        raise SolverError(f"min_repeats {min_repeats!r}: must be a whole number >= 2 (an SD needs two samples)")
    cut, pipelined = _most_repeated(parse_samples(samples))
    if len(pipelined) < min_repeats:
        return None
    floor = 2 * statistics.stdev(pipelined) / statistics.fmean(pipelined)
    return min(floor, _BELOW_ONE), cut, len(pipelined)


@dataclass(frozen=True)
class TimingFit:
    model: TimingModel  # incumbent: the running cut given to fit_timing; noise_floor: the one used
    ms_per_layer_se: tuple[float | None, ...]  # None: unidentified, fallen back, or no residual dof
    fixed_ms_se: tuple[float | None, ...]  # None unless the rank's intercept is the model's fixed ms
    identified: tuple[bool, ...]
    samples: int
    noise_floor_source: str  # "measured" or "rig"
    noise_floor_samples: int  # 0 when the rig's floor is used
    notes: tuple[str, ...]
    slope_intercept_cov: tuple[float | None, ...]  # Cov(ms/layer, fixed ms) where fixed_ms_se is given

    @property
    def fixed_published(self) -> tuple[bool, ...]:
        return tuple(se is not None for se in self.fixed_ms_se)

    def _cut(self, cut: Sequence[int]) -> tuple[int, ...]:
        cut, incumbent = tuple(cut), self.model.incumbent
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in cut) or (
                len(cut) != len(incumbent) or sum(cut) != sum(incumbent)):
            raise SolverError(f"cut {list(cut)}: expected {len(incumbent)} positive layer counts summing to "
                              f"{sum(incumbent)}, as the incumbent {list(incumbent)}")
        return cut

    def stage_se(self, cut: Sequence[int]) -> tuple[float, ...]:
        """SE of each predicted stage ms: Var(L m + b) = L² Var m + Var b + 2 L Cov(m, b); 0.0 where unknown."""
        errors = []
        for layers, slope_se, fixed_se, cov in zip(self._cut(cut), self.ms_per_layer_se, self.fixed_ms_se,
                                                   self.slope_intercept_cov, strict=True):
            if slope_se is None:
                errors.append(0.0)
                continue
            variance = (layers * slope_se) ** 2
            if fixed_se is not None:
                variance += fixed_se**2 + 2 * layers * cov
            errors.append(math.sqrt(max(variance, 0.0)))  # float rounding can dip a true 0 below it
        return tuple(errors)

    def _binding(self, cut: tuple[int, ...]) -> tuple[float, float]:
        stages, errors = self.model.stage_ms(cut), self.stage_se(cut)
        rank = stages.index(max(stages))
        return stages[rank], errors[rank]

    def speedup_interval(self, cut: Sequence[int]) -> tuple[float, float]:
        """x_pipelined low/high: the incumbent's and the cut's binding stages each moved by 2 SE, the worst way."""
        incumbent_ms, incumbent_se = self._binding(self.model.incumbent)
        cut_ms, cut_se = self._binding(self._cut(cut))
        low = max(incumbent_ms - 2 * incumbent_se, 0.0) / (cut_ms + 2 * cut_se)
        high = (incumbent_ms + 2 * incumbent_se) / (cut_ms - 2 * cut_se) if cut_ms > 2 * cut_se else math.inf
        return low, high

    def to_dict(self) -> dict:
        model = self.model
        ranks = [{"rank": i, "identified": self.identified[i], "ms_per_layer": model.ms_per_layer[i],
                  "ms_per_layer_se": self.ms_per_layer_se[i], "fixed_ms": model.fixed_ms[i],
                  "fixed_ms_se": self.fixed_ms_se[i], "fixed_published": self.fixed_published[i]}
                 for i in range(len(model.ms_per_layer))]
        return {"incumbent": list(model.incumbent), "fixed_measured": model.fixed_measured, "ranks": ranks,
                "noise_floor": model.noise_floor, "noise_floor_source": self.noise_floor_source,
                "noise_floor_samples": self.noise_floor_samples, "samples": self.samples, "notes": list(self.notes)}


@dataclass(frozen=True)
class _RankFit:
    identified: bool
    ms_per_layer: float
    ms_per_layer_se: float | None
    fixed_ms: float
    fixed_ms_se: float | None
    cov: float | None


def _fit_rank(rank: int, xs: list[int], ys: list[float], notes: list[str]) -> _RankFit:
    counts = sorted(set(xs))
    ratio = statistics.fmean(y / x for x, y in zip(xs, ys, strict=True))  # the one-cut estimate, fixed ms 0
    if len(counts) < 2:
        notes.append(f"rank {rank}: layer count never changed ({counts[0]} in every sample), so ms/layer is "
                     "unidentified: using mean stage ms / layers with fixed ms 0 (optimistic)")
        return _RankFit(False, ratio, None, 0.0, None, None)
    fit = fit_line(xs, ys)
    if fit.slope <= 0:
        notes.append(f"rank {rank}: fitted ms/layer {fit.slope:.4g} is not positive over layer counts {counts} "
                     "(noisier than that spread resolves): using mean stage ms / layers with fixed ms 0")
        return _RankFit(True, ratio, None, 0.0, None, None)
    intercept = publish_intercept(fit.intercept, fit.intercept_se, fit.dof)
    if not intercept.published:
        notes.append(f"rank {rank}: fixed ms not published ({intercept.refusal}): assumed 0 (optimistic)")
    elif fit.intercept < 0:
        # Published but impossible: no stage takes less than no time, so the line does not extrapolate.
        notes.append(f"rank {rank}: fitted fixed ms {fit.intercept:.4g} is negative (no stage takes less than no "
                     f"time at layer counts {counts}): assumed 0")
    else:
        return _RankFit(True, fit.slope, fit.slope_se, fit.intercept, fit.intercept_se, fit.covariance)
    return _RankFit(True, fit.slope, fit.slope_se, 0.0, None, None)


def fit_timing(samples: Iterable[Sample | tuple | dict], incumbent: Sequence[int],
               rig_noise_floor: float) -> TimingFit:
    """The timing model fitted across measured layouts, its SEs and noise floor; `incumbent` is the running cut."""
    parsed = parse_samples(samples)
    ranks, layers = len(parsed[0].cut), sum(parsed[0].cut)
    start = tuple(incumbent) if isinstance(incumbent, Sequence) and not isinstance(incumbent, str) else None
    if start is None or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in start):
        raise SolverError(f"incumbent {incumbent!r}: expected a positive whole number of layers per rank")
    if len(start) != ranks or sum(start) != layers:
        raise SolverError(f"incumbent {list(start)} is not a cut of the sampled rig and model "
                          f"({ranks} ranks, {layers} layers)")
    if isinstance(rig_noise_floor, bool) or not isinstance(rig_noise_floor, int | float) or (
            not 0 <= rig_noise_floor < 1):
        raise SolverError(f"rig_noise_floor must be a fraction in [0, 1), e.g. 0.141 (got {rig_noise_floor!r})")
    notes: list[str] = []
    fits = [_fit_rank(i, [s.cut[i] for s in parsed], [s.stage_ms[i] for s in parsed], notes) for i in range(ranks)]
    measured = measured_noise_floor(parsed)
    if measured is not None:
        floor, cut, repeats = measured
        source = "measured"
        notes.append(f"noise floor {floor:.1%} measured: 2 SD / mean of the pipelined ms over {repeats} samples of "
                     f"cut {list(cut)}")
    else:
        cut, pipelined = _most_repeated(parsed)
        floor, source, repeats = float(rig_noise_floor), "rig", 0
        notes.append(f"noise floor {floor:.1%} from the rig: the most repeated cut {list(cut)} has {len(pipelined)} "
                     f"sample(s), {NOISE_MIN_REPEATS} are needed to measure it")
    model = TimingModel(start, tuple(f.ms_per_layer for f in fits), tuple(f.fixed_ms for f in fits),
                        fixed_measured=all(f.fixed_ms_se is not None for f in fits), noise_floor=floor)
    return TimingFit(model=model, ms_per_layer_se=tuple(f.ms_per_layer_se for f in fits),
                     fixed_ms_se=tuple(f.fixed_ms_se for f in fits), identified=tuple(f.identified for f in fits),
                     samples=len(parsed), noise_floor_source=source, noise_floor_samples=repeats,
                     notes=tuple(notes), slope_intercept_cov=tuple(f.cov for f in fits))

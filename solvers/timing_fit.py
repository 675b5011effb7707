"""The timing model fitted across measured layouts (docs/domain.md §6), with its uncertainty.

Each measured layout is a Sample (calibration.py): a cut and every rank's median stage ms. Per rank the stage time
is `layers x ms/layer + fixed ms` with both terms non-negative, fitted by least squares under that constraint:
the unconstrained line (line_fit.fit_line) when its intercept is >= 0, else the line through the origin
(fit_origin), which is the constrained optimum when the intercept bound is active. The intercept counts as a
measured fixed cost (`fixed_published`) only when calibration.publish_intercept publishes it; an unpublished
non-negative intercept still shapes the line, so a prediction never contradicts the samples it was fitted to.
A rank whose layer count never changed is priced proportionally (fixed ms 0) and its stage interval spans every
line through its measured point with a fixed cost in [0, stage]: wide, but finite.

Every measured layout is checked against the fit: its predicted pipelined ms must lie within the layout's own
measured spread (the range of its samples, widened to the noise floor); a layout outside is named, with its
binding rank's residual, in `unexplained`. The noise floor is measured from repeats of one layout when there are
enough, else the rig's is used.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from solvers.calibration import Sample, parse_samples, publish_intercept
from solvers.errors import SolverError
from solvers.line_fit import fit_line, fit_origin
from solvers.timing import TimingModel

__all__ = ["NOISE_MIN_REPEATS", "LayoutCheck", "RankFit", "TimingFit", "fit_timing", "measured_noise_floor",
           "measured_pipelined_ms", "samples_by_layout"]

NOISE_MIN_REPEATS = 5
_BELOW_ONE = math.nextafter(1.0, 0.0)  # a noise floor is a fraction in [0, 1)
LINE, ORIGIN, PROPORTIONAL = "line", "origin", "proportional"


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


def samples_by_layout(parsed: Sequence[Sample]) -> dict[tuple[int, ...], list[Sample]]:
    """The samples of each measured cut, in first-seen order."""
    by_cut: dict[tuple[int, ...], list[Sample]] = {}
    for sample in parsed:
        by_cut.setdefault(sample.cut, []).append(sample)
    return by_cut


def measured_pipelined_ms(samples: Sequence[Sample]) -> float:
    """A layout's measured pipelined ms: the largest of its ranks' mean stage ms (what the model predicts)."""
    ranks = len(samples[0].stage_ms)
    return max(statistics.fmean(s.stage_ms[r] for s in samples) for r in range(ranks))


@dataclass(frozen=True)
class RankFit:
    """One rank's fitted stage time: `layers x ms_per_layer + fixed_ms`, and what bounds it."""

    identified: bool  # its layer count took at least two values
    method: str  # "line" (intercept >= 0), "origin" (intercept held at 0) or "proportional" (unidentified)
    ms_per_layer: float
    ms_per_layer_se: float | None  # None without residual dof
    fixed_ms: float
    fixed_ms_se: float | None  # None unless the intercept was fitted with residual dof
    fixed_published: bool  # distinguishable from 0 (calibration.publish_intercept)
    cov: float | None  # Cov(ms/layer, fixed ms) where both were fitted with residual dof
    anchors: tuple[tuple[int, float], ...]  # (layer count, mean stage ms) as measured

    def stage_ms(self, layers: int) -> float:
        return layers * self.ms_per_layer + self.fixed_ms

    def stage_se(self, layers: int) -> float | None:
        """Var(L m + b) = L² Var m + Var b + 2 L Cov(m, b); None where the fit gives no SE."""
        if self.ms_per_layer_se is None:
            return None
        variance = (layers * self.ms_per_layer_se) ** 2
        if self.fixed_ms_se is not None and self.cov is not None:
            variance += self.fixed_ms_se**2 + 2 * layers * self.cov
        return math.sqrt(max(variance, 0.0))  # float rounding can dip a true 0 below it

    def _extrapolation_band(self, layers: int) -> tuple[float, float]:
        """From the nearest measured count L0 (stage y0), every line with fixed ms in [0, y0] gives, at `layers`, a
        stage between y0 (all fixed) and y0 x layers / L0 (no fixed): what the samples alone guarantee."""
        count, stage = min(self.anchors, key=lambda anchor: (abs(anchor[0] - layers), anchor[0]))
        ends = (stage, stage * layers / count)
        return min(ends), max(ends)

    def stage_interval(self, layers: int) -> tuple[float, float]:
        """The stage ms at `layers`, low and high: ±2 SE where the fit has one, else the extrapolation band; the low
        end is always positive, so every speedup bound is a finite number."""
        stage = self.stage_ms(layers)
        band_low, band_high = self._extrapolation_band(layers)
        se = self.stage_se(layers) if self.identified else None
        if se is None:
            return min(stage, band_low), max(stage, band_high)
        low = stage - 2 * se
        return (low if low > 0 else min(stage, band_low)), stage + 2 * se


@dataclass(frozen=True)
class LayoutCheck:
    """A measured layout against the fit: is the prediction inside the layout's own measured spread?"""

    cut: tuple[int, ...]
    samples: int
    measured_ms: float  # the largest of the ranks' mean stage ms
    low_ms: float  # the spread: the samples' pipelined ms, widened to ± noise floor x measured
    high_ms: float
    predicted_ms: float
    binding_rank: int  # the rank that binds in the prediction
    reason: str | None  # None: explained

    @property
    def explained(self) -> bool:
        return self.reason is None

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1

    def to_dict(self) -> dict:
        return {"cut": list(self.cut), "samples": self.samples, "measured_ms": self.measured_ms,
                "low_ms": self.low_ms, "high_ms": self.high_ms, "predicted_ms": self.predicted_ms,
                "error": self.error, "binding_rank": self.binding_rank, "explained": self.explained,
                "reason": self.reason}


@dataclass(frozen=True)
class TimingFit:
    model: TimingModel  # incumbent: the running cut given to fit_timing; noise_floor: the one used
    ranks: tuple[RankFit, ...]
    samples: int
    noise_floor_source: str  # "measured" or "rig"
    noise_floor_samples: int  # 0 when the rig's floor is used
    notes: tuple[str, ...]
    layouts: tuple[LayoutCheck, ...]  # every measured layout against the fit, in first-seen order

    @property
    def identified(self) -> tuple[bool, ...]:
        return tuple(rank.identified for rank in self.ranks)

    @property
    def ms_per_layer_se(self) -> tuple[float | None, ...]:
        return tuple(rank.ms_per_layer_se for rank in self.ranks)

    @property
    def fixed_ms_se(self) -> tuple[float | None, ...]:
        return tuple(rank.fixed_ms_se for rank in self.ranks)

    @property
    def fixed_published(self) -> tuple[bool, ...]:
        return tuple(rank.fixed_published for rank in self.ranks)

    @property
    def unexplained(self) -> tuple[LayoutCheck, ...]:
        return tuple(layout for layout in self.layouts if not layout.explained)

    def _cut(self, cut: Sequence[int]) -> tuple[int, ...]:
        cut, incumbent = tuple(cut), self.model.incumbent
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in cut) or (
                len(cut) != len(incumbent) or sum(cut) != sum(incumbent)):
            raise SolverError(f"cut {list(cut)}: expected {len(incumbent)} positive layer counts summing to "
                              f"{sum(incumbent)}, as the incumbent {list(incumbent)}")
        return cut

    def stage_se(self, cut: Sequence[int]) -> tuple[float, ...]:
        """SE of each predicted stage ms; 0.0 where the fit gives none (stage_interval bounds those ranks)."""
        return tuple(rank.stage_se(layers) or 0.0 for rank, layers in zip(self.ranks, self._cut(cut), strict=True))

    def pipelined_interval(self, cut: Sequence[int]) -> tuple[float, float]:
        """The pipelined ms at `cut`, low and high: the largest of the ranks' low and high stage ms."""
        bounds = [rank.stage_interval(layers) for rank, layers in zip(self.ranks, self._cut(cut), strict=True)]
        return max(low for low, _ in bounds), max(high for _, high in bounds)

    def speedup_interval(self, cut: Sequence[int]) -> tuple[float, float]:
        """x_pipelined low/high, always finite: the incumbent's and the cut's pipelined ms moved apart the worst
        way, each by 2 SE, or across its extrapolation band where a rank has no SE."""
        incumbent_low, incumbent_high = self.pipelined_interval(self.model.incumbent)
        cut_low, cut_high = self.pipelined_interval(cut)
        return incumbent_low / cut_high, incumbent_high / cut_low

    def to_dict(self) -> dict:
        model = self.model
        ranks = [{"rank": i, "identified": rank.identified, "method": rank.method, "ms_per_layer": rank.ms_per_layer,
                  "ms_per_layer_se": rank.ms_per_layer_se, "fixed_ms": rank.fixed_ms, "fixed_ms_se": rank.fixed_ms_se,
                  "fixed_published": rank.fixed_published} for i, rank in enumerate(self.ranks)]
        return {"incumbent": list(model.incumbent), "fixed_measured": model.fixed_measured, "ranks": ranks,
                "noise_floor": model.noise_floor, "noise_floor_source": self.noise_floor_source,
                "noise_floor_samples": self.noise_floor_samples, "samples": self.samples, "notes": list(self.notes),
                "layouts": [layout.to_dict() for layout in self.layouts],
                "unexplained": [list(layout.cut) for layout in self.unexplained]}


def _anchors(xs: list[int], ys: list[float]) -> tuple[tuple[int, float], ...]:
    by_count: dict[int, list[float]] = {}
    for x, y in zip(xs, ys, strict=True):
        by_count.setdefault(x, []).append(y)
    return tuple((count, statistics.fmean(values)) for count, values in sorted(by_count.items()))


def _fit_rank(rank: int, xs: list[int], ys: list[float], notes: list[str]) -> RankFit:
    counts, anchors = sorted(set(xs)), _anchors(xs, ys)
    if len(counts) < 2:
        notes.append(f"rank {rank}: layer count never changed ({counts[0]} in every sample), so ms/layer is "
                     "unidentified: priced as mean stage ms / layers (fixed ms 0), its interval spanning every fixed "
                     "cost from 0 to the whole stage")
        origin = fit_origin(xs, ys)
        return RankFit(False, PROPORTIONAL, origin.slope, None, 0.0, None, False, None, anchors)
    fit = fit_line(xs, ys)
    intercept = publish_intercept(fit.intercept, fit.intercept_se, fit.dof)
    if fit.slope > 0 and fit.intercept >= 0:
        if not intercept.published:
            notes.append(f"rank {rank}: fixed ms {fit.intercept:.4g} not published ({intercept.refusal}): kept in "
                         "the fitted line, not claimed as measured")
        return RankFit(True, LINE, fit.slope, fit.slope_se, fit.intercept, fit.intercept_se, intercept.published,
                       fit.covariance, anchors)
    origin = fit_origin(xs, ys)
    if fit.slope <= 0:
        why = (f"fitted ms/layer {fit.slope:.4g} is not positive over layer counts {counts} (noisier than that "
               "spread resolves)")
    else:
        why = (f"fitted fixed ms {fit.intercept:.4g} is negative (no stage takes less than no time at layer counts "
               f"{counts})")
    notes.append(f"rank {rank}: {why}: refitted through the origin (fixed ms 0, the least-squares line with a "
                 f"non-negative fixed cost), {origin.slope:.4g} ms/layer")
    return RankFit(True, ORIGIN, origin.slope, origin.slope_se, 0.0, None, False, None, anchors)


def _check_layouts(parsed: Sequence[Sample], model: TimingModel) -> tuple[LayoutCheck, ...]:
    checks = []
    for cut, samples in samples_by_layout(parsed).items():
        measured = measured_pipelined_ms(samples)
        pipelined = [max(s.stage_ms) for s in samples]
        low = min(min(pipelined), measured * (1 - model.noise_floor))
        high = max(max(pipelined), measured * (1 + model.noise_floor))
        stages = model.stage_ms(cut)
        predicted = max(stages)
        binding = stages.index(predicted)
        reason = None
        if not low <= predicted <= high:
            worst = max(range(len(cut)), key=lambda r: abs(
                stages[r] - statistics.fmean(s.stage_ms[r] for s in samples)))
            rank_measured = statistics.fmean(s.stage_ms[worst] for s in samples)
            reason = (f"predicted {predicted:.4g} ms is outside the measured {low:.4g}-{high:.4g} ms over "
                      f"{len(samples)} sample(s): rank {worst} at {cut[worst]} layers measured {rank_measured:.4g} ms, "
                      f"the fit gives {stages[worst]:.4g} ms ({stages[worst] / rank_measured - 1:+.0%}); its stage "
                      "time is not linear in its layer count across these layouts (another load, or layers of "
                      "another cost moved)")
        checks.append(LayoutCheck(cut, len(samples), measured, low, high, predicted, binding, reason))
    return tuple(checks)


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
    fits = tuple(_fit_rank(i, [s.cut[i] for s in parsed], [s.stage_ms[i] for s in parsed], notes)
                 for i in range(ranks))
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
                        fixed_measured=all(f.fixed_published for f in fits), noise_floor=floor)
    layouts = _check_layouts(parsed, model)
    notes.extend(f"layout {list(layout.cut)} unexplained: {layout.reason}" for layout in layouts if layout.reason)
    return TimingFit(model=model, ranks=fits, samples=len(parsed), noise_floor_source=source,
                     noise_floor_samples=repeats, notes=tuple(notes), layouts=layouts)

"""The exact search behind the frontier (docs/domain.md §7): no enumeration of the C(L-1, n-1) cuts.

For a time budget T, f(T) = max over cuts whose every stage fits T of min_i allowed_i: a max-min
dynamic program over ranks, O(L^2) per rank in numpy. f is a monotone step function of T, T only
matters at the finitely many stage times k * ms_i + fixed_i, and the frontier is exactly where f
steps up; divide and conquer on the sorted candidates finds every step with O(steps x log) DPs.
A cut is feasible exactly when every rank's allowed tokens reach max_model_len (a refused rank
reads REFUSED = -1, a rank without attention NO_BIND), so "pool >= max_model_len" is the same test
`CutPricer.price` applies, and counting DPs over that test give the refused total exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from math import comb

import numpy as np

from solvers.capacity import CutPricer

NEG = -2  # below REFUSED (-1): a (start, stop) the rank can never take in any cut
# Times are compared at 1e-9 ms: 8 x 7.7 and 14 x 4.4 are one time, not two points 1e-14 ms apart.
TIME_DECIMALS = 9


def time_key(ms: float) -> float:
    """The time the frontier compares: float noise from calibration is not a speedup."""
    return float(np.round(ms, TIME_DECIMALS))


class CutSearch:
    """Per-rank allowed-token matrices A[rank][start, stop], built once from the pricer."""

    def __init__(self, pricer: CutPricer, ms_per_layer: Sequence[float], fixed_ms: Sequence[float]):
        self.n, self.L = pricer.rig.size, pricer.model.num_layers
        self.min_pool = pricer.shape.max_model_len
        n, L = self.n, self.L
        size = L + 1
        index = np.arange(size)
        self.span = index[None, :] - index[:, None]  # layers in [start, stop): stop - start
        self.allowed: list[np.ndarray] = []
        for rank in range(n):
            matrix = np.full((size, size), NEG, dtype=np.int64)
            # Every rank before and after this one needs at least one layer.
            starts = [0] if rank == 0 else range(rank, L - (n - rank) + 1)
            for start in starts:
                stops = [L] if rank == n - 1 else range(start + 1, L - (n - 1 - rank) + 1)
                matrix[start, stops] = [pricer.allowed_tokens(rank, start, stop) for stop in stops]
            self.allowed.append(matrix)
        # Stage time of d layers on each rank; the same float operations as TimingModel.stage_ms.
        counts = np.arange(size, dtype=np.float64)
        self.stage = [counts * float(ms) + float(fixed) for ms, fixed in zip(ms_per_layer, fixed_ms, strict=True)]
        self.stage_matrix = [stage[np.clip(self.span, 0, L)] for stage in self.stage]
        self.stage_key = [np.round(stage, TIME_DECIMALS) for stage in self.stage]
        most = L - n + 1  # the most layers one rank can hold
        self.candidates = np.unique(np.concatenate([key[1:most + 1] for key in self.stage_key]))
        self.fits = [matrix >= self.min_pool for matrix in self.allowed]

    # --- the max-min DP --------------------------------------------------------------------
    def caps(self, budget: float) -> list[int]:
        """The most layers each rank can take within stage time `budget` (stage times rise with d)."""
        return [int(np.searchsorted(key[1:], budget, side="right")) for key in self.stage_key]

    def best_pool(self, budget: float) -> int:
        """f(budget): the largest min-over-ranks allowed tokens of any cut whose stages fit `budget`."""
        caps, L = self.caps(budget), self.L
        best = np.where(self.span[0] <= caps[0], self.allowed[0][0], NEG)
        for rank in range(1, self.n):
            if rank == self.n - 1:  # only stop = L matters on the last rank
                column = np.where(self.span[:, L] <= caps[rank], self.allowed[rank][:, L], NEG)
                return int(np.minimum(best, column).max())
            masked = np.where(self.span <= caps[rank], self.allowed[rank], NEG)
            best = np.minimum(best[:, None], masked).max(axis=0)
        return int(best[L])

    def steps(self) -> list[tuple[float, int]]:
        """Every (T, f(T)) where f steps up above the feasibility line: the exact Pareto pairs."""
        floor = self.min_pool - 1  # anything below max_model_len is infeasible: one flat level
        cache: dict[int, int] = {-1: floor}

        def value(i: int) -> int:
            if i not in cache:
                cache[i] = max(floor, self.best_pool(float(self.candidates[i])))
            return cache[i]

        found: list[tuple[float, int]] = []
        pending = [(-1, len(self.candidates) - 1)]
        while pending:  # f is monotone: an interval with equal ends holds no step
            lo, hi = pending.pop()
            if value(lo) == value(hi):
                continue
            if hi == lo + 1:
                found.append((float(self.candidates[hi]), value(hi)))
                continue
            mid = (lo + hi) // 2
            pending += [(lo, mid), (mid, hi)]
        return sorted(found)

    def representative(self, budget: float, pool: int) -> tuple[int, ...]:
        """The cut of least serial time among those with every stage <= budget and pool >= `pool`."""
        caps, n, L = self.caps(budget), self.n, self.L
        ok = (self.span[0] <= caps[0]) & (self.allowed[0][0] >= pool)
        cost = np.where(ok, self.stage_matrix[0][0], np.inf)
        back = []
        for rank in range(1, n):
            ok = (self.span <= caps[rank]) & (self.allowed[rank] >= pool)
            total = np.where(ok, cost[:, None] + self.stage_matrix[rank], np.inf)
            choice = total.argmin(axis=0)
            cost = total[choice, np.arange(L + 1)]
            back.append(choice)
        if not np.isfinite(cost[L]):
            raise AssertionError(f"no cut reaches pool {pool} within {budget} ms: the step search is inconsistent")
        cut, stop = [], L
        for choice in reversed(back):
            start = int(choice[stop])
            cut.append(stop - start)
            stop = start
        cut.append(stop)
        return tuple(reversed(cut))

    # --- counting and the refused list --------------------------------------------------------
    def _dtype(self) -> type:
        # Counts reach C(L-1, n-1); fall back to Python integers where int64 would overflow.
        return np.int64 if comb(self.L - 1, self.n - 1) < 2**62 else object

    def feasible_suffix(self) -> list[np.ndarray]:
        """suffix[rank][start]: feasible ways to finish the cut from rank `rank` starting at layer `start`."""
        dtype, L = self._dtype(), self.L
        suffix = [np.zeros(L + 1, dtype=dtype) for _ in range(self.n)]
        suffix[-1] = self.fits[-1][:, L].astype(dtype)
        for rank in range(self.n - 2, -1, -1):
            suffix[rank] = self.fits[rank].astype(dtype) @ suffix[rank + 1]
        return suffix

    def refused_cuts(self, suffix: list[np.ndarray]) -> Iterator[tuple[int, ...]]:
        """Refused cuts in lexicographic order, visiting only subtrees that hold one (output-sensitive)."""
        n, L = self.n, self.L

        def every(rank: int, start: int, prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
            if rank == n - 1:
                yield (*prefix, L - start)
                return
            for stop in range(start + 1, L - (n - 1 - rank) + 1):
                yield from every(rank + 1, stop, (*prefix, stop - start))

        def walk(rank: int, start: int, prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
            if rank == n - 1:
                if not self.fits[rank][start, L]:
                    yield (*prefix, L - start)
                return
            for stop in range(start + 1, L - (n - 1 - rank) + 1):
                cut = (*prefix, stop - start)
                if not self.fits[rank][start, stop]:
                    yield from every(rank + 1, stop, cut)
                elif suffix[rank + 1][stop] < comb(L - stop - 1, n - rank - 2):
                    yield from walk(rank + 1, stop, cut)

        yield from walk(0, 0, ())

"""Arena and layout ladder (docs/domain.md §9): rungs are cuts one engine switches between at run time.

Each rank's arena is sized for its deepest rung, so every rung holds the same resident bytes there
and the arena costs pool on every rung; capacity does the budget chain with arena_bytes = the part
of the arena a rung leaves unused. A switch refills the whole arena image over the host link, so
its cost does not depend on where the engine is coming from: rungs are destinations, not stations.
`decide` is a decision function, not an actuator: it returns moves, it makes none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from contracts.layout import ServingShape
from solvers.capacity import CutPricer, PoolResult, check_cut
from solvers.census import ModelCensus
from solvers.errors import SolverError
from solvers.rig import Rig
from solvers.timing import TimingModel, calibrate


@dataclass(frozen=True)
class Rung:
    cut: tuple[int, ...]
    resident_bytes: tuple[int, ...]  # weights + state slots of the rank's range at this rung
    pool: PoolResult  # priced with the unused arena as arena_bytes
    pipelined_ms: float

    @property
    def pool_tokens(self) -> int | None:
        return self.pool.pool_tokens

    def to_dict(self) -> dict:
        return {"cut": list(self.cut), "attention_split": list(self.pool.attention_split),
                "resident_bytes": list(self.resident_bytes), "pool_tokens": self.pool_tokens,
                "binding_rank": self.pool.binding_rank, "feasible": self.pool.feasible,
                "reasons": list(self.pool.reasons), "pipelined_ms": round(self.pipelined_ms, 6)}


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[Rung, ...]
    pinned_bytes: tuple[int, ...]  # per rank: deepest rung's weights + deepest rung's state slots
    image_bytes: tuple[int, ...]  # per rank: the arena's weights image copied host->device on a switch
    h2d_bytes_per_s: tuple[float, ...]

    def rung(self, cut: Sequence[int]) -> Rung:
        for rung in self.rungs:
            if rung.cut == tuple(cut):
                return rung
        raise SolverError(f"cut {list(cut)} is not a rung of this ladder; rungs: {[list(r.cut) for r in self.rungs]}")

    def to_dict(self) -> dict:
        return {"pinned_bytes": list(self.pinned_bytes), "image_bytes": list(self.image_bytes),
                "switch_s_per_rank": [round(b / r, 6) for b, r in zip(self.image_bytes, self.h2d_bytes_per_s,
                                                                      strict=True)],
                "switch_cost_s": round(switch_cost_s(self, self.rungs[0].cut), 6),
                "rungs": [rung.to_dict() for rung in self.rungs],
                "dominated": [d.to_dict() for d in dominated_rungs(self)],
                "chain": [list(rung.cut) for rung in chain(self)]}


def price_ladder(model: ModelCensus, rig: Rig, cuts: Sequence[Sequence[int]], shape: ServingShape | None = None,
                 timing: TimingModel | None = None) -> Ladder:
    """Price every rung with the arena held for the deepest rung on each rank."""
    rungs = [check_cut(cut, model.num_layers, rig.size) for cut in cuts]
    if not rungs:
        raise SolverError("a ladder needs at least one rung (a cut)")
    if len(set(rungs)) != len(rungs):
        raise SolverError(f"ladder rungs {[list(c) for c in rungs]} repeat a cut; list each rung once")
    if timing is None:
        if rig.stage_ms is None or rig.incumbent_cut is None or sum(rig.incumbent_cut) != model.num_layers:
            raise SolverError(f"rig {rig.name!r} has no stage times measured at a {model.num_layers}-layer incumbent; "
                              f"pass timing=calibrate(incumbent, stage_ms) to price rung speeds")
        timing = calibrate(rig.incumbent_cut, rig.stage_ms, noise_floor=rig.noise_floor)
    bare = CutPricer(model, rig, shape)
    budgets = [[bare.rank_budget(i, start, stop) for i, (start, stop) in enumerate(_ranges(cut))] for cut in rungs]
    resident = [tuple(b.weights_bytes + b.state_bytes for b in row) for row in budgets]
    # the host image carries weights only: state slots are runtime state, never copied from the host
    image = tuple(max(b.weights_bytes for b in column) for column in zip(*budgets, strict=True))
    # Weights (the arena) and state slots are each held for their deepest rung, so a rank's resident total
    # is the same on every rung even when the rung with the most weights is not the one with the most state.
    pinned = tuple(arena + max(b.state_bytes for b in column)
                   for arena, column in zip(image, zip(*budgets, strict=True), strict=True))
    priced = []
    for cut, held in zip(rungs, resident, strict=True):
        # the arena pins the deepest rung's bytes; this rung uses `held` of them, the rest still costs pool
        arena = [p - h for p, h in zip(pinned, held, strict=True)]
        pool = CutPricer(model, rig, shape, arena_bytes=arena).price(cut)
        priced.append(Rung(cut, held, pool, timing.pipelined_ms(cut)))
    return Ladder(tuple(priced), pinned, image, tuple(rank.h2d_bytes_per_s for rank in rig.ranks))


def _ranges(cut: tuple[int, ...]) -> list[tuple[int, int]]:
    bounds = [0, *accumulate(cut)]
    return list(zip(bounds, bounds[1:], strict=False))


def switch_cost_s(ladder: Ladder, to_cut: Sequence[int], from_cut: Sequence[int] | None = None) -> float:
    """Seconds to switch to `to_cut`: each rank refills its arena image over its own link, in parallel,
    so the slowest rank sets it. `from_cut` is checked but never priced: the distance does not matter."""
    ladder.rung(to_cut)
    if from_cut is not None:
        ladder.rung(from_cut)
    return max(size / rate for size, rate in zip(ladder.image_bytes, ladder.h2d_bytes_per_s, strict=True))


def payback_s(switch_cost: float, current_ms_per_step: float, target_ms_per_step: float, steps_per_s: float) -> float:
    """Seconds of running on the faster rung until the time saved repays the switch; math.inf if none is saved.

    Saved per second = steps_per_s x (current - target) ms / 1000; payback = switch_cost / saved.
    """
    if not (switch_cost >= 0 and current_ms_per_step > 0 and target_ms_per_step > 0 and steps_per_s > 0):
        raise SolverError(f"payback_s: need switch_cost >= 0 and positive step times and steps_per_s (got "
                          f"{switch_cost}, {current_ms_per_step}, {target_ms_per_step}, {steps_per_s})")
    saved_per_s = steps_per_s * (current_ms_per_step - target_ms_per_step) / 1000.0
    return math.inf if saved_per_s <= 0 else switch_cost / saved_per_s


@dataclass(frozen=True)
class Dominated:
    cut: tuple[int, ...]
    by: tuple[int, ...]
    reason: str

    def to_dict(self) -> dict:
        return {"cut": list(self.cut), "by": list(self.by), "reason": self.reason}


def dominated_rungs(ladder: Ladder) -> list[Dominated]:
    """Feasible rungs another rung beats: at least as much pool and no slower, strictly better in one."""
    feasible = [r for r in ladder.rungs if r.pool_tokens is not None]
    found = []
    for rung in feasible:
        better = [o for o in feasible if o.pool_tokens >= rung.pool_tokens and o.pipelined_ms <= rung.pipelined_ms
                  and (o.pool_tokens > rung.pool_tokens or o.pipelined_ms < rung.pipelined_ms)]
        if better:
            by = better[0]
            found.append(Dominated(rung.cut, by.cut, f"{list(by.cut)} holds {by.pool_tokens} >= {rung.pool_tokens} "
                                   f"tokens at {by.pipelined_ms:.4g} <= {rung.pipelined_ms:.4g} ms per step"))
    return found


def chain(ladder: Ladder) -> tuple[Rung, ...]:
    """The rungs a controller moves along: feasible, undominated, by pool (so roomiest last, slowest last)."""
    beaten = {d.cut for d in dominated_rungs(ladder)}
    kept: dict[tuple[int, float], Rung] = {}
    for rung in ladder.rungs:
        if rung.pool_tokens is not None and rung.cut not in beaten:
            kept.setdefault((rung.pool_tokens, rung.pipelined_ms), rung)  # exact twins: keep the first listed
    return tuple(sorted(kept.values(), key=lambda r: r.pool_tokens))


@dataclass(frozen=True)
class Move:
    tick: int
    from_cut: tuple[int, ...]
    to_cut: tuple[int, ...]
    reason: str  # "mandatory" (roomier: the alternative is refusing admissions) or "discretionary" (faster)
    fill_tokens: int
    payback_s: float | None  # discretionary moves only
    detail: str

    def to_dict(self) -> dict:
        return {"tick": self.tick, "from": list(self.from_cut), "to": list(self.to_cut), "reason": self.reason,
                "fill_tokens": self.fill_tokens, "payback_s": self.payback_s, "detail": self.detail}


def _per_boundary(name: str, value: int | Sequence[int], boundaries: int) -> tuple[int, ...]:
    values = (value,) if isinstance(value, int) and boundaries == 1 else value
    if (isinstance(values, int) or len(values) != boundaries
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values)):
        raise SolverError(f"{name}: give {boundaries} non-negative token count(s), one per step up the controller's "
                          f"chain (got {value!r})")
    return tuple(values)


def thresholds(rungs: Sequence[Rung], ascend_above_tokens: int | Sequence[int],
               descend_below_tokens: int | Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Validated thresholds; entry k governs the step between rungs[k] and the roomier rungs[k + 1]."""
    if len(rungs) < 2:
        raise SolverError(f"the controller's chain has {len(rungs)} rung(s) (dominated and refused rungs are left "
                          f"out): add a roomier or faster undominated rung to have somewhere to move")
    up = _per_boundary("ascend_above_tokens", ascend_above_tokens, len(rungs) - 1)
    down = _per_boundary("descend_below_tokens", descend_below_tokens, len(rungs) - 1)
    for k, (a, d) in enumerate(zip(up, down, strict=True)):
        if d >= a:
            raise SolverError(f"descend_below_tokens[{k}] = {d} must be below ascend_above_tokens[{k}] = {a}: "
                              f"without a band between them, fill jittering at the threshold flaps between rungs")
        if a >= rungs[k].pool_tokens:
            raise SolverError(f"ascend_above_tokens[{k}] = {a} is not below the pool of rung {list(rungs[k].cut)} "
                              f"({rungs[k].pool_tokens} tokens): admissions would be refused before it ascends")
        if k and (a <= up[k - 1] or d <= down[k - 1]):
            raise SolverError(f"thresholds must rise with the rungs' pools (entry {k}: ascend {a}, descend {d} vs "
                              f"ascend {up[k - 1]}, descend {down[k - 1]})")
    return up, down


def step(rungs: Sequence[Rung], at: int, fill: int, up: Sequence[int], down: Sequence[int], *, tick: int,
         switch_cost: float, steps_per_s: float, max_payback_s: float) -> Move | None:
    """One tick of the controller on thresholds as given (decide() validates them first)."""
    here = rungs[at]
    if at < len(rungs) - 1 and fill > up[at]:
        to = next(j for j in range(at + 1, len(rungs)) if j == len(rungs) - 1 or fill <= up[j])
        return Move(tick, here.cut, rungs[to].cut, "mandatory", fill, None,
                    f"fill {fill} > ascend_above {up[at]} on {list(here.cut)} (pool {here.pool_tokens})")
    if at > 0 and fill < down[at - 1]:
        to = at - 1
        while to > 0 and fill < down[to - 1]:
            to -= 1  # the fastest rung this fill allows; the switch costs the same wherever it lands
        payback = payback_s(switch_cost, here.pipelined_ms, rungs[to].pipelined_ms, steps_per_s)
        if payback <= max_payback_s:
            return Move(tick, here.cut, rungs[to].cut, "discretionary", fill, round(payback, 6),
                        f"fill {fill} < descend_below {down[at - 1]}; {here.pipelined_ms:.4g} -> "
                        f"{rungs[to].pipelined_ms:.4g} ms/step pays back {switch_cost:.4g} s in {payback:.4g} s")
    return None


def decide(ladder: Ladder, fill_trace: Sequence[int], ascend_above_tokens: int | Sequence[int],
           descend_below_tokens: int | Sequence[int], *, steps_per_s: float, max_payback_s: float = 60.0,
           start: Sequence[int] | None = None) -> list[Move]:
    """The moves a hysteresis controller makes over `fill_trace` (tokens in use per tick), from `start`
    (default: the fastest rung of the chain). A decision function: nothing is switched."""
    rungs = chain(ladder)
    up, down = thresholds(rungs, ascend_above_tokens, descend_below_tokens)
    if not max_payback_s >= 0:
        raise SolverError(f"max_payback_s: must be a non-negative number of seconds (got {max_payback_s!r})")
    cuts = [r.cut for r in rungs]
    if start is not None and tuple(start) not in cuts:
        raise SolverError(f"start {list(start)} is not on the controller's chain {[list(c) for c in cuts]} "
                          f"(dominated and refused rungs are left out)")
    at = cuts.index(tuple(start)) if start is not None else 0
    cost = switch_cost_s(ladder, cuts[at])
    moves = []
    for tick, fill in enumerate(fill_trace):
        if isinstance(fill, bool) or not isinstance(fill, int) or fill < 0:
            raise SolverError(f"fill_trace[{tick}] = {fill!r}: fill is a non-negative token count")
        move = step(rungs, at, fill, up, down, tick=tick, switch_cost=cost, steps_per_s=steps_per_s,
                    max_payback_s=max_payback_s)
        if move is not None:
            moves.append(move)
            at = cuts.index(move.to_cut)
    return moves

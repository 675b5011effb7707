import pytest
from hypothesis import given
from hypothesis import strategies as st

from solvers.capacity import pp_pool
from solvers.census import load_census
from solvers.errors import SolverError
from solvers.ladder import (
    chain,
    decide,
    dominated_rungs,
    payback_s,
    price_ladder,
    step,
    switch_cost_s,
    thresholds,
)
from solvers.rig import load_rig
from solvers.timing import calibrate
from tests.support.solver_factories import hybrid_census, make_rig

FAST, ROOMY = (12, 4), (8, 8)  # on the synthetic rig: FAST pool 5437 at 20 ms, ROOMY pool 8156 at 40 ms
UP, DOWN = 5000, 4000  # ascend from FAST above 5000 tokens; descend from ROOMY below 4000


@pytest.fixture(scope="module")
def reference():
    return load_census("reference-hybrid-64"), load_rig("reference")


@pytest.fixture(scope="module")
def ladder():
    model, rig = hybrid_census(), make_rig(["64MiB", "64MiB"])
    return price_ladder(model, rig, [ROOMY, FAST, (4, 12)], timing=calibrate((8, 8), (10.0, 40.0)))


def test_every_rung_holds_the_pinned_arena_on_every_rank(reference):
    model, rig = reference
    ladder = price_ladder(model, rig, [(28, 20, 16), (29, 19, 16)])
    assert ladder.pinned_bytes[0] == ladder.rung((29, 19, 16)).resident_bytes[0]  # deepest rank-0 rung
    assert ladder.pinned_bytes[1] == ladder.rung((28, 20, 16)).resident_bytes[1]  # deepest rank-1 rung
    for rung in ladder.rungs:
        for budget, pinned in zip(rung.pool.ranks, ladder.pinned_bytes, strict=True):
            assert budget.weights_bytes + budget.state_bytes + budget.arena_bytes == pinned


def test_same_attention_split_prices_the_same_and_the_faster_rung_dominates(reference):
    model, rig = reference
    ladder = price_ladder(model, rig, [(28, 20, 16), (29, 19, 16)])
    slow, fast = ladder.rung((28, 20, 16)), ladder.rung((29, 19, 16))
    assert slow.pool.attention_split == fast.pool.attention_split == (7, 5, 4)
    assert slow.pool_tokens == fast.pool_tokens is not None
    assert fast.pipelined_ms < slow.pipelined_ms
    (beaten,) = dominated_rungs(ladder)
    assert (beaten.cut, beaten.by) == ((28, 20, 16), (29, 19, 16))
    assert [rung.cut for rung in chain(ladder)] == [(29, 19, 16)]


def test_the_arena_costs_pool_on_the_roomier_rung(reference):
    model, rig = reference
    ladder = price_ladder(model, rig, [(28, 20, 16), (29, 19, 16)])
    alone = pp_pool(model, rig, (29, 19, 16)).pool_tokens
    assert ladder.rung((29, 19, 16)).pool_tokens < alone  # it pays for holding the deeper rung's option


def test_switch_cost_is_the_slowest_ranks_image_copy_and_independent_of_distance(reference):
    model, rig = reference
    cuts = [(28, 20, 16), (29, 19, 16), (26, 21, 17)]
    ladder = price_ladder(model, rig, cuts)
    a, b, c = cuts
    assert switch_cost_s(ladder, b, from_cut=a) == switch_cost_s(ladder, c, from_cut=a)
    assert switch_cost_s(ladder, c, from_cut=a) == switch_cost_s(ladder, c, from_cut=b)
    expected = max(size / rank.h2d_bytes_per_s for size, rank in zip(ladder.image_bytes, rig.ranks, strict=True))
    assert switch_cost_s(ladder, b) == pytest.approx(expected)
    with pytest.raises(SolverError, match="not a rung"):
        switch_cost_s(ladder, (30, 18, 16))


def test_payback():
    assert payback_s(3.0, 40.0, 20.0, 10.0) == pytest.approx(3.0 / (10 * 20 / 1000))
    assert payback_s(3.0, 20.0, 40.0, 10.0) == float("inf")  # slower never pays back
    with pytest.raises(SolverError, match="payback_s"):
        payback_s(3.0, 20.0, 40.0, 0.0)


def test_price_ladder_rejects_bad_inputs(reference):
    model, rig = reference
    with pytest.raises(SolverError, match="at least one rung"):
        price_ladder(model, rig, [])
    with pytest.raises(SolverError, match="repeat"):
        price_ladder(model, rig, [(28, 20, 16), (28, 20, 16)])
    with pytest.raises(SolverError, match="sums to"):
        price_ladder(model, rig, [(28, 20, 15)])
    with pytest.raises(SolverError, match="timing"):
        price_ladder(hybrid_census(), make_rig(["64MiB", "64MiB"]), [(8, 8)])


def test_chain_keeps_undominated_rungs_fastest_first(ladder):
    assert [rung.cut for rung in chain(ladder)] == [FAST, ROOMY]
    assert [d.cut for d in dominated_rungs(ladder)] == [(4, 12)]
    assert ladder.to_dict()["dominated"][0]["by"] in (list(FAST), list(ROOMY))


@pytest.mark.parametrize("up, down, message", [
    (UP, UP, "must be below"), (UP, UP + 1, "must be below"), (6000, 4000, "not below the pool"),
    ([UP, UP], DOWN, "give 1"), (UP, -1, "non-negative"),
])
def test_thresholds_are_validated(ladder, up, down, message):
    with pytest.raises(SolverError, match=message):
        decide(ladder, [0], up, down, steps_per_s=10.0)


def test_a_one_rung_chain_has_nowhere_to_move(reference):
    model, rig = reference
    with pytest.raises(SolverError, match="1 rung"):
        decide(price_ladder(model, rig, [(28, 20, 16), (29, 19, 16)]), [0], 10, 5, steps_per_s=1.0)


def test_decide_rejects_bad_fill_start_and_payback(ladder):
    with pytest.raises(SolverError, match="fill_trace"):
        decide(ladder, [10, -1], UP, DOWN, steps_per_s=10.0)
    with pytest.raises(SolverError, match="not on the controller's chain"):
        decide(ladder, [10], UP, DOWN, steps_per_s=10.0, start=(4, 12))
    with pytest.raises(SolverError, match="max_payback_s"):
        decide(ladder, [10], UP, DOWN, steps_per_s=10.0, max_payback_s=-1.0)


def jitter(center, ticks=200):
    return [center + (1 if i % 2 else -1) for i in range(ticks)]


def test_jitter_at_the_ascend_threshold_makes_one_mandatory_move(ladder):
    moves = decide(ladder, jitter(UP), UP, DOWN, steps_per_s=10.0)
    assert len(moves) == 1
    assert (moves[0].from_cut, moves[0].to_cut, moves[0].reason) == (FAST, ROOMY, "mandatory")
    assert moves[0].tick == 1 and moves[0].to_dict()["fill_tokens"] == UP + 1


def test_jitter_at_the_descend_threshold_makes_at_most_one_move(ladder):
    moves = decide(ladder, jitter(DOWN), UP, DOWN, steps_per_s=10.0, start=ROOMY)
    assert [(m.to_cut, m.reason) for m in moves] == [(FAST, "discretionary")]
    assert moves[0].payback_s == pytest.approx(switch_cost_s(ladder, FAST) / (10 * (40 - 20) / 1000))


def test_the_same_jitter_flaps_without_the_hysteresis_band(ladder):
    rungs = chain(ladder)
    at, moves = 0, 0
    for tick, fill in enumerate(jitter(UP)):  # descend == ascend: decide() refuses this, step() shows why
        move = step(rungs, at, fill, [UP], [UP], tick=tick, switch_cost=0.01, steps_per_s=10.0, max_payback_s=60)
        if move is not None:
            at, moves = [r.cut for r in rungs].index(move.to_cut), moves + 1
    assert moves >= 150


def test_an_unpaid_discretionary_move_is_skipped_but_a_mandatory_one_is_not(ladder):
    moves = decide(ladder, [6000, 100, 100, 6000], UP, DOWN, steps_per_s=10.0, max_payback_s=0.0)
    assert [(m.tick, m.reason) for m in moves] == [(0, "mandatory")]


@given(st.lists(st.integers(0, 8000), max_size=60), st.sampled_from([FAST, ROOMY]))
def test_mandatory_ascend_always_happens_when_fill_crosses_up(ladder, trace, start):
    up, down = thresholds(chain(ladder), UP, DOWN)
    moves = {m.tick: m for m in decide(ladder, trace, UP, DOWN, steps_per_s=10.0, start=start)}
    at = start
    for tick, fill in enumerate(trace):
        if at == FAST and fill > up[0]:
            assert tick in moves and moves[tick].reason == "mandatory" and moves[tick].to_cut == ROOMY
        if tick in moves:
            at = moves[tick].to_cut
        assert not (at == FAST and fill > up[0])  # after each tick, never left on a rung the fill outgrew

"""The cut frontier: complete, exact, and agreeing with the pricer and timing model cut for cut."""

from __future__ import annotations

import copy
import json
from itertools import combinations
from math import comb

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solvers.capacity import CutPricer
from solvers.census import CONFIG_DIR, LayerCensus, LayerKind, ModelCensus, census_from_config, load_census
from solvers.errors import SolverError
from solvers.frontier import compute_frontier
from solvers.frontier_search import time_key
from solvers.rig import RIG_DIR, load_rig, proportional_split, rig_from_dict
from solvers.timing import calibrate

MIB = 2**20
KINDS = (LayerKind.FULL_ATTENTION, LayerKind.LINEAR_ATTENTION, LayerKind.MLP)


# --- brute force: the definition the search must reproduce ---------------------------------------
def all_cuts(layers: int, ranks: int) -> list[tuple[int, ...]]:
    """Every composition of `layers` into `ranks` positive parts, in lexicographic order."""
    cuts = []
    for marks in combinations(range(1, layers), ranks - 1):
        bounds = (0, *marks, layers)
        cuts.append(tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False)))
    return sorted(cuts)


def brute_force(model, rig, timing, shape=None):
    """(pareto pair -> least serial ms among its cuts, feasible pairs, refused cuts in lexicographic order)."""
    pricer = CutPricer(model, rig, shape)
    pairs: dict[tuple[float, int], float] = {}
    refused = []
    for cut in all_cuts(model.num_layers, rig.size):
        priced = pricer.price(cut)
        if priced.reasons:
            refused.append(cut)
            continue
        pair = (time_key(timing.pipelined_ms(cut)), priced.pool_tokens)
        pairs[pair] = min(pairs.get(pair, float("inf")), timing.serial_ms(cut))
    pareto = {pair: serial for pair, serial in pairs.items() if not any(dominates(other, pair) for other in pairs)}
    return pareto, pairs, refused


def dominates(a: tuple[float, int], b: tuple[float, int]) -> bool:
    return a[0] <= b[0] and a[1] >= b[1] and a != b


def check_against_brute_force(frontier, model, rig, timing, shape=None) -> None:
    pareto, _, refused = brute_force(model, rig, timing, shape)
    pricer = CutPricer(model, rig, shape)
    got = [(time_key(point.pipelined_ms), point.pool_tokens) for point in frontier.points]
    assert sorted(got) == got, "points are sorted fastest first"
    assert len(set(got)) == len(got), "one representative per (time, pool) pair"
    assert set(got) == set(pareto), "no dominated pair returned, no non-dominated pair missed"
    for point, pair in zip(frontier.points, got, strict=True):
        priced, timed = pricer.price(point.cut), timing.evaluate(point.cut)
        assert not priced.reasons
        assert point.pool_tokens == priced.pool_tokens and point.binding_rank == priced.binding_rank
        assert point.attention_split == priced.attention_split
        assert point.caps == tuple(rank.allowed_tokens for rank in priced.ranks)
        assert (point.serial_ms, point.pipelined_ms) == (timed.serial_ms, timed.pipelined_ms)
        assert (point.x_serial, point.x_pipelined, point.flags) == (timed.x_serial, timed.x_pipelined, timed.flags)
        assert point.provenance == ("measured" if rig.is_booted(point.cut) else "extrapolated")
        assert point.serial_ms == pytest.approx(pareto[pair]), "the representative has the least serial time"
    assert frontier.total_cuts == comb(model.num_layers - 1, rig.size - 1)
    assert frontier.refused_total == len(refused)
    assert [item.cut for item in frontier.refused] == refused[: len(frontier.refused)]
    for item in frontier.refused:
        assert item.reasons and item.reasons == pricer.price(item.cut).reasons


# --- the reference rig ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference():
    model, rig = load_census("reference-hybrid-64"), load_rig("reference")
    return model, rig, calibrate(rig.incumbent_cut, rig.stage_ms, noise_floor=rig.noise_floor)


def test_reference_frontier_matches_brute_force(reference):
    model, rig, timing = reference
    frontier = compute_frontier(model, rig)
    check_against_brute_force(frontier, model, rig, timing)
    assert frontier.total_cuts == 1953
    assert len(frontier.refused) == 200 and frontier.refused_total == 1878


def test_reference_incumbent_is_priced_and_dominated(reference):
    model, rig, timing = reference
    frontier = compute_frontier(model, rig)
    head = frontier.incumbent
    assert head.cut == (28, 20, 16) and head.feasible and head.provenance == "measured"
    assert head.attention_split == (7, 5, 4) and head.binding_rank == 1
    assert head.pool_tokens == CutPricer(model, rig).price((28, 20, 16)).pool_tokens
    assert head.x_pipelined == 1.0 and head.pipelined_ms == pytest.approx(154.8)
    _, pairs, _ = brute_force(model, rig, timing)
    incumbent_pair = (time_key(head.pipelined_ms), head.pool_tokens)
    assert any(dominates(pair, incumbent_pair) for pair in pairs), "brute force: some cut beats the incumbent"
    better = [point for point in frontier.points if point.dominates(head)]
    assert better and all(point.pool_ratio > 1 and point.x_pipelined > 1 for point in better)
    assert any("dominate the incumbent" in note for note in frontier.notes)


def test_reference_to_dict_is_json(reference):
    model, rig, _ = reference
    data = json.loads(json.dumps(compute_frontier(model, rig, refused_limit=3).to_dict()))
    assert set(data) >= {"incumbent", "points", "refused", "refused_total", "total_cuts", "notes", "elapsed_s",
                         "model", "rig"}
    assert data["incumbent"]["cut"] == [28, 20, 16] and len(data["refused"]) == 3
    assert data["refused_total"] == 1878 and data["refused"][0]["reasons"]
    point = data["points"][0]
    assert {"cut", "attention_split", "caps", "pool_tokens", "pool_ratio", "binding_rank", "serial_ms", "pipelined_ms",
            "x_serial", "x_pipelined", "flags", "provenance"} <= set(point)


def test_min_pool_ratio_filters_points(reference):
    model, rig, _ = reference
    full = compute_frontier(model, rig)
    kept = compute_frontier(model, rig, min_pool_ratio=1.0)
    pool = full.incumbent.pool_tokens
    assert kept.points == tuple(point for point in full.points if point.pool_tokens >= pool)
    assert 0 < len(kept.points) < len(full.points)
    assert compute_frontier(model, rig, min_pool_ratio=100).points == ()
    with pytest.raises(SolverError, match="min_pool_ratio"):
        compute_frontier(model, rig, min_pool_ratio=-1)


def test_pool_is_not_monotone_in_the_cut(reference):
    """Moving layers from rank 2 to rank 0 raises the pool until rank 0 binds, then lowers it."""
    model, rig, _ = reference
    pricer = CutPricer(model, rig)
    walk = [pricer.price((a, 20, 44 - a)) for a in (24, 28, 34)]
    assert walk[0].pool_tokens < walk[1].pool_tokens > walk[2].pool_tokens
    assert [priced.binding_rank for priced in walk] == [2, 1, 0]
    # The frontier keeps the roomy cuts, not only the fastest: its pools rise and its binder moves.
    frontier = compute_frontier(model, rig)
    assert {point.binding_rank for point in frontier.points} == {0, 2}
    assert [point.pool_tokens for point in frontier.points] == sorted(point.pool_tokens for point in frontier.points)


# --- small random cases against brute force ---------------------------------------------------
@st.composite
def small_case(draw):
    layers = draw(st.integers(4, 12))
    ranks = draw(st.integers(2, min(4, layers)))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=layers, max_size=layers))
    if LayerKind.FULL_ATTENTION not in kinds:
        kinds[draw(st.integers(0, layers - 1))] = LayerKind.FULL_ATTENTION
    census_layers = []
    for index, kind in enumerate(kinds):
        params = draw(st.integers(MIB // 4, 3 * MIB))
        if kind == LayerKind.FULL_ATTENTION:
            census_layers.append(LayerCensus(index, kind, params, kv_elements_per_token=draw(st.integers(64, 2048))))
        elif kind == LayerKind.LINEAR_ATTENTION:
            census_layers.append(LayerCensus(index, kind, params, recurrent_state_elements=draw(st.integers(0, 65536))))
        else:
            census_layers.append(LayerCensus(index, kind, params))
    model = ModelCensus(family="test", model_type="test", dtype="bfloat16", layers=tuple(census_layers),
                        embedding_params=MIB // 4, lm_head_params=MIB // 4, final_norm_params=64, hidden_size=64,
                        vocab_size=128, intermediate_size=128, name="random")
    rank_list = []
    for i in range(ranks):
        rank_list.append({
            "name": f"r{i}", "memory": f"{draw(st.integers(8, 40))}MiB", "overhead": "1MiB", "h2d_bandwidth": "1GB/s",
            "corridor": {"band": "4MiB", "tolerance": 0.25}, "workspace": f"{draw(st.integers(0, 4))}MiB",
            "seam_reserve": {"estimate": {"staging": f"{draw(st.integers(0, 3))}MiB"}, "uncertainty": "1MiB"},
            # Few decimals, so equal stage times across ranks (8 x 7.7 = 14 x 4.4) do happen.
            "stage_ms": draw(st.integers(1, 400)) / 10,
        })
    incumbent = draw(st.sampled_from(all_cuts(layers, ranks)))
    rig = rig_from_dict({
        "name": "random", "ranks": rank_list, "incumbent_cut": list(incumbent),
        "booted_cuts": [list(draw(st.sampled_from(all_cuts(layers, ranks))))],
        "shape": {"max_model_len": draw(st.sampled_from([16, 64, 256, 1024])), "max_num_seqs": draw(st.integers(1, 4)),
                  "max_num_batched_tokens": 64, "kv_dtype": "bf16"},
    })
    fixed = draw(st.none() | st.lists(st.integers(0, 9), min_size=ranks, max_size=ranks))
    return model, rig, fixed, draw(st.none() | st.sampled_from([0.0, 0.5, 1.0, 1.5]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_case())
def test_random_cases_match_brute_force(case):
    model, rig, fixed, ratio = case
    stage_ms = rig.stage_ms
    fixed_ms = None if fixed is None else [min(f / 10, ms / 2) for f, ms in zip(fixed, stage_ms, strict=True)]
    timing = calibrate(rig.incumbent_cut, stage_ms, fixed_ms, noise_floor=rig.noise_floor)
    frontier = compute_frontier(model, rig, timing=timing, refused_limit=7)
    check_against_brute_force(frontier, model, rig, timing)
    head = frontier.incumbent
    assert head.reasons == CutPricer(model, rig).price(rig.incumbent_cut).reasons
    if ratio is None:
        return
    if not head.feasible:
        with pytest.raises(SolverError, match="incumbent"):
            compute_frontier(model, rig, timing=timing, min_pool_ratio=ratio)
        return
    kept = compute_frontier(model, rig, timing=timing, min_pool_ratio=ratio)
    assert kept.points == tuple(p for p in frontier.points if p.pool_tokens >= ratio * head.pool_tokens)
    assert all(p.pool_ratio == p.pool_tokens / head.pool_tokens for p in kept.points)


# --- incumbents, timing, and refusals ----------------------------------------------------------------
def demo_census(num_layers: int):
    config = json.loads((CONFIG_DIR / "demo-hybrid-16.json").read_text())
    config["num_hidden_layers"] = num_layers
    config.pop("layer_types", None)
    return census_from_config(config, name=f"demo-hybrid-{num_layers}")


def test_rescaled_incumbent_is_said_and_timed_per_layer():
    rig = load_rig("cpu-demo")
    model = demo_census(20)
    frontier = compute_frontier(model, rig)
    expected = proportional_split(20, (7, 5, 4))
    assert frontier.incumbent.cut == expected
    assert any("proportional split" in note and "[7, 5, 4]" in note for note in frontier.notes)
    assert any("rescaled per layer" in note for note in frontier.notes)
    # ms per layer is what was measured at [7, 5, 4]; the rescaled incumbent keeps it.
    per_layer = [ms / n for ms, n in zip(rig.stage_ms, (7, 5, 4), strict=True)]
    assert frontier.incumbent.serial_ms == pytest.approx(sum(n * ms for n, ms in zip(expected, per_layer, strict=True)))
    assert frontier.incumbent.x_pipelined == 1.0 and frontier.incumbent.provenance == "extrapolated"
    timing = calibrate(expected, [n * ms for n, ms in zip(expected, per_layer, strict=True)])
    check_against_brute_force(frontier, model, rig, timing)


def test_declared_incumbent_has_no_rescale_note():
    frontier = compute_frontier(load_census("demo-hybrid-16"), load_rig("cpu-demo"))
    assert not any("proportional" in note or "rescaled" in note for note in frontier.notes)
    assert frontier.incumbent.cut == (7, 5, 4) and frontier.incumbent.provenance == "measured"


def load_rig_dict(name: str) -> dict:
    return json.loads((RIG_DIR / f"{name}.json").read_text())


def test_rig_without_stage_times_needs_a_timing_model():
    data = copy.deepcopy(load_rig_dict("cpu-demo"))
    for rank in data["ranks"]:
        rank.pop("stage_ms")
    rig, model = rig_from_dict(data), load_census("demo-hybrid-16")
    with pytest.raises(SolverError, match="stage ms"):
        compute_frontier(model, rig)
    timing = calibrate((7, 5, 4), [1.0, 2.0, 3.0])
    frontier = compute_frontier(model, rig, timing=timing)
    check_against_brute_force(frontier, model, rig, timing)


def test_refused_incumbent_is_reported_with_its_reason():
    model = load_census("reference-hybrid-64")
    data = copy.deepcopy(load_rig_dict("reference"))
    data["incumbent_cut"] = [1, 1, 62]
    data["ranks"][2]["stage_ms"] = 116.4 / 16 * 62  # keep ms per layer as measured
    data["ranks"][0]["stage_ms"] = 49.2 / 28
    data["ranks"][1]["stage_ms"] = 154.8 / 20
    rig = rig_from_dict(data)
    frontier = compute_frontier(model, rig)
    head = frontier.incumbent
    assert not head.feasible and head.pool_tokens is None and "arming floor" in head.reasons[0]
    assert any("incumbent [1, 1, 62] is refused" in note for note in frontier.notes)
    assert frontier.points and all(point.pool_ratio is None for point in frontier.points)
    assert frontier.to_dict()["incumbent"]["reasons"] == list(head.reasons)


def test_model_without_attention_has_no_frontier():
    layers = tuple(LayerCensus(i, LayerKind.LINEAR_ATTENTION, MIB, recurrent_state_elements=64) for i in range(6))
    model = ModelCensus(family="test", model_type="test", dtype="bfloat16", layers=layers, embedding_params=0,
                        lm_head_params=0, final_norm_params=0, hidden_size=64, vocab_size=128, intermediate_size=128)
    with pytest.raises(SolverError, match="unbounded"):
        compute_frontier(model, load_rig("cpu-demo"))


def test_too_few_layers_for_the_rig():
    with pytest.raises(SolverError, match="every rank needs a layer"):
        compute_frontier(demo_census(2), load_rig("cpu-demo"))


# --- scale ---------------------------------------------------------------------------------------
SYNTHETIC = {4: ([32, 20, 24, 20], [1.8, 7.7, 3.1, 7.3]),
             8: ([32, 20, 20, 24, 16, 24, 20, 20], [1.8, 7.7, 7.3, 3.1, 5.0, 2.4, 6.2, 4.4])}


def synthetic(ranks: int, num_layers: int):
    """A Qwen3-Next-style census of `num_layers` on uneven cards, as benchmarks/frontier.py builds."""
    config = json.loads((CONFIG_DIR / "reference-hybrid-64.json").read_text())
    config["num_hidden_layers"] = num_layers
    model = census_from_config(config, name=f"reference-hybrid-{num_layers}")
    memory, per_layer = SYNTHETIC[ranks]
    incumbent = proportional_split(num_layers, memory)
    base = load_rig_dict("reference")["ranks"][1]
    rank_list = [dict(copy.deepcopy(base), name=f"g{i}", memory=f"{gib}GiB", stage_ms=ms * n)
                 for i, (gib, ms, n) in enumerate(zip(memory, per_layer, incumbent, strict=True))]
    rig = rig_from_dict({"name": f"synthetic-{ranks}", "ranks": rank_list, "incumbent_cut": list(incumbent),
                         "shape": load_rig_dict("reference")["shape"]})
    return model, rig, calibrate(incumbent, rig.stage_ms, noise_floor=rig.noise_floor)


def test_four_ranks_by_80_layers_matches_brute_force():
    model, rig, timing = synthetic(4, 80)  # 79,079 cuts: the largest case brute force checks quickly
    frontier = compute_frontier(model, rig)
    check_against_brute_force(frontier, model, rig, timing)
    assert any(point.dominates(frontier.incumbent) for point in frontier.points)


def test_eight_ranks_by_128_layers_is_exact_without_enumeration():
    model, rig, timing = synthetic(8, 128)
    frontier = compute_frontier(model, rig, refused_limit=5)
    assert frontier.total_cuts == comb(127, 7) and frontier.elapsed_s < 10
    pricer = CutPricer(model, rig)
    pairs = [(time_key(point.pipelined_ms), point.pool_tokens) for point in frontier.points]
    assert len(pairs) > 5 and pairs == sorted(pairs)
    assert all(a[1] < b[1] and a[0] < b[0] for a, b in zip(pairs, pairs[1:], strict=False)), "none dominated"
    for point in frontier.points:
        assert pricer.price(point.cut).pool_tokens == point.pool_tokens
        assert timing.evaluate(point.cut).pipelined_ms == point.pipelined_ms
    assert any(point.dominates(frontier.incumbent) for point in frontier.points)
    assert all(pricer.price(item.cut).reasons for item in frontier.refused)
    assert 0 < frontier.refused_total < frontier.total_cuts


def test_float_noise_is_not_a_faster_time():
    assert 8 * 7.7 != 14 * 4.4  # 61.6 vs 61.60000000000001: the same stage time, calibrated two ways
    assert time_key(8 * 7.7) == time_key(14 * 4.4)

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solvers.calibration import (
    Sample,
    coverage,
    parse_samples,
    publish_intercept,
    samples_needed,
    suggest_arms,
)
from solvers.errors import SolverError

INCUMBENT = (28, 20, 16)
MS = (49.2, 154.8, 116.4)


def test_repeats_of_one_cut_identify_no_rank_and_need_infinite_samples():
    report = coverage([(INCUMBENT, MS)] * 5, sd_ms=3.0)
    assert report.unidentified == (0, 1, 2)
    for rank in report.ranks:
        assert rank.samples_needed == math.inf  # infinity, never a big number
        assert rank.delta_layers == 0 and not rank.intercept.published
        assert rank.to_dict()["samples_needed"] == "inf"
        assert rank.to_dict()["intercept"]["value"] is None  # refused, not emitted as 0
    assert report.ranks[0].ms_per_layer == pytest.approx(49.2 / 28)  # the optimistic ratio, flagged in notes
    assert [plan.rank for plan in report.arms] == [0, 1, 2]


def test_a_rank_whose_count_never_changed_stays_unidentified_among_identified_ones():
    samples = [((28, 20, 16), MS), ((29, 19, 16), (51.0, 147.1, 116.0)), ((27, 21, 16), (47.4, 162.4, 116.8))]
    report = coverage(samples, sd_ms=2.0, target=0.05)
    assert report.unidentified == (2,)
    assert report.ranks[2].samples_needed == math.inf
    assert all(isinstance(rank.samples_needed, int) for rank in report.ranks[:2])
    (plan,) = report.arms
    assert plan.rank == 2 and {arm.delta_layers for arm in plan.arms} == {1, -1}


def test_least_squares_recovers_slope_intercept_and_its_standard_error():
    noise = [0.3, -0.2, -0.4, 0.1, 0.2, 0.0]
    counts = [10, 12, 14, 16, 18, 20]
    samples = [((n, 40 - n), (2.0 * n + 30.0 + e, 5.0 * (40 - n))) for n, e in zip(counts, noise, strict=True)]
    rank = coverage(samples).ranks[0]
    assert rank.identified and rank.delta_layers == 10 and rank.layer_counts == tuple(counts)
    assert rank.ms_per_layer == pytest.approx(2.0, abs=0.05)
    assert rank.intercept.estimate == pytest.approx(30.0, abs=1.0)
    assert rank.intercept.dof == 4 and rank.intercept.standard_error > 0
    assert rank.intercept.published  # 30 ms is far beyond 2 SE
    assert rank.to_dict()["intercept"]["value"] == rank.intercept.estimate
    assert rank.sd_ms == pytest.approx(0.3, abs=0.15)  # the residual SD, used when no sd_ms is given


def test_two_distinct_cuts_identify_the_slope_but_the_intercept_has_no_residual_dof():
    rank = coverage([((10, 10), (50.0, 60.0)), ((12, 8), (54.0, 48.0))]).ranks[0]
    assert rank.ms_per_layer == pytest.approx(2.0)
    assert not rank.intercept.published and "residual degrees of freedom" in rank.intercept.refusal
    assert rank.samples_needed is None and "no SD" in rank.notes[0]  # no SD known: say so, no number


def test_samples_needed_formula():
    expected = (math.sqrt(2) * 5.0 / (0.05 * 4 * 2.0)) ** 2  # 312.5
    assert samples_needed(5.0, 0.05, 4, 2.0) == math.ceil(expected) == 313
    assert samples_needed(5.0, 0.05, -4, 2.0) == 313  # |delta layers|
    assert samples_needed(5.0, 0.05, 0, 2.0) == math.inf
    assert samples_needed(0.0, 0.05, 1, 2.0) == 1  # a noiseless arm still needs one run


@pytest.mark.parametrize("args", [(-1.0, 0.05, 1, 2.0), (1.0, 0.0, 1, 2.0), (1.0, 0.05, 1, 0.0)])
def test_samples_needed_rejects_bad_inputs(args):
    with pytest.raises(SolverError, match="samples_needed"):
        samples_needed(*args)


def test_intercept_gate_names_the_failed_condition():
    assert publish_intercept(3.0, 1.0, 4).published
    assert "2 SE" in publish_intercept(1.5, 1.0, 4).refusal
    assert "no standard error" in publish_intercept(3.0, None, 4).refusal
    assert "N = 0" in publish_intercept(3.0, 1.0, 0).refusal
    refused = publish_intercept(0.0, 1.0, 3)
    assert not refused.published and refused.to_dict()["value"] is None  # never 0 as if measured
    assert "unidentified" in publish_intercept(None, None, 0).refusal


def test_arms_move_the_rank_both_ways_and_keep_the_total():
    plan = suggest_arms(INCUMBENT, 2, step=2)
    assert {arm.cut for arm in plan.arms} == {(28, 18, 18), (28, 22, 14)}
    assert {arm.delta_layers for arm in plan.arms} == {2, -2} and not plan.notes
    middle = suggest_arms(INCUMBENT, 1)
    assert {arm.cut for arm in middle.arms} == {(27, 21, 16), (28, 21, 15), (29, 19, 16), (28, 19, 17)}


def test_arms_say_when_a_direction_is_blocked():
    plan = suggest_arms((1, 5), 0)
    assert [arm.cut for arm in plan.arms] == [(2, 4)]
    assert "cannot give" in plan.notes[0]


@given(st.lists(st.integers(1, 12), min_size=2, max_size=6), st.data())
def test_every_arm_is_a_valid_cut(cut, data):
    rank = data.draw(st.integers(0, len(cut) - 1))
    step = data.draw(st.integers(1, 4))
    for arm in suggest_arms(cut, rank, step).arms:
        assert sum(arm.cut) == sum(cut) and min(arm.cut) >= 1
        assert arm.cut[rank] - cut[rank] == arm.delta_layers


@pytest.mark.parametrize("args, message", [
    (((28, 20, 16), 3), "rank 3"), (((28, 20, 16), 0, 0), "step"), (((64,), 0), "single-rank"),
    (((28, 0, 16), 0), "positive whole number"),
])
def test_suggest_arms_rejects_bad_inputs(args, message):
    with pytest.raises(SolverError, match=message):
        suggest_arms(*args)


@pytest.mark.parametrize("samples, message", [
    ([], "at least one"),
    ([((28, 20, 16), (1.0, 2.0))], "one stage time"),
    ([((28, 20, 16), (1.0, -2.0, 3.0))], "positive finite"),
    ([((28, 20, 16), MS), ((28, 20, 17), MS)], "same rig and model"),
    ([{"cut": [28, 20, 16]}], "cut and stage_ms"),
    ([42], "expected \\(cut, stage_ms"),
])
def test_parse_samples_rejects_bad_inputs(samples, message):
    with pytest.raises(SolverError, match=message):
        parse_samples(samples)


def test_samples_accept_dicts_and_dataclasses():
    parsed = parse_samples([{"cut": [28, 20, 16], "stage_ms": list(MS)}, Sample(INCUMBENT, MS)])
    assert parsed[0] == parsed[1] and parsed[0].to_dict() == {"cut": list(INCUMBENT), "stage_ms": list(MS)}


def test_coverage_rejects_bad_sd_target_and_incumbent():
    with pytest.raises(SolverError, match="sd_ms"):
        coverage([(INCUMBENT, MS)], sd_ms=[1.0, 2.0])
    with pytest.raises(SolverError, match="sd_ms"):
        coverage([(INCUMBENT, MS)], sd_ms="3ms")
    with pytest.raises(SolverError, match="target"):
        coverage([(INCUMBENT, MS)], target=0)
    with pytest.raises(SolverError, match="incumbent"):
        coverage([(INCUMBENT, MS)], incumbent=(30, 20, 16))


def test_coverage_to_dict_is_json_ready():
    import json
    data = coverage([(INCUMBENT, MS), ((29, 19, 16), (51.0, 147.1, 116.0))]).to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data  # every value survives JSON as it is
    assert (data["samples"], data["cuts"], data["target"], data["unidentified"]) == \
        (2, [[28, 20, 16], [29, 19, 16]], 0.05, [2])
    rank0, rank1, rank2 = data["ranks"]
    # ms/layer by hand: the stage time's change per layer moved (ranks 0 and 1), the mean ratio where none moved.
    assert rank0["ms_per_layer"] == pytest.approx(51.0 - 49.2) and rank1["ms_per_layer"] == pytest.approx(7.7)
    assert rank2["ms_per_layer"] == pytest.approx((116.4 + 116.0) / 2 / 16)
    assert [rank["identified"] for rank in data["ranks"]] == [True, True, False]
    assert [rank["layer_counts"] for rank in data["ranks"]] == [[28, 29], [19, 20], [16]]
    assert rank0["intercept"]["value"] is None and rank0["intercept"]["estimate"] == pytest.approx(-1.2)
    assert rank0["intercept"]["published"] is False and "residual degrees of freedom" in rank0["intercept"]["refusal"]
    assert rank2["samples_needed"] == "inf" and rank0["samples_needed"] is None  # no SD: unknown, not a number
    assert [arm["cut"] for plan in data["arms"] for arm in plan["arms"]] == [[28, 19, 17], [28, 21, 15]]
    assert [(w["rank"], w["problem"]) for w in data["warnings"]] == [(0, "negative_fixed_ms"), (2, "unidentified")]


def test_an_unidentified_rank_warns_naming_it_and_the_cuts_that_move_it():
    samples = [((28, 20, 16), MS), ((29, 19, 16), (51.0, 147.1, 116.0)), ((27, 21, 16), (47.4, 162.4, 116.8))]
    (warning,) = [w for w in coverage(samples, sd_ms=2.0).warnings if w.rank == 2]
    assert warning.problem == "unidentified"
    assert "rank 2: ms/layer cannot be identified" in warning.message
    assert "measure a cut that moves rank 2, e.g. [28, 19, 17] or [28, 21, 15]" in warning.message


def test_a_negative_fit_warns_with_the_fix():
    # Rank 0 slower with fewer layers: the slope is negative; rank 1 fits a negative fixed cost.
    samples = [((28, 20, 16), (60.0, 154.8, 116.4)), ((30, 18, 16), (50.0, 120.0, 116.9))]
    report = coverage(samples, sd_ms=2.0)
    problems = {(w.rank, w.problem): w.message for w in report.warnings}
    assert {(0, "negative_ms_per_layer"), (1, "negative_fixed_ms"), (2, "unidentified")} == set(problems)
    assert problems[(0, "negative_ms_per_layer")].startswith("rank 0: fitted ms/layer -5 is not positive")
    assert "measure a cut that moves rank 1 further than 2 layer(s)" in problems[(1, "negative_fixed_ms")]
    assert report.to_dict()["warnings"][0]["rank"] == 0


def test_a_clean_fit_and_a_one_rank_rig():
    samples = [((28, 20, 16), MS), ((30, 18, 16), (52.3, 140.1, 116.9))]
    assert [w.rank for w in coverage(samples, sd_ms=3.0).warnings] == [2]
    (single,) = coverage([((16,), (9.0,))] * 2).warnings
    assert "one-rank rig" in single.message

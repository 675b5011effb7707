"""compute_frontier from the running cut (incumbent=) and with live-measured layouts (measured_cuts=)."""

from __future__ import annotations

import pytest

from solvers.capacity import CutPricer
from solvers.census import load_census
from solvers.errors import SolverError
from solvers.frontier import compute_frontier
from solvers.rig import load_rig
from solvers.timing import calibrate
from solvers.timing_fit import fit_timing

RUNNING = (30, 18, 16)  # not the reference rig's declared (28, 20, 16), and never booted there


@pytest.fixture(scope="module")
def reference():
    return load_census("reference-hybrid-64"), load_rig("reference")


def test_the_given_incumbent_is_the_head_and_the_base_of_every_ratio(reference):
    model, rig = reference
    assert not rig.is_booted(RUNNING)
    frontier = compute_frontier(model, rig, incumbent=RUNNING)
    head = frontier.incumbent
    assert head.cut == RUNNING and head.x_pipelined == 1.0 and head.pool_ratio == 1.0
    assert head.pool_tokens == CutPricer(model, rig).price(RUNNING).pool_tokens
    assert head.provenance == "extrapolated"
    assert any("rescaled per layer" in note and "[30, 18, 16]" in note for note in frontier.notes)
    # ms per layer as measured at the declared cut, timed at the running cut.
    per_layer = [ms / n for ms, n in zip(rig.stage_ms, (28, 20, 16), strict=True)]
    assert head.pipelined_ms == pytest.approx(max(n * ms for n, ms in zip(RUNNING, per_layer, strict=True)))
    for point in frontier.points:
        assert point.pool_ratio == point.pool_tokens / head.pool_tokens
        assert point.x_pipelined == pytest.approx(head.pipelined_ms / point.pipelined_ms)
    default = compute_frontier(model, rig)
    assert [p.cut for p in frontier.points] == [p.cut for p in default.points]  # the set does not move


def test_measured_cuts_are_measured_provenance(reference):
    model, rig = reference
    plain = compute_frontier(model, rig, incumbent=RUNNING)
    live = next(point.cut for point in plain.points if not rig.is_booted(point.cut))
    frontier = compute_frontier(model, rig, incumbent=RUNNING, measured_cuts=[RUNNING, list(live)])
    assert frontier.incumbent.provenance == "measured"
    for point in frontier.points:
        expected = "measured" if point.cut == live or rig.is_booted(point.cut) else "extrapolated"
        assert point.provenance == expected
    assert sum(point.provenance == "measured" for point in frontier.points) >= 1


def test_a_fitted_timing_model_at_the_running_cut(reference):
    model, rig = reference
    truth, fixed = (1.8, 7.7, 7.3), (2.0, 5.0, 3.0)
    cuts = [RUNNING, (28, 20, 16), (32, 16, 16), (30, 20, 14), (30, 16, 18)]
    samples = [(cut, tuple(n * ms + f + 0.01 * k for n, ms, f in zip(cut, truth, fixed, strict=True)))
               for k in range(3) for cut in cuts]
    fit = fit_timing(samples, RUNNING, rig.noise_floor)
    frontier = compute_frontier(model, rig, timing=fit.model, incumbent=RUNNING, measured_cuts={c for c, _ in samples})
    head = frontier.incumbent
    assert head.cut == RUNNING and head.provenance == "measured"
    assert head.pipelined_ms == pytest.approx(fit.model.pipelined_ms(RUNNING))


def test_the_timing_model_must_share_the_incumbent(reference):
    model, rig = reference
    timing = calibrate((28, 20, 16), rig.stage_ms)
    with pytest.raises(SolverError, match=r"\[28, 20, 16\].*\[30, 18, 16\]"):
        compute_frontier(model, rig, timing=timing, incumbent=RUNNING)
    assert compute_frontier(model, rig, timing=timing, incumbent=(28, 20, 16)).incumbent.cut == (28, 20, 16)


@pytest.mark.parametrize(("incumbent", "measured", "message"), [
    ((30, 18, 15), (), "incumbent"),
    ((32, 32), (), "incumbent"),
    ((30, 18, True), (), "incumbent"),
    ((64, 0, 0), (), "incumbent"),
    ("30,18,16", (), "incumbent"),
    (None, [(30, 18, 15)], "measured cut"),
    (None, [(1, 2)], "measured cut"),
    (None, (30, 18, 16), "measured cut"),  # one cut, not a collection of cuts
    (None, "30,18,16", "measured_cuts"),
])
def test_bad_incumbent_or_measured_cuts_are_refused(reference, incumbent, measured, message):
    model, rig = reference
    with pytest.raises(SolverError, match=message):
        compute_frontier(model, rig, incumbent=incumbent, measured_cuts=measured)

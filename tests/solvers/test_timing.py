import pytest

from solvers.errors import SolverError
from solvers.timing import calibrate

STAGE_MS = (49.2, 154.8, 116.4)


def test_ms_per_layer_is_stage_time_over_layers():
    model = calibrate((28, 20, 16), STAGE_MS)
    assert model.ms_per_layer == pytest.approx((49.2 / 28, 154.8 / 20, 116.4 / 16))


def test_serial_and_pipelined_speedups_against_the_incumbent():
    timing = calibrate((28, 20, 16), STAGE_MS).evaluate((42, 12, 10))
    assert timing.serial_ms == pytest.approx(42 * 49.2 / 28 + 12 * 154.8 / 20 + 10 * 116.4 / 16)
    assert timing.pipelined_ms == pytest.approx(12 * 154.8 / 20)
    assert timing.x_serial == pytest.approx(320.4 / timing.serial_ms)
    assert timing.x_pipelined == pytest.approx(154.8 / timing.pipelined_ms)


def test_unmeasured_fixed_cost_flags_every_speedup_optimistic():
    assert "optimistic" in calibrate((28, 20, 16), STAGE_MS).evaluate((30, 18, 16)).flags
    measured = calibrate((28, 20, 16), STAGE_MS, fixed_ms=(5, 5, 5)).evaluate((30, 18, 16))
    assert "optimistic" not in measured.flags


def test_a_gain_inside_the_noise_floor_is_flagged():
    model = calibrate((28, 20, 16), STAGE_MS, noise_floor=0.141)
    assert "below_noise" in model.evaluate((28, 19, 17)).flags  # 154.8 -> 147.06 ms: 5%
    assert "below_noise" not in model.evaluate((42, 12, 10)).flags  # 67%


def test_a_serial_optimum_can_collapse_pipelined_throughput():
    model = calibrate((16, 4), (16.0, 8.0))  # 1 and 2 ms a layer; the fast rank is the bottleneck
    serial_best = model.evaluate((19, 1))  # nearly everything on the faster rank
    assert serial_best.x_serial > 1 and serial_best.x_pipelined < 1
    assert "needs_pipelining" not in serial_best.flags
    pipelined_win = model.evaluate((13, 7))  # balance onto the slower rank
    assert pipelined_win.x_pipelined > 1 and pipelined_win.x_serial < 1
    assert "needs_pipelining" in pipelined_win.flags


def test_fixed_cost_is_subtracted_before_dividing():
    model = calibrate((10, 10), (30.0, 50.0), fixed_ms=(10.0, 10.0))
    assert model.ms_per_layer == (2.0, 4.0)
    assert model.stage_ms((5, 15)) == (20.0, 70.0)


@pytest.mark.parametrize("args, message", [
    (((28, 20), STAGE_MS), "3 stage times"),
    (((28, 20, 16), (49.2, 0, 1)), "must be positive"),
    (((28, 0, 16), STAGE_MS), "positive whole number"),
])
def test_bad_calibration_input_is_refused(args, message):
    with pytest.raises(SolverError, match=message):
        calibrate(*args)


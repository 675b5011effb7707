"""The speed verdict's formulas (solvers/verdict.py): speedup, relative error, and a miss beyond the noise floor."""

import pytest

from solvers.errors import SolverError
from solvers.verdict import check_speed, relative_error, speedup


def test_speedup_is_before_over_after():
    assert speedup(16.0, 19.8) == pytest.approx(16.0 / 19.8)
    assert speedup(10.0, 5.0) == 2.0


def test_relative_error_is_a_fraction_of_the_prediction():
    assert relative_error(9100, 9120) == pytest.approx(-20 / 9120)
    assert relative_error(0.510, 0.875) == pytest.approx(0.510 / 0.875 - 1)


def test_the_issues_job_misses_its_prediction():
    """Issue 29: predicted x0.875, measured x0.510, judged against the rig's 14.1% floor."""
    check = check_speed(0.875, 0.510, 0.141)
    assert check.error == pytest.approx(-0.417142857, abs=1e-6)
    assert check.missed
    assert check.to_dict() == {"predicted": 0.875, "measured": 0.510, "noise_floor": 0.141, "error": -0.417143,
                               "missed": True}


@pytest.mark.parametrize("measured, missed", [(1.0, False), (1.14, False), (0.86, False), (1.15, True),
                                              (0.85, True)])
def test_a_miss_is_an_error_beyond_the_floor_either_way(measured, missed):
    """Pins the comparison |measured / predicted - 1| > floor: slower and faster than predicted both miss, and an
    error inside the floor (the A-vs-A spread) is no finding."""
    assert check_speed(1.0, measured, 0.141).missed is missed


def test_a_zero_floor_misses_any_difference():
    assert not check_speed(1.25, 1.25, 0.0).missed
    assert check_speed(1.25, 1.2501, 0.0).missed


@pytest.mark.parametrize("args, field", [
    ((0.0, 1.0, 0.1), "predicted"), ((1.0, -1.0, 0.1), "measured"), ((1.0, float("nan"), 0.1), "measured"),
    ((True, 1.0, 0.1), "predicted"), ((1.0, 1.0, 1.0), "noise_floor"), ((1.0, 1.0, -0.1), "noise_floor"),
    ((1.0, 1.0, None), "noise_floor"),
])
def test_bad_figures_are_refused_naming_them(args, field):
    with pytest.raises(SolverError, match=field):
        check_speed(*args)


def test_bad_speedup_and_error_inputs_are_refused():
    with pytest.raises(SolverError, match="after_ms"):
        speedup(10.0, 0.0)
    with pytest.raises(SolverError, match="predicted"):
        relative_error(1.0, 0.0)

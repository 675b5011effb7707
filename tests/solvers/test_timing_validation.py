"""Leave-one-layout-out validation of the fitted timing model."""

from __future__ import annotations

import json
import math

import pytest

from solvers.errors import SolverError
from solvers.timing_fit import fit_timing
from solvers.timing_validation import MIN_LAYOUTS, validate_timing

CUTS = [(16, 16, 16), (18, 14, 16), (14, 18, 16), (16, 14, 18), (16, 18, 14)]


def linear(cuts, per_layer=(2.0, 5.0, 3.0), fixed=(10.0, 8.0, 6.0)):
    return [(cut, tuple(n * m + f for n, m, f in zip(cut, per_layer, fixed, strict=True))) for cut in cuts]


def test_an_exactly_linear_rig_validates_to_zero_error():
    report = validate_timing(linear(CUTS), 0.141)
    assert report.validated and report.layouts_needed == 0 and report.measured == len(CUTS)
    assert [h.cut for h in report.layouts] == CUTS
    assert report.mean_abs_error == pytest.approx(0.0, abs=1e-9)
    assert report.max_abs_error == pytest.approx(0.0, abs=1e-9)
    assert report.summary.startswith("validated to ±0.0%")


def test_each_fold_is_fitted_without_its_own_layout():
    samples = linear(CUTS)
    samples[2] = (samples[2][0], (samples[2][1][0], samples[2][1][1] * 1.5, samples[2][1][2]))  # 14,18,16 slow
    report = validate_timing(samples, 0.141)
    held = {h.cut: h for h in report.layouts}
    others = [s for s in samples if s[0] != (14, 18, 16)]
    expected = fit_timing(others, others[0][0], 0.141).model.pipelined_ms((14, 18, 16))
    assert held[(14, 18, 16)].predicted_ms == pytest.approx(expected)
    assert held[(14, 18, 16)].measured_ms == pytest.approx(max(samples[2][1]))
    assert held[(14, 18, 16)].error == pytest.approx(expected / max(samples[2][1]) - 1)
    assert report.max_abs_error == pytest.approx(max(abs(h.error) for h in report.layouts))
    assert report.mean_abs_error == pytest.approx(sum(abs(h.error) for h in report.layouts) / len(CUTS))


@pytest.mark.parametrize("layouts", [1, 2])
def test_too_few_layouts_say_how_many_more_are_needed(layouts):
    report = validate_timing(linear(CUTS[:layouts]) * 3, 0.141)
    assert not report.validated and report.layouts_needed == MIN_LAYOUTS - layouts
    assert report.summary == f"not yet validated: {MIN_LAYOUTS - layouts} more measured layout(s) needed"
    data = json.loads(json.dumps(report.to_dict()))
    assert data["validated"] is False and data["layouts_needed"] == MIN_LAYOUTS - layouts
    assert len(data["layouts"]) == (0 if layouts == 1 else 2)


def test_to_dict_carries_every_figure():
    data = json.loads(json.dumps(validate_timing(linear(CUTS), 0.141).to_dict()))
    assert set(data) == {"validated", "measured_layouts", "layouts_needed", "min_layouts", "mean_abs_error",
                         "max_abs_error", "summary", "layouts"}
    assert set(data["layouts"][0]) == {"cut", "samples", "measured_ms", "predicted_ms", "error"}
    assert all(math.isfinite(row["error"]) for row in data["layouts"])


def test_bad_samples_are_refused():
    with pytest.raises(SolverError, match="at least one measured sample"):
        validate_timing([], 0.141)

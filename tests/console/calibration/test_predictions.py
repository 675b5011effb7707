"""Each executed job's prediction: made at the job's end from the timing fitted over what was measured before it,
completed by the first later measurement of the resulting layout with decode steps; errors and their summary.

Stage times here are exactly linear in the layer count with no fixed cost (calibration_helpers.stages), so the fit
recovers them and every predicted figure is known in advance."""

from __future__ import annotations

import logging

import pytest

from console.calibration import predictions, recording
from console.calibration.models import JobPrediction
from console.jobs.models import Job
from contracts.control import EngineState
from solvers.census import load_census
from solvers.frontier import default_timing
from solvers.rig import load_rig
from tests.support.calibration import URL, end_job, executed_job, measurement, stages, state_of

pytestmark = pytest.mark.django_db

@pytest.fixture
def measured(seed):
    """Three measured layouts that move every rank, the last at 8,4,4 (the layout before the job)."""
    for cut in ([7, 5, 4], [8, 5, 3], [8, 4, 4]):
        seed(cut, stages(cut))


def test_the_prediction_comes_from_the_fit_over_the_layouts_measured_before_the_job(measured, seed):
    job = executed_job([8, 4, 4], [9, 4, 3])
    seed([9, 5, 2], [99.0, 99.0, 99.0])  # measured after the job started: not in its prediction
    prediction = end_job(job, state_of(measurement([9, 4, 3], None, pool=9100)))
    assert (prediction.before_cut, prediction.after_cut, prediction.resulting_cut) == ([8, 4, 4], [9, 4, 3], [9, 4, 3])
    assert prediction.layout_diff == "8,4,4 -> 9,4,3" and prediction.comparable
    assert (prediction.predicted_pool, prediction.measured_pool) == (9120, 9100)
    assert prediction.pool_error == pytest.approx((9100 - 9120) / 9120, abs=1e-6)
    assert prediction.timing_source == "measured" and prediction.timing_samples == 3
    assert prediction.predicted_stage_ms == pytest.approx(stages([9, 4, 3]), abs=1e-3)
    assert prediction.predicted_speedup == pytest.approx(max(stages([8, 4, 4])) / max(stages([9, 4, 3])), abs=1e-5)
    low, high = prediction.predicted_speedup_interval
    assert low == pytest.approx(prediction.predicted_speedup, abs=1e-3) and high == pytest.approx(low, abs=1e-3)
    assert prediction.measured_stage_ms is None and prediction.awaiting_measurement


def test_the_first_later_measurement_with_decode_steps_completes_it(measured, seed):
    prediction = end_job(executed_job([8, 4, 4], [9, 4, 3]), state_of(measurement([9, 4, 3], None, pool=9120)))
    assert prediction.pool_error == 0.0
    seed([9, 4, 3], [19.8, 10.0, 9.0], tok_s=14.0)
    seed([9, 4, 3], [30.0, 30.0, 30.0])  # a later one changes nothing: the first completes it
    prediction.refresh_from_db()
    assert prediction.measured_stage_ms == [19.8, 10.0, 9.0] and prediction.measured_decode_tok_s == 14.0
    assert prediction.stage_errors == pytest.approx([0.1, 0.0, 0.0], abs=1e-4)
    assert prediction.stage_error == pytest.approx(0.1, abs=1e-4)
    assert prediction.measured_speedup == pytest.approx(16.0 / 19.8, abs=1e-5)  # 8,4,4 measured 16 ms pipelined
    assert [row["error"] for row in prediction.ranks()] == prediction.stage_errors


def test_a_rolled_back_job_is_not_compared(measured, seed):
    prediction = end_job(executed_job([8, 4, 4], [9, 4, 3]), state_of(measurement([8, 4, 4], None)))
    assert not prediction.comparable and prediction.pool_error is None
    assert any("not the predicted [9, 4, 3]" in note for note in prediction.notes)
    seed([8, 4, 4], [16.5, 10.0, 12.0])
    prediction.refresh_from_db()
    assert prediction.measured_stage_ms is None and prediction.stage_error is None


def test_without_measurements_the_rig_times_it_and_an_unknown_before_has_no_speedup():
    prediction = end_job(executed_job([7, 5, 4], [8, 4, 4]), state_of(measurement([8, 4, 4], None)))
    notes: list[str] = []
    expected = default_timing(load_rig("cpu-demo"), (8, 4, 4), notes).stage_ms((8, 4, 4))
    assert prediction.timing_source == "rig" and prediction.timing_samples == 0
    assert prediction.predicted_stage_ms == pytest.approx(expected, abs=1e-3)
    assert prediction.before_cut is None and prediction.predicted_speedup is None
    assert any("never measured or seen" in note for note in prediction.notes)
    assert load_census("demo-hybrid-16").num_layers == sum(prediction.after_cut)


def test_a_bookkeeping_failure_never_raises_into_the_worker(caplog, monkeypatch):
    job = executed_job([7, 5, 4], [8, 4, 4])
    state = EngineState.from_dict(state_of(measurement([8, 4, 4], None)))

    def cannot_predict(*args, **kwargs):
        raise KeyError("cut")  # the prediction cannot be made

    monkeypatch.setattr(predictions, "predict", cannot_predict)
    with caplog.at_level(logging.ERROR, logger="seam.calibration"):
        recording.note_job_end(job, state, URL)
    assert "recording its measurement or prediction failed" in caplog.text
    assert not JobPrediction.objects.exists() and Job.objects.get(pk=job.pk).status == "succeeded"


def test_summary_is_the_running_mean_and_max_of_the_sizes_newest_last(measured, seed):
    first = end_job(executed_job([8, 4, 4], [9, 4, 3], pool=10000), state_of(measurement([9, 4, 3], None, pool=9800)))
    seed([9, 4, 3], [18.0, 10.0, 9.9])
    second = end_job(executed_job([8, 4, 4], [8, 5, 3], pool=10000),
                     state_of(measurement([8, 5, 3], None, pool=10100)))
    assert (first.pool_error, second.pool_error) == (-0.02, 0.01)
    got = predictions.summary(JobPrediction.objects.order_by("-created", "-id"))
    assert got["jobs"] == 2
    assert got["pool_error"] == {"jobs": 2, "mean": 0.015, "max": 0.02, "last": 0.01}
    assert got["stage_error"] == {"jobs": 1, "mean": 0.1, "max": 0.1, "last": 0.1}
    assert predictions.prediction_dict(first)["layout_diff"] == "8,4,4 -> 9,4,3"

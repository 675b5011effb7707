"""Recording the engine's measurement: parsing crafted states, bad data skipped with its reason, and beat's bounded
periodic measurement (against a crafted /control/state served by httpx's MockTransport)."""

from __future__ import annotations

import logging

import pytest

from console.calibration import recording
from console.calibration.models import MeasuredLayout
from contracts.control import EngineState
from tests.support.calibration import URL, FakeEngine, measurement, state_of

pytestmark = pytest.mark.django_db


def test_a_measurement_is_recorded_with_every_figure():
    data = measurement([8, 4, 4], [18.8, 10.5, 10.4], pool=9120)
    row = recording.record(EngineState.from_dict(state_of(data)), "periodic", engine_url=URL)
    assert row == MeasuredLayout.objects.get()
    assert (row.model, row.rig, row.fingerprint, row.cut, row.source) == (
        "demo-checkpoint", "cpu-demo", "fp-8-4-4", [8, 4, 4], "periodic")
    assert row.decode_ms == (18.8, 10.5, 10.4) and row.pipelined_ms == 18.8 and row.decode_steps == 40
    assert row.decode["spread_ms"] == [0.5, 0.5, 0.5] and row.prefill["steps"] == 0
    assert (row.pool_predicted, row.pool_allocated, row.pool_real) == (9120, 9120, 9120)
    assert (row.decode_tok_s, row.latency["ttft_ms"], row.engine_url, row.shape["max_num_seqs"]) == (
        12.5, 120.0, URL, 8)


@pytest.mark.parametrize(("breakage", "named"), [
    (lambda m: m.update(cut=[8, 0, 8]), "measurement.cut"),
    (lambda m: m["decode"].update(median_ms=[1.0, 2.0]), "measurement.decode"),
    (lambda m: m["pool"].pop("real"), "measurement.pool.real: missing"),
    (lambda m: m.update(decode_tok_s=float("nan")), "measurement.decode_tok_s"),
    (lambda m: m.update(model=""), "measurement.model"),
])
def test_bad_data_is_skipped_with_the_reason_never_raised(caplog, breakage, named):
    state = state_of(measurement([8, 4, 4], [18.8, 10.5, 10.4]))
    breakage(state["measurement"])  # the measurement only: the state's own layout still reads
    with caplog.at_level(logging.WARNING, logger="seam.calibration"):
        assert recording.record(EngineState.from_dict(state), "job_end", engine_url=URL) is None
    assert MeasuredLayout.objects.count() == 0
    assert named in caplog.text


def test_a_state_without_a_measurement_is_skipped(caplog):
    state = state_of(measurement([8, 4, 4]))
    del state["measurement"]
    with caplog.at_level(logging.WARNING, logger="seam.calibration"):
        assert recording.record(EngineState.from_dict(state), "periodic", engine_url=URL) is None
    assert "has no `measurement`" in caplog.text and MeasuredLayout.objects.count() == 0


def test_periodic_rows_need_decode_steps_a_new_window_and_the_interval(settings):
    settings.SEAM_MEASURE_S = 3600
    engine = FakeEngine(state_of(measurement([7, 5, 4], None)))
    assert "no decode steps" in recording.measure(engine.client())
    engine.state = state_of(measurement([7, 5, 4], [14.6, 9.7, 8.2]))
    assert recording.measure(engine.client()).startswith("measured layout fp-7-5-4")
    engine.state = state_of(measurement([7, 5, 4], [14.0, 9.0, 8.0]))
    assert recording.measure(engine.client()).startswith("skipped: the last periodic measurement")
    settings.SEAM_MEASURE_S = 0
    engine.state = state_of(measurement([7, 5, 4], [14.6, 9.7, 8.2]))  # the window recorded last: an idle engine
    assert "has not changed" in recording.measure(engine.client())
    engine.state = state_of(measurement([7, 5, 4], [14.0, 9.0, 8.0]))
    assert recording.measure(engine.client()).startswith("measured")
    assert [row.decode_ms for row in MeasuredLayout.objects.order_by("id")] == [(14.6, 9.7, 8.2), (14.0, 9.0, 8.0)]


def test_periodic_measurement_of_an_unreachable_or_garbled_engine_records_nothing(settings):
    settings.SEAM_MEASURE_S = 0
    engine = FakeEngine(None)
    assert recording.measure(engine.client()).startswith("not measured: engine unreachable")
    engine.state = {**state_of(measurement([7, 5, 4])), "measurement": {"cut": "7,5,4"}}
    assert recording.measure(engine.client()).startswith("not measured: measurement.model: missing")
    assert MeasuredLayout.objects.count() == 0


def test_the_beat_entry_runs_the_task_every_seam_measure_s():
    from django.conf import settings

    from console.calibration.tasks import measure_engine_layout

    entry = settings.CELERY_BEAT_SCHEDULE["seam-measure-engine-layout"]
    assert entry == {"task": measure_engine_layout.name, "schedule": settings.SEAM_MEASURE_S}
    assert settings.SEAM_MEASURE_S == 30.0

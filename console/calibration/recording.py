"""Recording what the engine measured of the layout it serves (the `measurement` of GET /control/state).

- `note_job_end(job, state, engine_url)`: the worker calls it when a job's operation ended on the engine, with the
  engine's state it read then (once, for the layout watch too); it records the layout the engine then runs (source
  `job_end`) and the job's prediction (console.calibration.predictions).
- `measure(client)`: beat calls it every SEAM_MEASURE_S; it records a `periodic` row when the engine's window has
  decode steps, at most one per SEAM_MEASURE_S per engine, and not when the window is the one recorded last (an
  idle engine keeps reporting its last window: repeats of one window would read as a layout without noise).

Neither ever raises into its caller: an engine that cannot be read or a measurement that does not parse is logged
with the reason and skipped.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.calibration import predictions
from console.calibration.models import MeasuredLayout, MeasurementSource
from console.engine import EngineClient, EngineError
from console.jobs.models import Job
from contracts.control import EngineState
from contracts.measurement import LayoutMeasurement

__all__ = ["DEFAULT_MEASURE_S", "measure", "note_job_end", "record"]

log = logging.getLogger("seam.calibration")

DEFAULT_MEASURE_S = 30.0


def measure_interval_s() -> float:
    return float(getattr(settings, "SEAM_MEASURE_S", DEFAULT_MEASURE_S))


def _parse(state: EngineState, url: str) -> tuple[LayoutMeasurement | None, str]:
    """The state's measurement, or None and why (logged): missing, or naming the field that does not parse."""
    if state.measurement is not None:
        return state.measurement, ""
    why = state.measurement_error or "the engine's state has no `measurement` (an engine too old to report one?)"
    log.warning("no measurement recorded from %s: %s", url, why)
    return None, why


def _save(measurement: LayoutMeasurement, source: str, job: Job | None, url: str) -> MeasuredLayout:
    with transaction.atomic():
        row = MeasuredLayout.from_measurement(measurement, engine_url=url, source=source, job=job)
        row.save()
        if row.decode_steps:
            predictions.fill_measured(row)
    return row


def record(state: EngineState, source: str, job: Job | None = None,
           engine_url: str | None = None) -> MeasuredLayout | None:
    """Record the state's measurement; None (logged with the reason) when it is missing or did not parse."""
    if source not in MeasurementSource.values:
        raise ValueError(f"source {source!r}: expected one of {', '.join(MeasurementSource.values)}")
    url = engine_url or settings.ENGINE_URL
    measurement, _why = _parse(state, url)
    return None if measurement is None else _save(measurement, source, job, url)


def note_job_end(job: Job, state: EngineState, engine_url: str) -> None:
    """The job's operation ended: record the layout the engine runs now (its `state`, read by the worker) and the
    job's prediction against it."""
    try:
        row = record(state, MeasurementSource.JOB_END, job=job, engine_url=engine_url)
        predictions.predict(job, state, row, engine_url=engine_url)
    except Exception:  # the job has ended as the engine said; a bookkeeping failure here must not change that
        log.exception("job %s: recording its measurement or prediction failed", job.pk)


def _same_window(row: MeasuredLayout, measurement: LayoutMeasurement) -> bool:
    return row.fingerprint == measurement.fingerprint and row.decode == measurement.decode.to_dict()


def measure(client: EngineClient | None = None) -> str:
    """Beat's periodic measurement; returns what was done, in words."""
    if client is None:
        with EngineClient() as own:
            return measure(own)
    url = client.base_url
    newest = MeasuredLayout.objects.filter(engine_url=url, source=MeasurementSource.PERIODIC).first()
    if newest is not None and timezone.now() - newest.measured_at < timedelta(seconds=measure_interval_s()):
        return f"skipped: the last periodic measurement is from {newest.measured_at:%H:%M:%S}"
    try:
        state = client.state()
    except EngineError as error:
        return f"not measured: {error}"
    measurement, why = _parse(state, url)
    if measurement is None:
        return f"not measured: {why}"
    if not measurement.decode.steps:
        return f"not measured: layout {measurement.fingerprint} has no decode steps in its window"
    last = MeasuredLayout.objects.filter(engine_url=url).with_decode().first()
    if last is not None and _same_window(last, measurement):
        return f"not measured: layout {measurement.fingerprint}'s window has not changed since it was recorded"
    row = _save(measurement, MeasurementSource.PERIODIC, None, url)
    return f"measured layout {row.fingerprint} ({row.decode_steps} decode steps)"

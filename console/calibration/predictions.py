"""Each executed job's prediction against what the engine then measured (the JobPrediction row), and their summary.

Predicted, when the job's operation ends: the plan's own pool (solvers/plans.py prices it; the plan carries no stage
times), and per rank stage ms and the pipelined speedup from the timing fitted over the measurements recorded before
the job started (console.calibration.fitting), at the plan's cut with the layout before the job as incumbent.
Measured: the pool the ranks allocated at the job's end, and the stage ms and decode tok/s of the first later
measurement of the resulting layout that has decode steps. Errors are (measured - predicted) / predicted, computed
only when the engine runs the predicted cut and shape (not after a rollback or a failure). Each time a prediction is
made or completed, the job's speed verdict follows (console.jobs.verdicts), judged by the noise floor stored with the
prediction.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.calibration.fitting import Timing, timing_for
from console.calibration.models import JobPrediction, MeasuredLayout
from console.calibration.running import fit_samples, newest_per_layout
from console.jobs import verdicts
from console.jobs.models import Job, LayoutObservation
from contracts.control import EngineState
from solvers.errors import SolverError
from solvers.rig import load_rig
from solvers.verdict import relative_error, speedup

__all__ = ["fill_measured", "predict", "prediction_dict", "summary"]


def _error(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return round(relative_error(measured, predicted), 6)


def _cut_of(fingerprint: str) -> list[int] | None:
    """The cut of a layout the console saw, by fingerprint: from a measurement, else from the layout watch."""
    for rows in (MeasuredLayout.objects.filter(fingerprint=fingerprint),
                 LayoutObservation.objects.filter(fingerprint=fingerprint)):
        row = rows.first()
        if row is not None:
            return list(row.cut)
    return None


def _timing(model: str | None, rig_name: str | None, before: Sequence[int], started, notes: list[str]
            ) -> Timing | None:
    """The timing fitted over the measurements of the job's model and rig recorded before it started."""
    rows = newest_per_layout(MeasuredLayout.objects.filter(model=model, rig=rig_name, measured_at__lt=started)
                             .with_decode())
    samples = [s for s in fit_samples(rows) if len(s.cut) == len(before) and sum(s.cut) == sum(before)]
    try:
        rig = load_rig(settings.SEAM_RIG)
        if rig.name != rig_name and not samples:
            notes.append(f"no stage ms predicted: nothing measured before the job, and SEAM_RIG is {rig.name!r}, "
                         f"not the engine's rig {rig_name!r}")
            return None
        return timing_for(samples, before, rig)
    except SolverError as error:
        notes.append(f"no stage ms predicted: {error}")
        return None


def predict(job: Job, state: EngineState, row: MeasuredLayout | None, engine_url: str) -> JobPrediction:
    """The job's prediction, made as its operation ended on the engine; `state` is the engine's state then."""
    planned = job.prediction if isinstance(job.prediction, dict) else {}
    after = list(planned.get("cut") or state.cut)
    before = _cut_of(job.incumbent_fingerprint)
    notes: list[str] = [] if before else [f"the layout before the job ({job.incumbent_fingerprint}) was never "
                                          "measured or seen: no speedup predicted"]
    comparable = state.cut.to_list() == after and state.shape.to_dict() == planned.get("shape")
    if not comparable:
        notes.append(f"the engine runs {state.cut} with its shape, not the predicted {after}: no errors computed")
    model, rig = (row.model, row.rig) if row else (state.model, state.rig)
    timing = _timing(model, rig, before or after, job.started_at or timezone.now(), notes)
    predicted_pool = planned.get("pool_tokens")
    measured_pool = row.pool_allocated if row else None
    prediction = JobPrediction(
        job=job, engine_url=engine_url[:255], before_cut=before, before_fingerprint=job.incumbent_fingerprint[:64],
        after_cut=after, resulting_cut=state.cut.to_list(), resulting_fingerprint=state.fingerprint[:64],
        comparable=comparable, predicted_pool=predicted_pool, measured_pool=measured_pool,
        pool_error=_error(measured_pool, predicted_pool) if comparable else None, notes=notes)
    if timing is not None:
        prediction.timing_source, prediction.timing_samples = timing.source, timing.fit.samples if timing.fit else 0
        prediction.noise_floor = timing.model.noise_floor
        prediction.predicted_stage_ms = [round(ms, 4) for ms in timing.model.stage_ms(after)]
        if before:
            prediction.predicted_speedup = round(timing.model.evaluate(after).x_pipelined, 6)
            prediction.predicted_speedup_interval = timing.speedup_interval(after)
    if row is not None and row.decode_steps and comparable:
        _fill(prediction, row)
    with transaction.atomic():
        prediction.save()
        _judge(prediction)
    return prediction


def _judge(prediction: JobPrediction) -> None:
    """The job's speed verdict from its prediction as it stands (console.jobs.verdicts)."""
    verdicts.judge_speed(prediction.job_id, predicted=prediction.predicted_speedup,
                         measured=prediction.measured_speedup, noise_floor=prediction.noise_floor,
                         awaiting=prediction.awaiting_measurement)


def _fill(prediction: JobPrediction, row: MeasuredLayout) -> None:
    measured = list(row.decode_ms)
    prediction.measured_stage_ms, prediction.measured_decode_tok_s = measured, row.decode_tok_s
    prediction.measurement, prediction.measured_at = row, row.measured_at
    if prediction.predicted_stage_ms and len(prediction.predicted_stage_ms) == len(measured):
        errors = [_error(m, p) for m, p in zip(measured, prediction.predicted_stage_ms, strict=True)]
        prediction.stage_errors = errors
        prediction.stage_error = max((e for e in errors if e is not None), key=abs, default=None)
    before = MeasuredLayout.objects.filter(fingerprint=prediction.before_fingerprint, engine_url=row.engine_url,
                                           measured_at__lt=prediction.created).with_decode().first()
    if before is not None and before.pipelined_ms:
        prediction.measured_speedup = round(speedup(before.pipelined_ms, max(measured)), 6)


def fill_measured(row: MeasuredLayout) -> int:
    """Complete the predictions still waiting for a measurement of `row`'s layout; returns how many."""
    waiting = JobPrediction.objects.filter(resulting_fingerprint=row.fingerprint, engine_url=row.engine_url,
                                           comparable=True, measured_stage_ms__isnull=True)
    filled = 0
    for prediction in waiting:
        _fill(prediction, row)
        prediction.save()
        _judge(prediction)
        filled += 1
    return filled


def _stat(errors: list[float]) -> dict:
    """mean and max of |error| over the jobs, and the newest job's |error| (`errors` newest first)."""
    sizes = [abs(error) for error in errors]
    return {"jobs": len(sizes), "mean": round(statistics.fmean(sizes), 6) if sizes else None,
            "max": max(sizes) if sizes else None, "last": sizes[0] if sizes else None}


def summary(predictions: Iterable[JobPrediction]) -> dict:
    """Running mean and max of |pool error| and |stage error| (`predictions` newest first)."""
    rows = list(predictions)
    return {"jobs": len(rows),
            "pool_error": _stat([p.pool_error for p in rows if p.pool_error is not None]),
            "stage_error": _stat([p.stage_error for p in rows if p.stage_error is not None])}


def prediction_dict(prediction: JobPrediction) -> dict:
    job = prediction.job
    return {"job": job.pk, "kind": job.kind, "status": job.status,
            "finished_at": job.finished_at.isoformat() if job.finished_at else None,
            "layout_diff": prediction.layout_diff, "before_cut": prediction.before_cut,
            "after_cut": prediction.after_cut, "resulting_cut": prediction.resulting_cut,
            "comparable": prediction.comparable,
            "pool": {"predicted": prediction.predicted_pool, "measured": prediction.measured_pool,
                     "error": prediction.pool_error},
            "stage_ms": {"predicted": prediction.predicted_stage_ms, "measured": prediction.measured_stage_ms,
                         "errors": prediction.stage_errors, "error": prediction.stage_error},
            "speedup": {"predicted": prediction.predicted_speedup,
                        "interval": prediction.predicted_speedup_interval,
                        "measured": prediction.measured_speedup, "noise_floor": prediction.noise_floor,
                        "verdict": job.speed_verdict},
            "decode_tok_s": prediction.measured_decode_tok_s,
            "timing": {"source": prediction.timing_source, "samples": prediction.timing_samples},
            "measured_at": prediction.measured_at.isoformat() if prediction.measured_at else None,
            "notes": list(prediction.notes)}

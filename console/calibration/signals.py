"""Receivers: a job's operation ended on the engine (console.jobs.signals), so record the layout the engine now runs
and the job's prediction against it (console.calibration.recording)."""

from __future__ import annotations

from django.dispatch import receiver

from console.calibration import recording
from console.jobs.models import Job
from console.jobs.signals import job_ended_on_engine
from contracts.control import EngineState


@receiver(job_ended_on_engine, dispatch_uid="console.calibration.record_job_end")
def record_job_end(sender, *, job: Job, state: EngineState, engine_url: str, **_) -> None:
    recording.note_job_end(job, state, engine_url)  # never raises

"""The signal the jobs app sends for the apps built on it, so that jobs never imports them (console.calibration
records each job's measurement and prediction from it)."""

from __future__ import annotations

from django.dispatch import Signal

__all__ = ["job_ended_on_engine"]

# Sent by the worker once a job's operation has ended on the engine and the engine's state after it has been read
# (not when it could not be), with `job`, `state` (that one read, shared with the layout watch) and `engine_url`.
# Receivers must not raise: the job has ended as the engine said.
job_ended_on_engine = Signal()

"""Celery task: beat's periodic measurement of the engine's running layout (console.calibration.recording)."""

from __future__ import annotations

from celery import shared_task

from console.calibration import recording

__all__ = ["measure_engine_layout"]


@shared_task(name="console.calibration.tasks.measure_engine_layout", ignore_result=True)
def measure_engine_layout() -> str:
    """Record what the engine measured of its layout, when its window has new decode steps."""
    return recording.measure()

"""Calibration models, one concern per file."""

from console.calibration.models.job_prediction import JobPrediction
from console.calibration.models.measured_layout import MeasuredLayout, MeasurementSource

__all__ = ["JobPrediction", "MeasuredLayout", "MeasurementSource"]

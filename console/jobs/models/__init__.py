"""Job models, one concern per file."""

from console.jobs.models.approval import Approval
from console.jobs.models.health_observation import EngineHealth, HealthObservation
from console.jobs.models.job import Job
from console.jobs.models.layout_observation import LayoutCause, LayoutObservation

__all__ = ["Approval", "EngineHealth", "HealthObservation", "Job", "LayoutCause", "LayoutObservation"]

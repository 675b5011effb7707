"""Job models, one concern per file."""

from console.jobs.models.approval import Approval
from console.jobs.models.job import Job

__all__ = ["Approval", "Job"]

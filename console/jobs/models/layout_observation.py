"""A layout the console saw the engine run, and what explains it: one of its jobs, its first look, or nothing.

The newest observation of an engine is the layout the console knows that engine runs. A job's end adds one
(cause `job`); the layout watch (console.jobs.layout_watch) adds one when the engine's fingerprint moved, either
explained by a job that ended since or, when nothing the console did explains it, `unexplained`: audited and shown
on the dashboard. An engine that restarted under a job's apply and came back on a layout the job did not lead to
is noted `restarted` at that job's end (with the job, which it does not credit): audited and shown too.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

__all__ = ["LayoutCause", "LayoutObservation"]


class LayoutCause(models.TextChoices):
    FIRST_SEEN = "first_seen", "First seen"
    JOB = "job", "A job of the console"
    UNEXPLAINED = "unexplained", "No job caused it"
    RESTARTED_MID_APPLY = "restarted", "The engine restarted mid-apply"


class LayoutObservationQuerySet(models.QuerySet):
    def known(self, engine_url: str) -> LayoutObservation | None:
        """The layout the console last knew `engine_url` to run."""
        return self.filter(engine_url=engine_url).order_by("-observed_at", "-id").first()


class LayoutObservation(models.Model):
    engine_url = models.CharField(max_length=255, help_text="The engine observed (a console may drive another later).")
    fingerprint = models.CharField(max_length=64)
    cut = models.JSONField(help_text="Layers per rank.")
    shape = models.JSONField(help_text="The serving shape.")
    cause = models.CharField(max_length=16, choices=LayoutCause.choices)
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="layout_observations", help_text="The job whose operation led here.")
    before = models.JSONField(null=True, blank=True,
                              help_text="The layout known before ({fingerprint, cut, shape}); none at first sight.")
    observed_at = models.DateTimeField(default=timezone.now)

    objects = LayoutObservationQuerySet.as_manager()

    class Meta:
        ordering = ["-observed_at", "-id"]
        indexes = [models.Index(fields=["engine_url", "observed_at"], name="jobs_layout_engine_seen")]

    def __str__(self) -> str:
        return f"layout {self.fingerprint} of {self.engine_url} ({self.cause})"

    def layout(self) -> dict:
        return {"fingerprint": self.fingerprint, "cut": self.cut, "shape": self.shape}

"""The health the console last saw an engine in: ok, unhealthy (the engine says why) or unreachable.

The layout watch (console.jobs.layout_watch) reads the engine's state every SEAM_LAYOUT_WATCH_S; the health watch
(console.jobs.health_watch) adds a row only when the status or its reason moved from the newest one, so the rows are
the engine's health changes and the newest is what the console knows now.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

__all__ = ["EngineHealth", "HealthObservation"]


class EngineHealth(models.TextChoices):
    OK = "ok", "Healthy"
    UNHEALTHY = "unhealthy", "Unhealthy (broken or in a recovery loop)"
    UNREACHABLE = "unreachable", "Unreachable"


class HealthObservationQuerySet(models.QuerySet):
    def known(self, engine_url: str) -> HealthObservation | None:
        """The health the console last knew `engine_url` to be in."""
        return self.filter(engine_url=engine_url).order_by("-observed_at", "-id").first()


class HealthObservation(models.Model):
    engine_url = models.CharField(max_length=255)
    status = models.CharField(max_length=16, choices=EngineHealth.choices)
    reason = models.CharField(max_length=500, blank=True, default="",
                              help_text="Why it is not ok: the engine's reason, or why it could not be read.")
    observed_at = models.DateTimeField(default=timezone.now)

    objects = HealthObservationQuerySet.as_manager()

    class Meta:
        ordering = ["-observed_at", "-id"]
        indexes = [models.Index(fields=["engine_url", "observed_at"], name="jobs_health_engine_seen")]

    def __str__(self) -> str:
        return f"{self.engine_url}: {self.status}"

    def to_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason}

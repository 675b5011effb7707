"""One measurement of a layout the engine served (contracts/measurement.py's LayoutMeasurement), as recorded.

Rows come from a job's end (the layout the job left; its window is usually still empty) and from beat every
SEAM_MEASURE_S (only with decode steps). `model` and `rig` are the names the engine reports: its checkpoint
folder's name and its rig's name.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from contracts.measurement import LayoutMeasurement, StageStats

__all__ = ["MeasuredLayout", "MeasurementSource"]


class MeasurementSource(models.TextChoices):
    JOB_END = "job_end", "A job's end"
    PERIODIC = "periodic", "Periodic"


class MeasuredLayoutQuerySet(models.QuerySet):
    def with_decode(self) -> MeasuredLayoutQuerySet:
        """Rows whose window had decode steps: the ones with stage medians to fit."""
        return self.filter(decode_steps__gt=0)


class MeasuredLayout(models.Model):
    engine_url = models.CharField(max_length=255)
    model = models.CharField(max_length=255, help_text="The engine's model name: its checkpoint folder's name.")
    rig = models.CharField(max_length=255, help_text="The engine's rig name.")
    fingerprint = models.CharField(max_length=64, db_index=True)
    cut = models.JSONField(help_text="Layers per rank.")
    shape = models.JSONField(help_text="The serving shape.")
    source = models.CharField(max_length=16, choices=MeasurementSource.choices)
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="measured_layouts", help_text="The job whose end recorded it.")
    decode_steps = models.PositiveIntegerField(default=0, help_text="Decode steps in the engine's window.")
    decode = models.JSONField(help_text="Decode StageStats: steps, median tokens, per rank median and spread ms.")
    prefill = models.JSONField(help_text="Prefill StageStats, as decode.")
    decode_tok_s = models.FloatField()
    prefill_tok_s = models.FloatField()
    pool_predicted = models.BigIntegerField(null=True, blank=True, help_text="The planner's pool, tokens.")
    pool_allocated = models.BigIntegerField(null=True, blank=True,
                                            help_text="The smallest KV pool an attention rank allocated, tokens.")
    pool_real = models.BigIntegerField(null=True, blank=True, help_text="What the scheduler hands out, tokens.")
    latency = models.JSONField(help_text="Median time to first token and between tokens of recent requests.")
    measured_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = MeasuredLayoutQuerySet.as_manager()

    class Meta:
        ordering = ["-measured_at", "-id"]
        indexes = [models.Index(fields=["model", "rig"], name="calibration_measured_model_rig")]

    def __str__(self) -> str:
        return f"measurement of {self.cut} ({self.source}) at {self.measured_at:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def from_measurement(cls, measurement: LayoutMeasurement, *, engine_url: str, source: str,
                         job=None) -> MeasuredLayout:
        """An unsaved row holding `measurement`."""
        return cls(engine_url=engine_url[:255], model=measurement.model[:255], rig=measurement.rig[:255],
                   fingerprint=measurement.fingerprint[:64], cut=list(measurement.cut), shape=dict(measurement.shape),
                   source=source, job=job, decode_steps=measurement.decode.steps,
                   decode=measurement.decode.to_dict(), prefill=measurement.prefill.to_dict(),
                   decode_tok_s=measurement.decode_tok_s, prefill_tok_s=measurement.prefill_tok_s,
                   pool_predicted=measurement.pool.predicted, pool_allocated=measurement.pool.allocated,
                   pool_real=measurement.pool.real, latency=measurement.latency.to_dict())

    @property
    def decode_stats(self) -> StageStats:
        return StageStats.from_dict(self.decode, "decode")

    @property
    def decode_ms(self) -> tuple[float, ...] | None:
        """Per rank median decode stage ms; None without decode steps."""
        return self.decode_stats.median_ms

    @property
    def pipelined_ms(self) -> float | None:
        ms = self.decode_ms
        return None if ms is None else max(ms)

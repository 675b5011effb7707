"""What the console predicted for one executed job, against what the engine then measured (predictions.py).

Created when the job's operation ends on the engine. Predicted: the plan's pool (its own figure), and per rank stage
ms and the pipelined speedup from the timing fitted over the measurements recorded before the job, evaluated at the
plan's cut with the layout before the job as incumbent. Measured: the pool the ranks allocated at the job's end, and
the stage ms and decode tok/s of the first later measurement of the resulting layout that has decode steps.
Errors are fractions of the prediction: (measured - predicted) / predicted.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

__all__ = ["JobPrediction"]


class JobPrediction(models.Model):
    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="layout_prediction")
    engine_url = models.CharField(max_length=255)
    before_cut = models.JSONField(null=True, blank=True, help_text="The cut before the job; None if unknown.")
    before_fingerprint = models.CharField(max_length=64, blank=True, default="")
    after_cut = models.JSONField(help_text="The cut the plan predicted for.")
    resulting_cut = models.JSONField(help_text="The cut the engine ran once the job ended.")
    resulting_fingerprint = models.CharField(max_length=64, db_index=True)
    # A rollback or a failure leaves another layout running than the predicted one: nothing to compare then.
    comparable = models.BooleanField(help_text="The engine runs the predicted cut and shape; errors only then.")
    predicted_pool = models.BigIntegerField(null=True, blank=True)
    measured_pool = models.BigIntegerField(null=True, blank=True)
    pool_error = models.FloatField(null=True, blank=True)
    predicted_stage_ms = models.JSONField(null=True, blank=True)
    predicted_speedup = models.FloatField(null=True, blank=True, help_text="Pipelined, after vs before.")
    predicted_speedup_interval = models.JSONField(null=True, blank=True,
                                                  help_text="[low, high]; high None when unbounded.")
    timing_source = models.CharField(max_length=16, blank=True, default="",
                                     help_text="measured (fitted) or rig (the rig's stage ms).")
    timing_samples = models.PositiveIntegerField(default=0)
    noise_floor = models.FloatField(null=True, blank=True,
                                    help_text="The noise floor the speedup was predicted with (the fit's, else the "
                                              "rig's): a miss is a speedup error beyond it.")
    measured_stage_ms = models.JSONField(null=True, blank=True)
    measured_decode_tok_s = models.FloatField(null=True, blank=True)
    measured_speedup = models.FloatField(null=True, blank=True,
                                         help_text="Measured pipelined decode ms before / after.")
    stage_errors = models.JSONField(null=True, blank=True, help_text="Per rank, fractions.")
    stage_error = models.FloatField(null=True, blank=True, help_text="The per rank error largest in size.")
    measurement = models.ForeignKey("calibration.MeasuredLayout", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+", help_text="The measurement that filled in the stage ms.")
    measured_at = models.DateTimeField(null=True, blank=True)
    notes = models.JSONField(default=list)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"prediction of job {self.job_id}: {self.before_cut} -> {self.after_cut}"

    @property
    def awaiting_measurement(self) -> bool:
        return self.comparable and self.measured_stage_ms is None

    @property
    def layout_diff(self) -> str:
        before = ",".join(map(str, self.before_cut)) if self.before_cut else "?"
        return f"{before} -> {','.join(map(str, self.after_cut))}"

    def ranks(self) -> list[dict]:
        """Per rank: predicted and measured stage ms and the error, for the job page."""
        count = len(self.after_cut)

        def at(values: list | None, rank: int):
            return values[rank] if values and rank < len(values) else None

        return [{"rank": rank, "predicted_ms": at(self.predicted_stage_ms, rank),
                 "measured_ms": at(self.measured_stage_ms, rank), "error": at(self.stage_errors, rank)}
                for rank in range(count)]

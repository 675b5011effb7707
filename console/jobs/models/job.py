"""A reconfiguration job: one reviewed plan, carried from proposal through the engine to its outcome."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from console.jobs.choices import ACTIVE, TERMINAL, JobKind, JobStatus, SpeedVerdict

__all__ = ["Job"]


class Job(models.Model):
    kind = models.CharField(max_length=16, choices=JobKind.choices)
    target = models.JSONField(help_text="The plan's target as the engine normalised it.")
    plan = models.JSONField(help_text="The plan exactly as the engine priced it: what reviewers approve.")
    plan_hash = models.CharField(max_length=64, db_index=True, help_text="sha256 of the plan's canonical JSON.")
    prediction = models.JSONField(help_text="The planner's prediction (the plan's `predicted`).")
    measured = models.JSONField(null=True, blank=True, help_text="What the engine measured after the operation.")
    operation = models.JSONField(null=True, blank=True,
                                 help_text="The engine's own operation record at the end (incl. `previous` on a "
                                           "rollback).")
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PROPOSED, db_index=True)
    proposer = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                 related_name="proposed_jobs")
    proposer_name = models.CharField(max_length=150, help_text="The proposer's username, frozen.")
    engine_operation_id = models.CharField(max_length=128, blank=True, default="")
    engine_boot_id = models.CharField(max_length=64, blank=True, default="",
                                      help_text="The engine's boot id when the worker applied the plan: another one "
                                                "later means the engine restarted under the job.")
    phase = models.CharField(max_length=32, blank=True, default="", help_text="The engine operation's phase.")
    progress = models.FloatField(default=0.0)
    error = models.TextField(blank=True, default="")
    created = models.DateTimeField(default=timezone.now, editable=False)
    # Set by every write (the lifecycle writes with .update(), which skips auto_now): the worker's heartbeat.
    updated = models.DateTimeField(default=timezone.now)
    # Celery bookkeeping: the request that queued it, the task and worker that ran it, and when.
    request_id = models.CharField(max_length=64, blank=True, default="")
    task_id = models.CharField(max_length=255, blank=True, default="")
    worker = models.CharField(max_length=255, blank=True, default="")
    queued_at = models.DateTimeField(null=True, blank=True)
    # A scheduled change: once approved it waits `approved` until then, when beat queues it (console.jobs.schedule).
    not_before = models.DateTimeField(null=True, blank=True,
                                      help_text="Run no earlier than this; null runs as soon as it is approved.")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Judged on speed as well as memory once the new layout is measured (console.jobs.verdicts).
    speed_verdict = models.CharField(max_length=16, choices=SpeedVerdict.choices, blank=True, default="",
                                     help_text="The measured speedup against the predicted one; blank: no verdict.")
    incumbent_layout = models.JSONField(null=True, blank=True,
                                        help_text="The layout the plan was made for, as the engine reported it then "
                                                  "({fingerprint, cut, shape}): what a revert goes back to.")
    reverts = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reverted_by",
                                help_text="The job whose missed prediction this job proposes to undo.")

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["status", "updated"], name="jobs_job_status_updated")]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.kind}, {self.status})"

    @property
    def incumbent_fingerprint(self) -> str:
        """The layout the plan was made for; the worker refuses to apply it to any other (docs/architecture.md §4,
        rule 4)."""
        return self.plan.get("incumbent_fingerprint", "")

    @property
    def outcome(self) -> str:
        """The status with the speed verdict, e.g. "succeeded, missed prediction"."""
        return f"{self.status}, {self.get_speed_verdict_display()}" if self.speed_verdict else self.status

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

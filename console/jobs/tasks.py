"""Celery tasks: run one job, settle what dead workers left behind, watch the engine's layout, queue scheduled jobs
that are due, deliver webhooks. The logic is in console.jobs.worker, console.jobs.layout_watch,
console.jobs.lifecycle and console.jobs.webhooks (which declares its own task, named here so the worker loads it).
Nothing below imports this module: the lifecycle hands a job over by the task's name (lifecycle.RUN_JOB)."""

from __future__ import annotations

from celery import shared_task

from console.audit.request_id import bind_request_id, is_sane_request_id
from console.jobs import layout_watch, lifecycle, worker
from console.jobs.webhooks import deliver as deliver_webhook

__all__ = ["deliver_webhook", "queue_scheduled_jobs", "reconcile_jobs", "run_job", "watch_engine_layout"]


@shared_task(name=lifecycle.RUN_JOB, bind=True, ignore_result=True, acks_late=True)
def run_job(self, job_id: int, request_id: str | None = None) -> str:
    """Idempotent, keyed by job id: a second delivery of a running or finished job does nothing."""
    # Audit events the worker records carry the id of the request that queued the job.
    with bind_request_id(request_id if is_sane_request_id(request_id) else None):
        return worker.execute(int(job_id), worker=self.request.hostname or "", task_id=self.request.id or "")


@shared_task(name="console.jobs.tasks.reconcile_jobs", ignore_result=True)
def reconcile_jobs(older_than_s: float | None = None) -> list[list]:
    return [[job_id, outcome] for job_id, outcome in worker.reconcile(older_than_s=older_than_s)]


@shared_task(name="console.jobs.tasks.watch_engine_layout", ignore_result=True)
def watch_engine_layout() -> str:
    """Audit (once) a layout change of the engine that no job of the console caused."""
    return layout_watch.watch()


@shared_task(name="console.jobs.tasks.queue_scheduled_jobs", ignore_result=True)
def queue_scheduled_jobs() -> list[int]:
    """Queue the approved jobs whose not_before has come (beat, every SEAM_SCHEDULE_POLL_S)."""
    return lifecycle.queue_due()

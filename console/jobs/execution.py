"""The worker's side of the job service layer (console.jobs.worker calls these through console.jobs.services):
claim a queued job, record the engine's operation, report progress, end it in a named state, hand it to Celery."""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction
from django.utils import timezone

from console.audit.services import record
from console.jobs.choices import JobStatus
from console.jobs.models import Job
from console.jobs.transitions import job_id_of, lost, pool_of, publish_job_id, publish_on_commit, subject_of, transition
from contracts.control import Operation

__all__ = ["WORKER_ENDINGS", "finish", "hand_off", "note_engine_boot", "record_operation", "report_progress", "start"]

log = logging.getLogger("seam.jobs")

WORKER_ENDINGS = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.ROLLED_BACK, JobStatus.STALE})


def start(job: Job | int, *, worker: str = "", task_id: str = "") -> Job:
    """Claim a queued job for this worker (queued -> running); Conflict if another delivery got it first."""
    now = timezone.now()
    return transition(job_id_of(job), JobStatus.QUEUED, JobStatus.RUNNING, actor=None,
                      payload={"worker": worker, "task_id": task_id}, started_at=now, worker=worker[:255],
                      task_id=task_id[:255], phase="", progress=0.0, error="")


def note_engine_boot(job: Job | int, boot_id: str) -> bool:
    """The boot id of the engine the worker is about to give the plan to, kept so that the job's end can tell the
    engine restarted under it (console.jobs.worker). Only before the plan is sent; no audit event."""
    return bool(Job.objects.filter(pk=job_id_of(job), status=JobStatus.RUNNING, engine_operation_id="").update(
        engine_boot_id=str(boot_id or "")[:64]))


def record_operation(job: Job | int, operation_id: str, *, approvers: list[str] | None = None,
                     reconciled: bool = False) -> Job:
    """The engine accepted the plan as `operation_id`; recorded at once so the reconciler can find it.

    `approvers`: the reviewers the worker's attestation named to the engine. `reconciled`: the reconciler found the
    operation on the engine by plan hash after the worker died without recording it (the approvers then unknown).
    """
    job_id = job_id_of(job)
    with transaction.atomic():
        changed = Job.objects.filter(pk=job_id, status=JobStatus.RUNNING, engine_operation_id="").update(
            engine_operation_id=operation_id[:128], updated=timezone.now())
        if changed != 1:
            raise lost(job_id, JobStatus.RUNNING, f"record operation {operation_id}")
        job = Job.objects.get(pk=job_id)
        record(actor=None, action="job.applied", subject=subject_of(job),
               payload={"operation_id": operation_id, "plan_hash": job.plan_hash, "approvers": approvers,
                        "reconciled": reconciled})
        publish_on_commit(job)
    return job


def report_progress(job: Job | int, *, phase: str, progress: float) -> bool:
    """Store the operation's phase and progress on a running job (also the worker's heartbeat); no audit event."""
    job_id = job_id_of(job)
    with transaction.atomic():
        changed = Job.objects.filter(pk=job_id, status=JobStatus.RUNNING).update(
            phase=str(phase or "")[:32], progress=float(progress or 0.0), updated=timezone.now())
        if changed:
            transaction.on_commit(partial(publish_job_id, job_id), robust=True)
    return bool(changed)


def finish(job: Job | int, status: str, *, error: str = "", operation: Operation | None = None,
           reconciled: bool = False) -> Job:
    """End a running job: succeeded | failed | rolled_back | stale, with the engine's operation record if any."""
    if status not in WORKER_ENDINGS:
        raise ValueError(f"a worker ends a job succeeded, failed, rolled_back or stale, not {status!r}")
    job_id = job_id_of(job)
    measured = operation.measured if operation else None
    fields = {"error": (error or "")[:10000], "finished_at": timezone.now(),
              "operation": operation.to_dict() if operation else None,
              "measured": measured.to_dict() if measured else None}
    if operation:
        fields["phase"] = operation.phase[:32]
        fields["progress"] = operation.progress
    payload = {"error": fields["error"], "reconciled": reconciled, "operation_id": None,
               "measured_pool_tokens": pool_of(measured)}
    if operation:
        payload.update(operation_id=operation.id, engine_status=operation.status.value,
                       engine_predicted_pool_tokens=pool_of(operation.predicted),
                       previous_pool_tokens=pool_of(operation.previous))
    return transition(job_id, JobStatus.RUNNING, status, actor=None, payload=payload, **fields)


def hand_off(job_id: int, request_id: str | None = None) -> None:
    """Send a queued job to the worker. Runs on commit, so the worker never reads an uncommitted row; if the
    broker is down the job stays queued and the reconciler sends it again."""
    from console.jobs.tasks import run_job

    try:
        run_job.apply_async(args=(job_id,), kwargs={"request_id": request_id})
    except Exception:
        log.exception("could not hand job %s to the worker; the reconciler will send it again", job_id)

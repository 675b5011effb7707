"""The plumbing every job change shares: compare-and-set transitions with their audit event and live update,
and the small lookups the service functions use (console.jobs.services and console.jobs.execution)."""

from __future__ import annotations

import uuid
from functools import partial

from django.db import transaction
from django.utils import timezone

from console.audit.request_id import current_request_id, is_sane_request_id
from console.audit.services import record
from console.jobs import webhooks
from console.jobs.choices import TERMINAL, can_move
from console.jobs.errors import Conflict, JobError, JobNotFound, NotAllowed
from console.jobs.events import publish_job_update
from console.jobs.models import Job
from console.jobs.roles import has_role
from contracts.control import LayoutFigures

__all__ = ["carried_request_id", "get_job", "job_id_of", "lost", "pool_of", "publish_on_commit", "publish_job_id",
           "require_role", "subject_of", "transition"]


def transition(job_id: int, expected: str, to: str, *, actor, request_id: str | None = None,
               payload: dict | None = None, request_id_field: str | None = None, **fields) -> Job:
    """Compare-and-set `expected` -> `to`, record the audit event; on commit publish it to the live pages and send
    its webhooks. Conflict if it lost."""
    if not can_move(expected, to):
        raise Conflict(f"a job cannot move from {expected} to {to}")
    if request_id_field is not None:
        fields["request_id"] = request_id_field
    with transaction.atomic():
        moved = Job.objects.filter(pk=job_id, status=expected).update(status=to, updated=timezone.now(), **fields)
        if moved != 1:
            raise lost(job_id, expected, f"move it to {to}")
        job = Job.objects.get(pk=job_id)
        record(actor=actor, action=f"job.{to}", subject=subject_of(job), request_id=request_id,
               payload={"plan_hash": job.plan_hash, **(payload or {})},
               before={"status": expected}, after={"status": to})
        publish_on_commit(job)
        transaction.on_commit(partial(webhooks.announce, job, expected), robust=True)
    return job


def lost(job_id: int, expected: str, doing: str) -> JobError:
    current = Job.objects.filter(pk=job_id).values_list("status", flat=True).first()
    if current is None:
        return JobNotFound(f"no job {job_id}")
    finished = " and has finished" if current in TERMINAL else ""
    return Conflict(f"job {job_id} is {current}{finished}, not {expected}: cannot {doing}")


def publish_on_commit(job: Job) -> None:
    transaction.on_commit(partial(publish_job_id, job.pk), robust=True)


def publish_job_id(job_id: int) -> None:
    job = Job.objects.filter(pk=job_id).first()  # the committed state, not the one this code last saw
    if job is not None:
        publish_job_update(job)


def require_role(user, role: str, doing: str) -> None:
    if not has_role(user, role):
        name = user.get_username() if getattr(user, "is_authenticated", False) else "an anonymous user"
        raise NotAllowed(f"{doing} needs the {role} role, which {name} does not have")


def job_id_of(job: Job | int) -> int:
    if isinstance(job, Job):
        return job.pk
    if isinstance(job, bool) or not isinstance(job, int | str):
        raise JobNotFound(f"no job {job!r:.40}")
    try:
        return int(job)
    except ValueError:
        raise JobNotFound(f"no job {job!r:.40}") from None


def get_job(job: Job | int) -> Job:
    found = Job.objects.filter(pk=job_id_of(job)).first()
    if found is None:
        raise JobNotFound(f"no job {job!r:.40}")
    return found


def subject_of(job: Job) -> str:
    return f"job:{job.pk}"


def pool_of(figures: LayoutFigures | None) -> int | None:
    return None if figures is None else figures.pool_tokens


def carried_request_id(request_id: str | None) -> str:
    """The id the worker's events will carry: the request that queued the job, else a fresh one."""
    for candidate in (request_id, current_request_id()):
        if is_sane_request_id(candidate):
            return candidate
    return str(uuid.uuid4())

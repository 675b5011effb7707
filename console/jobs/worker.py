"""What a Celery worker does with a job, and how jobs a dead worker left behind are settled.

`execute(job_id)` is idempotent, keyed by the job: it claims the job queued -> running (compare-and-set), so
a second delivery of a running or finished job finds nothing to claim and does nothing. Then:

1. the stored plan must still hash to the reviewed plan_hash, and an approval must be bound to that hash;
2. the engine's fingerprint is read again: another layout than the reviewed plan's incumbent ends the job
   `stale` without touching the engine (docs/architecture.md §4, rule 4);
3. POST /control/apply with the job's approval attestation (console.jobs.attestation: the reviewers whose
   approvals count, signed with the approval key; without the key nothing is applied); the operation id is
   recorded at once with the approvers;
4. the operation is polled, its phase and progress stored on the job (and published), until it ends
   succeeded, failed or rolled_back, with the engine's predicted, measured and previous figures recorded, and
   the layout the engine then runs noted as the job's doing (console.jobs.layout_watch).

The engine's `boot_id` is kept on the job before the plan is sent. An engine that comes back without the job's
operation (no record of its id, or, for a job without one, none of its plan hash since a restart) restarted under
the apply: with its state read, the job ends failed naming it, and a layout the job could not have led to (neither
the one it started from nor its target) is not credited to it but raises one alert
(layout_watch.note_restart_mid_apply); without the state nothing is decided yet.

An engine that cannot be reached before the plan is sent fails the job with that reason: nothing was applied
and nothing is retried. A plan sent whose reply is lost (a timeout, a broken connection) is looked up at once
among the engine's operations of the job's plan hash and followed if found; if not (yet), the job stays `running`
for `reconcile()`. Once the engine holds an operation, losing contact leaves the job `running` for `reconcile()`,
which settles it from the engine's own operation record rather than guessing; a worker that died between the
engine accepting the plan and the id being recorded is found out the same way, by the job's plan hash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.engine import EngineClient, EngineError, EngineRefused, EngineUnreachable
from console.jobs import layout_watch, lifecycle
from console.jobs.attestation import CannotAttest, attest
from console.jobs.choices import JobStatus
from console.jobs.errors import JobError
from console.jobs.models import Approval, Job
from console.jobs.signals import job_ended_on_engine
from contracts.control import EngineState, Operation
from contracts.errors import ContractError
from contracts.plan import verify_plan

__all__ = ["execute", "reconcile"]

log = logging.getLogger("seam.jobs")

POLL_S = 0.1
HEARTBEAT_S = 5.0  # a running job's `updated` moves at least this often while its worker is alive
LOST_CONTACT_S = 30.0  # how long polling tolerates an unreachable engine before leaving it to the reconciler
BUSY_WAIT_S = 30.0  # how long to wait for the engine to finish another operation before giving up


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


@contextmanager
def _client(client: EngineClient | None) -> Iterator[EngineClient]:
    if client is not None:
        yield client
        return
    with EngineClient() as own:
        yield own


# --- running one job ---------------------------------------------------------------------------

def execute(job_id: int, *, worker: str = "", task_id: str = "", client: EngineClient | None = None) -> str:
    """Run job `job_id` if it is queued; returns the status it is left in."""
    try:
        job = lifecycle.start(job_id, worker=worker, task_id=task_id)
    except JobError as error:  # already claimed, finished, cancelled or gone: this delivery has nothing to do
        log.info("job %s not started: %s", job_id, error)
        return Job.objects.filter(pk=job_id).values_list("status", flat=True).first() or "missing"
    with _client(client) as engine:
        try:
            return _run(job, engine)
        except Exception as error:
            log.exception("job %s: unexpected failure", job.pk)
            job.refresh_from_db()
            if job.status == JobStatus.RUNNING and not job.engine_operation_id:
                return _end(job, JobStatus.FAILED, f"the worker failed before the plan was sent "
                                                   f"({type(error).__name__}: {error}); nothing was applied")
            return job.status  # the engine holds an operation: the reconciler settles it from the engine's record


def _run(job: Job, engine: EngineClient) -> str:
    refusal = _reviewed_plan_refusal(job)
    if refusal:
        return _end(job, JobStatus.FAILED, refusal)
    try:
        state = engine.state()
    except EngineError as error:
        return _end(job, JobStatus.FAILED, f"{error}; nothing was applied")
    if state.fingerprint != job.incumbent_fingerprint:
        return _end(job, JobStatus.STALE, _stale(state.fingerprint, job))
    try:
        attestation = attest(job)
    except CannotAttest as error:
        return _end(job, JobStatus.FAILED, str(error))
    lifecycle.note_engine_boot(job, state.boot_id or "")
    job.refresh_from_db()
    operation_id, ending = _apply(job, engine, attestation)
    if ending is not None:
        return ending
    lifecycle.record_operation(job, operation_id, approvers=attestation["approvers"])
    return _follow(job, engine, operation_id)


def _reviewed_plan_refusal(job: Job) -> str | None:
    """Apply exactly what was reviewed: the stored plan must hash to its plan_hash, and be the approved one."""
    try:
        verify_plan(job.plan, job.plan_hash)
    except ContractError as error:
        return f"the stored plan is not the reviewed one ({error}); nothing was applied"
    if not Approval.objects.filter(job=job, plan_hash=job.plan_hash).exists():
        return f"no approval is bound to plan {job.plan_hash[:16]}; nothing was applied"
    return None


def _stale(fingerprint: str, job: Job) -> str:
    return (f"the engine now runs layout {fingerprint}, but the plan was reviewed for {job.incumbent_fingerprint}: "
            "nothing was applied; propose again")


def _apply(job: Job, engine: EngineClient, attestation: dict) -> tuple[str, str | None]:
    """POST /control/apply, waiting out a busy engine for a while; returns (operation id, None) or ("", ending)."""
    deadline = time.monotonic() + _setting("SEAM_JOB_BUSY_WAIT_S", BUSY_WAIT_S)
    refused_while_serving = 0
    while True:
        try:
            return engine.apply(job.plan, job.plan_hash, attestation), None
        except EngineUnreachable as error:
            if error.sent:
                return _sent_unanswered(job, engine, error)
            return "", _end(job, JobStatus.FAILED, f"{error}; nothing was applied")
        except EngineRefused as error:
            if error.status != 409:
                what = "as infeasible" if error.status == 422 else f"({error.status})"
                return "", _end(job, JobStatus.FAILED, f"the engine refused the plan {what}: {error.message}")
            try:  # 409: stale (the layout moved since the check above), busy with another operation, or refused
                state = engine.state()
            except EngineError as lost:
                return "", _end(job, JobStatus.FAILED, f"{lost}; nothing was applied")
            if state.fingerprint != job.incumbent_fingerprint:
                return "", _end(job, JobStatus.STALE, _stale(state.fingerprint, job))
            # Twice refused while the engine runs no operation (once could be one that just ended): not busy but a
            # refusal waiting cannot change (a spent job id, a rolled-back audit trail), so fail now, saying it.
            refused_while_serving = refused_while_serving + 1 if state.phase == "serving" else 0
            if refused_while_serving >= 2:
                return "", _end(job, JobStatus.FAILED, f"the engine refused the plan (409): {error.message}; "
                                                       "nothing was applied")
            if time.monotonic() >= deadline:
                return "", _end(job, JobStatus.FAILED, f"the engine stayed busy: {error.message}")
            lifecycle.report_progress(job, phase="waiting", progress=0.0)
            time.sleep(0.5)
        except EngineError as error:
            return _sent_unanswered(job, engine, error)


def _sent_unanswered(job: Job, engine: EngineClient, error: EngineError) -> tuple[str, str | None]:
    """The plan went out but no operation id came back (the reply timed out, the connection broke, the reply was
    unreadable): the engine's operations for the job's plan hash say whether it took the plan. Found: (its id, None),
    followed as if the reply had come. Not found, or no answer: the engine may still be taking the request in, so
    nothing is decided now; the job stays running, phase `unconfirmed`, and reconcile() looks it up again later."""
    reason = str(error)
    try:
        found = _operations_of(job, engine)
    except EngineError as lost:
        found, reason = [], f"{reason}; looking the operation up: {lost}"
    if found:
        return found[-1].id, None
    log.warning("job %s: %s; no operation of plan %s found yet: left running for the reconciler", job.pk, reason,
                job.plan_hash[:16])
    lifecycle.report_progress(job, phase="unconfirmed", progress=0.0)
    return "", JobStatus.RUNNING


def _operations_of(job: Job, engine: EngineClient) -> list[Operation]:
    """The engine's operations of the job's plan hash started by this job's attestation, oldest first."""
    return [op for op in engine.find_operations(job.plan_hash) if op.job_id == job.pk]


def _follow(job: Job, engine: EngineClient, operation_id: str) -> str:
    """Poll the operation to its end, storing progress; give it to the reconciler if the engine goes away."""
    poll_s = _setting("SEAM_JOB_POLL_S", POLL_S)
    give_up_at = time.monotonic() + _setting("SEAM_JOB_TIMEOUT_S", 900.0)
    shown, beat, lost_since = None, time.monotonic(), None
    while True:
        try:
            operation = engine.operation(operation_id)
        except EngineUnreachable as error:
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > _setting("SEAM_JOB_LOST_CONTACT_S", LOST_CONTACT_S):
                log.warning("job %s: %s; left running for the reconciler", job.pk, error)
                return JobStatus.RUNNING
            time.sleep(poll_s)
            continue
        except EngineRefused as error:
            if error.status == 404:
                return _operation_lost(job, engine, f"the engine has no record of operation {operation_id}")
            raise
        lost_since = None
        if operation.status.done:
            return _ended_on_engine(job, engine, operation)
        now = time.monotonic()
        if (operation.phase, operation.progress) != shown or now - beat >= HEARTBEAT_S:
            lifecycle.report_progress(job, phase=operation.phase, progress=operation.progress)
            shown, beat = (operation.phase, operation.progress), now
        if now >= give_up_at:
            log.warning("job %s: operation %s still %s; left running for the reconciler", job.pk, operation_id,
                        operation.status)
            return JobStatus.RUNNING
        time.sleep(poll_s)


def _ended_on_engine(job: Job, engine: EngineClient, operation: Operation, reconciled: bool = False) -> str:
    """End the job as its operation ended, then note the layout the engine runs as the job's doing, so the layout
    watch does not take the job's own change for one nobody explains."""
    ending = _end(job, operation.status, operation.error or "", operation, reconciled=reconciled)
    try:
        state = engine.state()  # read once: the layout watch and the calibration both note it
    except EngineError as error:
        # Not fatal: the watch attributes a change to a job that ended without a note, the calibration records none.
        log.warning("job %s: the engine's state after it could not be read (%s)", job.pk, error)
        return ending
    layout_watch.note_job_end(job, state, engine.base_url)
    # The calibration records the job's measurement and prediction from it (console.calibration.signals).
    job_ended_on_engine.send(sender=Job, job=job, state=state, engine_url=engine.base_url)
    return ending


def _operation_lost(job: Job, engine: EngineClient, lost: str, reconciled: bool = False) -> str:
    """The engine answers but holds no record of the job's operation (`lost` says which): it restarted under the
    apply, unless its boot id says it did not (then the record was dropped, and the job fails as before). Without its
    state nothing is decided: the job stays running for the reconciler."""
    try:
        state = engine.state()
    except EngineError as error:
        log.warning("job %s: %s, and its state could not be read (%s): left running for the reconciler", job.pk,
                    lost, error)
        return JobStatus.RUNNING
    if job.engine_boot_id and state.boot_id == job.engine_boot_id:
        return _end(job, JobStatus.FAILED, f"{lost}, though it did not restart; check its /control/state",
                    reconciled=reconciled)
    return _restarted_under(job, engine, state, lost, reconciled)


def _restarted_under(job: Job, engine: EngineClient, state: EngineState, lost: str, reconciled: bool) -> str:
    """The engine restarted under the job's apply and runs `state`. A layout the operation could have left (the
    job's start or its target) is noted as the job's end; any other is the restarted engine's own, not the job's:
    the job fails naming it and one alert is raised, committed with the job's end."""
    here = f"layout {state.fingerprint} (cut {state.cut})"
    if layout_watch.led_there(job, state):
        which = "the one the job started from" if state.fingerprint == job.incumbent_fingerprint else \
            "the job's target"
        ending = _end(job, JobStatus.FAILED, f"{lost}: the engine restarted mid-apply and runs {here}, {which}; "
                                             "check its /control/state", reconciled=reconciled)
        layout_watch.note_job_end(job, state, engine.base_url)
        return ending
    reason = (f"the engine restarted mid-apply on {here}: neither the job's target nor the layout it started from "
              f"({job.incumbent_fingerprint}), so not this job's doing ({lost})")
    try:
        with transaction.atomic():
            lifecycle.finish(job, JobStatus.FAILED, error=reason, reconciled=reconciled)
            layout_watch.note_restart_mid_apply(job, state, engine.base_url)
    except JobError as lost_race:  # the reconciler (or another worker) settled it first, and alerted if need be
        log.info("job %s: not ended failed: %s", job.pk, lost_race)
        return Job.objects.filter(pk=job.pk).values_list("status", flat=True).first() or "missing"
    return JobStatus.FAILED


def _end(job: Job, status: str, error: str, operation: Operation | None = None, reconciled: bool = False) -> str:
    try:
        return lifecycle.finish(job, status, error=error, operation=operation, reconciled=reconciled).status
    except JobError as lost:  # the reconciler (or another worker) settled it first
        log.info("job %s: not ended %s: %s", job.pk, status, lost)
        return Job.objects.filter(pk=job.pk).values_list("status", flat=True).first() or "missing"


# --- settling jobs a worker left behind ---------------------------------------------------------

def reconcile(*, older_than_s: float | None = None, client: EngineClient | None = None) -> list[tuple[int, str]]:
    """Settle jobs left `running` by a worker that is gone, and send again jobs left `queued`.

    A running job whose `updated` (the worker's heartbeat) is older than `older_than_s` is settled from the
    engine's operation record: ended as the engine says if the operation ended, kept running (heartbeat
    renewed) while the engine still works on it, failed if the engine never got it or has no record of it.
    A job without an operation id (its worker died before recording one, perhaps after the engine accepted the
    plan) is looked up on the engine by plan hash and job id. While the engine cannot be reached, nothing is
    decided. Returns (job id, outcome) pairs.
    """
    if older_than_s is None:
        older_than_s = _setting("SEAM_JOB_RECONCILE_AFTER_S", 120.0)
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    outcomes = []
    with _client(client) as engine:
        for job in Job.objects.filter(status=JobStatus.RUNNING, updated__lt=cutoff).order_by("pk"):
            outcomes.append((job.pk, _settle(job, engine)))
    for job in Job.objects.filter(status=JobStatus.QUEUED, updated__lt=cutoff).order_by("pk"):
        # Only one reconciler sends it again: the one whose compare-and-set on `updated` wins.
        if Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED, updated=job.updated).update(
                updated=timezone.now()):
            lifecycle.hand_off(job.pk, job.request_id or None)
            outcomes.append((job.pk, "sent to the worker again"))
    return outcomes


def _settle(job: Job, engine: EngineClient) -> str:
    if not job.engine_operation_id:
        return _settle_without_operation_id(job, engine)
    try:
        operation = engine.operation(job.engine_operation_id)
    except EngineRefused as error:
        if error.status == 404:
            return _operation_lost(job, engine, f"the engine has no record of operation {job.engine_operation_id}",
                                   reconciled=True)
        return f"left running: {error}"
    except EngineError as error:
        return f"left running: {error}"
    return _settle_from(job, engine, operation)


def _settle_without_operation_id(job: Job, engine: EngineClient) -> str:
    """The worker stopped before it recorded an operation id: before the engine got the plan, or after. The
    engine's operations for the job's plan hash say which: the one its attestation named this job started."""
    try:
        found = _operations_of(job, engine)
        state = None if found else engine.state()
    except EngineError as error:
        return f"left running: {error}"
    if state is not None and layout_watch.restarted_since(job, state):
        return _restarted_under(job, engine, state, f"the engine has no operation of job {job.pk} for plan "
                                                    f"{job.plan_hash[:16]}", reconciled=True)
    if not found:
        return _end(job, JobStatus.FAILED, "the worker stopped before the engine was given the plan: no operation id "
                                           f"was recorded and the engine has no operation of job {job.pk} for plan "
                                           f"{job.plan_hash[:16]}; the engine was not asked to change (unless it "
                                           "restarted since, losing its records: check its /control/state)",
                    reconciled=True)
    operation = found[-1]  # the engine starts one operation per job's attestation; the newest, should that change
    try:
        lifecycle.record_operation(job, operation.id, reconciled=True)
    except JobError as lost:  # another reconciler, or the worker after all, got there first
        return f"left alone: {lost}"
    return _settle_from(job, engine, operation)


def _settle_from(job: Job, engine: EngineClient, operation: Operation) -> str:
    if operation.status.done:
        return _ended_on_engine(job, engine, operation, reconciled=True)
    lifecycle.report_progress(job, phase=operation.phase, progress=operation.progress)
    return f"still {operation.status} on the engine"

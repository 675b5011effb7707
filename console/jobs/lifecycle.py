"""The life of a job, every change of its state in one module: propose -> review -> execute -> settle. Pages, the
API, beat and the worker all change jobs through these functions.

    propose   propose(user, body)            operator: ask the engine for a plan, store it with its hash and
                                             prediction (and its `not_before`, for a scheduled change:
                                             console.jobs.schedule)
              revise(user, job, body=None)   the proposer: plan again; a new plan_hash dismisses every approval
                                             (rule 2)
              cancel(user, job)              operator, own job, before it runs: -> cancelled
              propose_revert(user, job)      operator: a succeeded job that missed its predicted speedup -> a new
                                             proposed job back to the layout it replaced, linked to it (`reverts`),
                                             reviewed like any other
    review    approve(user, job, plan_hash=) reviewer, never the proposer (rule 1), bound to the plan_hash seen
                                             (rule 2); counts unexpired approvals of reviewers still in the role
                                             against SEAM_REQUIRED_APPROVALS (rule 3); the last one needed moves the
                                             job approved -> queued and hands it to Celery on commit, or, for a job
                                             whose not_before lies ahead, leaves it approved
              reject(user, job, reason=)     reviewer: proposed -> rejected; the engine is never asked
              queue_due(now=None)            beat: scheduled jobs whose not_before has come, approved -> queued,
                                             handed over
    execute   hand_off(job_id)               on commit: the job to Celery's `run_job` task, reached by its name
              start / note_engine_boot / record_operation / report_progress      the worker's side
                                             (console.jobs.worker drives the engine and calls these)
    settle    finish(job, status)            the worker or the reconciler: running -> succeeded | failed |
                                             rolled_back | stale

(a refused propose, approve, reject, cancel or revert is an audit event too: `job.<verb>_refused`,
console.jobs.refusals)

Every transition is compare-and-set on the status (an UPDATE filtered on the expected status, refused unless
it changed exactly one row), so two reviewers, two workers or a worker and the reconciler cannot both win.
Every transition records an audit event in the same transaction (console.audit.services.record; if that
fails the change rolls back), and the live hook (events.publish_job_update) and the webhooks
(console.jobs.webhooks) run only after the commit.
Refusals raise console.jobs.errors (each with its HTTP status_code). The rules numbered above are the review
gate's, docs/architecture.md §4.

This module sits below the worker and Celery's tasks (console.jobs.worker, console.jobs.tasks): it imports neither,
and reaches the task that runs a job by its name.
"""

from __future__ import annotations

import logging
import uuid
from functools import partial

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.audit.request_id import current_request_id, is_sane_request_id
from console.audit.services import record
from console.celery import app as celery_app
from console.engine import EngineClient
from console.jobs import planning, schedule, webhooks
from console.jobs.choices import ACTIVE, CANCELLABLE, TERMINAL, JobKind, JobStatus, SpeedVerdict, can_move
from console.jobs.errors import Conflict, InvalidProposal, JobError, JobNotFound, NotAllowed
from console.jobs.events import publish_job_update
from console.jobs.models import Approval, Job, LayoutCause
from console.jobs.refusals import body_digest, records_refusals, refuse_proposal
from console.jobs.roles import OPERATOR, REVIEWER, has_role
from contracts.control import LayoutFigures, Operation

__all__ = ["APPROVAL_EVENT", "RUN_JOB", "WORKER_ENDINGS", "approval_binding", "approvals_counting", "approve",
           "cancel", "finish", "hand_off", "job_id_of", "note_engine_boot", "propose", "propose_revert",
           "publish_on_commit", "queue_due", "record_operation", "reject", "report_progress", "required_approvals",
           "revise", "start", "subject_of"]

log = logging.getLogger("seam.jobs")

# The Celery task that runs a queued job (console.jobs.tasks.run_job), named here once and sent by name.
RUN_JOB = "console.jobs.tasks.run_job"

# The audit event that records an approval; it vouches for the approval when the worker attests the job
# (console.jobs.vouching).
APPROVAL_EVENT = "job.approval"

WORKER_ENDINGS = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.ROLLED_BACK, JobStatus.STALE})

# --- propose -------------------------------------------------------------------------------------

def propose(user, body: object, *, request_id: str | None = None, client: EngineClient | None = None) -> Job:
    """Plan `{"kind", "target"[, "incumbent_fingerprint"][, "not_before"]}` on the engine and store it as a proposed
    job.

    The engine prices it against its current layout; an infeasible plan is refused with the engine's reasons
    and stores nothing. An `incumbent_fingerprint` in the body is the layout the operator looked at: if the
    engine has moved on since, the proposal is refused rather than priced against a layout nobody saw. A
    `not_before` (ISO 8601 with a timezone, in the future) makes it a scheduled change.
    """
    try:
        _require_role(user, OPERATOR, "proposing a job")
        plan_body, not_before = schedule.split_schedule(body)
        kind, target, seen = planning.parse_body(plan_body)
        plan, plan_hash, incumbent = planning.plan(kind, target, seen, client)
    except JobError as refusal:
        refuse_proposal(user, body_digest(body), refusal, request_id=request_id)
        raise
    return _create(user, kind, plan, plan_hash, incumbent, not_before=not_before, request_id=request_id)


def _create(user, kind: str, plan: dict, plan_hash: str, incumbent: dict, *, not_before=None,
            reverts: Job | None = None, request_id: str | None = None) -> Job:
    """Store a priced plan as a proposed job, audited (`job.proposed`), published and announced on commit."""
    with transaction.atomic():
        job = Job.objects.create(
            kind=kind, target=plan["target"], plan=plan, plan_hash=plan_hash, prediction=plan["predicted"],
            proposer=user, proposer_name=user.get_username(), status=JobStatus.PROPOSED, not_before=not_before,
            incumbent_layout=incumbent, reverts=reverts)
        record(actor=user, action="job.proposed", subject=subject_of(job), request_id=request_id,
               payload={"kind": kind, "target": job.target, "plan_hash": plan_hash,
                        "incumbent_fingerprint": job.incumbent_fingerprint,
                        "predicted_pool_tokens": job.prediction.get("pool_tokens"),
                        "not_before": not_before.isoformat() if not_before else None,
                        "reverts": reverts.pk if reverts else None},
               after={"status": JobStatus.PROPOSED})
        publish_on_commit(job)
        transaction.on_commit(partial(webhooks.announce, job, None), robust=True)
    return job


def revise(user, job: Job | int, body: object | None = None, *, request_id: str | None = None,
           client: EngineClient | None = None) -> Job:
    """Plan a proposed job again (against the engine's current layout, optionally with a new target).

    A plan that hashes differently replaces the old one and dismisses every approval given so far: they were
    given for another plan (rule 2). A plan that hashes the same changes nothing.
    """
    _require_role(user, OPERATOR, "revising a job")
    job = _get_job(job)
    if job.proposer_id != user.pk:
        raise NotAllowed(f"only the proposer ({job.proposer_name}) may revise job {job.pk}")
    if job.status != JobStatus.PROPOSED:
        raise Conflict(f"job {job.pk} is {job.status}: only a proposed job can be revised")
    kind, target, seen = planning.parse_body(body if body is not None else {"kind": job.kind, "target": job.target})
    if kind != job.kind:
        raise InvalidProposal(f"kind: job {job.pk} is a {job.kind} job; propose a new job for a {kind}", "kind")
    plan, plan_hash, incumbent = planning.plan(kind, target, seen, client)
    if plan_hash == job.plan_hash:
        return job
    with transaction.atomic():
        changed = Job.objects.filter(pk=job.pk, status=JobStatus.PROPOSED, plan_hash=job.plan_hash).update(
            target=plan["target"], plan=plan, plan_hash=plan_hash, prediction=plan["predicted"],
            incumbent_layout=incumbent, updated=timezone.now())
        if changed != 1:
            raise Conflict(f"job {job.pk} changed while it was being revised; look at it again")
        dismissed = job.approvals.filter(plan_hash=job.plan_hash).count()
        revised = Job.objects.get(pk=job.pk)
        record(actor=user, action="job.revised", subject=subject_of(job), request_id=request_id,
               payload={"target": revised.target, "dismissed_approvals": dismissed,
                        "incumbent_fingerprint": revised.incumbent_fingerprint,
                        "predicted_pool_tokens": revised.prediction.get("pool_tokens")},
               before={"plan_hash": job.plan_hash}, after={"plan_hash": plan_hash})
        publish_on_commit(revised)
    return revised


@records_refusals("cancel")
def cancel(user, job: Job | int, *, request_id: str | None = None) -> Job:
    """The proposer withdraws a job the worker has not picked up (proposed, approved or queued)."""
    _require_role(user, OPERATOR, "cancelling a job")
    job = _get_job(job)
    if job.proposer_id != user.pk:
        raise NotAllowed(f"only the proposer ({job.proposer_name}) may cancel job {job.pk}")
    if job.status not in CANCELLABLE:
        raise Conflict(f"job {job.pk} is {job.status}: only a job that has not started can be cancelled")
    return _transition(job.pk, job.status, JobStatus.CANCELLED, actor=user, request_id=request_id)


@records_refusals("revert")
def propose_revert(user, job: Job | int, *, request_id: str | None = None, client: EngineClient | None = None) -> Job:
    """Propose going back to the layout a job replaced, once it succeeded and missed its predicted speedup: a new
    proposed job (through the same review gate as any other) whose target is that layout, linked to the job it
    reverts. Refused unless the job missed its prediction, and when the engine no longer runs the layout the job
    left (then there is nothing of the job's to undo: the plan would be priced against another layout)."""
    _require_role(user, OPERATOR, "proposing a revert")
    job = _get_job(job)
    kind, target, left = _revert_request(job)
    try:
        plan, plan_hash, incumbent = planning.plan(kind, target, left, client)
    except Conflict as moved:
        raise Conflict(f"job {job.pk}'s layout {left} is no longer the engine's ({moved}): nothing of job {job.pk}'s "
                       "to revert; propose the layout you want") from moved
    with transaction.atomic():
        revert = _create(user, kind, plan, plan_hash, incumbent, reverts=job, request_id=request_id)
        record(actor=user, action="job.revert_proposed", subject=subject_of(job), request_id=request_id,
               payload={"revert": revert.pk, "target": revert.target, "plan_hash": plan_hash})
    return revert


def _revert_request(job: Job) -> tuple[str, dict, str]:
    """(kind, target, fingerprint of the layout the job left) of the job's revert; Conflict naming why there is
    none."""
    if job.status != JobStatus.SUCCEEDED or job.speed_verdict != SpeedVerdict.MISSED:
        raise Conflict(f"job {job.pk} is {job.outcome}: only a succeeded job that missed its prediction is offered a "
                       "revert")
    previous = job.incumbent_layout
    if not isinstance(previous, dict):
        raise Conflict(f"the layout job {job.pk} replaced was not recorded when it was proposed: propose it by hand")
    left = job.layout_observations.filter(cause=LayoutCause.JOB).order_by("-observed_at", "-id").first()
    if left is None:
        raise Conflict(f"the layout job {job.pk} left was never seen (the engine could not be read as it ended)")
    pending = job.reverted_by.filter(status__in=ACTIVE).order_by("pk").first()
    if pending is not None:
        raise Conflict(f"job {pending.pk} already proposes to revert job {job.pk} (it is {pending.status})")
    if job.kind == JobKind.SHAPE:
        target = dict(previous["shape"])
    else:
        target = {"cut" if job.kind == JobKind.CUT else "rung": list(previous["cut"])}
    return job.kind, target, left.fingerprint


# --- review --------------------------------------------------------------------------------------

def required_approvals() -> int:
    return max(1, int(settings.SEAM_REQUIRED_APPROVALS))


def approvals_counting(job: Job, now=None) -> int:
    """Distinct reviewers whose approval counts for this job's current plan now (Approval.objects.counting_for)."""
    return Approval.objects.counting_for(job, now).values("reviewer_id").distinct().count()


def approval_binding(approval: Approval) -> dict:
    """What the approval's audit event records of it, beside its subject (the job) and actor (the reviewer)."""
    return {"approval": approval.pk, "plan_hash": approval.plan_hash, "expires_at": approval.expires_at.isoformat()}


@records_refusals("approve")
def approve(user, job: Job | int, *, plan_hash: str | None = None, request_id: str | None = None) -> Job:
    """Record `user`'s approval of the plan they saw (`plan_hash`, default: the job's current one).

    When the unexpired approvals of the current plan reach SEAM_REQUIRED_APPROVALS, the job moves
    proposed -> approved -> queued and is handed to the worker once the transaction commits; a job whose
    not_before lies ahead stays approved until queue_due queues it then. An approval lasts SEAM_APPROVAL_TTL_S,
    counted from the job's not_before when that is later (console.jobs.schedule.approval_expiry).
    """
    _require_role(user, REVIEWER, "approving a job")
    job_id = job_id_of(job)
    now = timezone.now()
    with transaction.atomic():
        # Write to the job's row first: it locks the row (PostgreSQL) or the database (SQLite) until commit,
        # so approvals of one job are counted one after another and the count that queues it is exact.
        if Job.objects.filter(pk=job_id, status=JobStatus.PROPOSED).update(updated=now) != 1:
            raise _lost(job_id, JobStatus.PROPOSED, "approve it")
        job = Job.objects.get(pk=job_id)
        if job.proposer_id == user.pk:
            raise NotAllowed(f"{user.get_username()} proposed job {job.pk} and cannot approve it: "
                             "approval needs another reviewer")
        if plan_hash is not None and plan_hash != job.plan_hash:
            raise Conflict(f"the plan of job {job.pk} changed since you saw it (you saw {plan_hash[:16]}, it is now "
                           f"{job.plan_hash[:16]}): review the new plan")
        if Approval.objects.counting(job.plan_hash, now).filter(job=job, reviewer=user).exists():
            raise Conflict(f"{user.get_username()} has already approved this plan of job {job.pk}")
        ttl_s = max(1, int(settings.SEAM_APPROVAL_TTL_S))
        approval = Approval.objects.create(job=job, reviewer=user, reviewer_name=user.get_username(),
                                           plan_hash=job.plan_hash, created=now,
                                           expires_at=schedule.approval_expiry(job, now, ttl_s))
        count, required = approvals_counting(job, now), required_approvals()
        # This keyed event is what vouches for the approval when the worker attests the job (console.jobs.vouching).
        record(actor=user, action=APPROVAL_EVENT, subject=subject_of(job), request_id=request_id,
               payload={**approval_binding(approval), "counting": count, "required": required})
        if count < required:
            publish_on_commit(job)
            return job
        reviewers = sorted(Approval.objects.counting_for(job, now).values_list("reviewer_name", flat=True).distinct())
        gate = {"plan_hash": job.plan_hash, "approvals": count, "required": required, "reviewers": reviewers}
        waits = schedule.waits(job, now)
        if waits:
            gate["scheduled_for"] = job.not_before.isoformat()
        # The request id is kept from here, so a job beat queues later still carries the request that approved it.
        carried = _carried_request_id(request_id)
        job = _transition(job.pk, JobStatus.PROPOSED, JobStatus.APPROVED, actor=user, request_id=request_id,
                          payload=gate, request_id_field=carried)
        if waits:
            return job
        job = _transition(job.pk, JobStatus.APPROVED, JobStatus.QUEUED, actor=user, request_id=request_id,
                          payload={"plan_hash": job.plan_hash}, queued_at=now)
        transaction.on_commit(partial(hand_off, job.pk, carried), robust=True)
    return job


def queue_due(now=None) -> list[int]:
    """Queue every approved job whose not_before has come (approved -> queued, compare-and-set: a job cancelled
    meanwhile, or queued by another beat, is left alone) and hand each to the worker once that commits. Beat runs
    this every SEAM_SCHEDULE_POLL_S (console.jobs.tasks.queue_scheduled_jobs). Returns the ids it queued."""
    now = now or timezone.now()
    queued = []
    due = (Job.objects.filter(status=JobStatus.APPROVED, not_before__lte=now).order_by("not_before", "pk")
           .values_list("pk", "not_before", "request_id"))
    for job_id, not_before, request_id in due:
        carried = _carried_request_id(request_id)
        try:
            with transaction.atomic():
                _transition(job_id, JobStatus.APPROVED, JobStatus.QUEUED, actor=None, request_id=carried,
                            payload={"scheduled_for": not_before.isoformat()}, queued_at=timezone.now(),
                            request_id_field=carried)
                transaction.on_commit(partial(hand_off, job_id, carried), robust=True)
        except JobError as lost_race:
            log.info("scheduled job %s not queued: %s", job_id, lost_race)
            continue
        queued.append(job_id)
    return queued


@records_refusals("reject")
def reject(user, job: Job | int, *, reason: str = "", request_id: str | None = None) -> Job:
    """A reviewer refuses a proposed job; it ends `rejected` and never reaches the engine."""
    _require_role(user, REVIEWER, "rejecting a job")
    reason = str(reason or "").strip()[:2000]
    error = f"rejected by {user.get_username()}" + (f": {reason}" if reason else "")
    return _transition(job_id_of(job), JobStatus.PROPOSED, JobStatus.REJECTED, actor=user, request_id=request_id,
                       payload={"reason": reason}, error=error, finished_at=timezone.now())


# --- execute -------------------------------------------------------------------------------------

def hand_off(job_id: int, request_id: str | None = None) -> None:
    """Send a queued job to the worker. Runs on commit, so the worker never reads an uncommitted row; if the
    broker is down the job stays queued and the reconciler sends it again."""
    try:
        celery_app.send_task(RUN_JOB, args=(job_id,), kwargs={"request_id": request_id})
    except Exception:
        log.exception("could not hand job %s to the worker; the reconciler will send it again", job_id)


def start(job: Job | int, *, worker: str = "", task_id: str = "") -> Job:
    """Claim a queued job for this worker (queued -> running); Conflict if another delivery got it first."""
    now = timezone.now()
    return _transition(job_id_of(job), JobStatus.QUEUED, JobStatus.RUNNING, actor=None,
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
            raise _lost(job_id, JobStatus.RUNNING, f"record operation {operation_id}")
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
            transaction.on_commit(partial(_publish_job_id, job_id), robust=True)
    return bool(changed)


# --- settle --------------------------------------------------------------------------------------

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
               "measured_pool_tokens": _pool_of(measured)}
    if operation:
        payload.update(operation_id=operation.id, engine_status=operation.status.value,
                       engine_predicted_pool_tokens=_pool_of(operation.predicted),
                       previous_pool_tokens=_pool_of(operation.previous))
    return _transition(job_id, JobStatus.RUNNING, status, actor=None, payload=payload, **fields)


# --- the plumbing every change shares: compare-and-set with its audit event and live update, lookups --

def _transition(job_id: int, expected: str, to: str, *, actor, request_id: str | None = None,
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
            raise _lost(job_id, expected, f"move it to {to}")
        job = Job.objects.get(pk=job_id)
        record(actor=actor, action=f"job.{to}", subject=subject_of(job), request_id=request_id,
               payload={"plan_hash": job.plan_hash, **(payload or {})},
               before={"status": expected}, after={"status": to})
        publish_on_commit(job)
        transaction.on_commit(partial(webhooks.announce, job, expected), robust=True)
    return job


def _lost(job_id: int, expected: str, doing: str) -> JobError:
    current = Job.objects.filter(pk=job_id).values_list("status", flat=True).first()
    if current is None:
        return JobNotFound(f"no job {job_id}")
    finished = " and has finished" if current in TERMINAL else ""
    return Conflict(f"job {job_id} is {current}{finished}, not {expected}: cannot {doing}")


def publish_on_commit(job: Job) -> None:
    transaction.on_commit(partial(_publish_job_id, job.pk), robust=True)


def _publish_job_id(job_id: int) -> None:
    job = Job.objects.filter(pk=job_id).first()  # the committed state, not the one this code last saw
    if job is not None:
        publish_job_update(job)


def _require_role(user, role: str, doing: str) -> None:
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


def _get_job(job: Job | int) -> Job:
    found = Job.objects.filter(pk=job_id_of(job)).first()
    if found is None:
        raise JobNotFound(f"no job {job!r:.40}")
    return found


def subject_of(job: Job) -> str:
    return f"job:{job.pk}"


def _pool_of(figures: LayoutFigures | None) -> int | None:
    return None if figures is None else figures.pool_tokens


def _carried_request_id(request_id: str | None) -> str:
    """The id the worker's events will carry: the request that queued the job, else a fresh one."""
    for candidate in (request_id, current_request_id()):
        if is_sane_request_id(candidate):
            return candidate
    return str(uuid.uuid4())

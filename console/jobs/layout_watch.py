"""Noticing a layout change that no job of the console caused (docs/console.md, "Trust model").

The console keeps the layout it knows each engine runs: the newest LayoutObservation of that engine's URL. When a
job's operation ends on the engine, the worker notes the layout the engine then runs as that job's doing
(`note_job_end`). Beat runs `watch()` every SEAM_LAYOUT_WATCH_S; when the engine's fingerprint has moved from the
known one:

- while a job is running or the engine is between layouts, nothing is decided (the job's end will explain it);
- a job that ended on the engine since the known layout was noted, without a note of its own (its worker lost
  the engine just then), explains it — unless the engine has restarted since that job's apply (its `boot_id` is
  another than the one the job applied to): then the layout is the restarted engine's, not the job's, and is
  alerted as below;
- otherwise nothing the console did explains it — an operator bypassing the console, or someone holding its
  credentials: one `engine.unexplained_change` audit event (actor: the system) with the layouts before and after,
  recorded once per change (the new layout becomes the known one), and a warning on the dashboard.

An engine that died under a job's apply and came back on a layout that job could not have led to (neither the
layout it started from, where a rollback leaves it, nor its target) is not the job's doing either: the worker (or
the reconciler) ends the job failed, naming it, and `note_restart_mid_apply` raises one alert — an
`engine.restarted_mid_apply` audit event (actor: the system) with the layouts before and after and the job, a
warning on the dashboard, and the webhook of that name — noting the layout (cause `restarted`, with the job) so the
watch neither credits the job with it nor takes it for an unexplained change.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial

from django.db import transaction
from django.utils import timezone

from console.audit.services import record
from console.engine import EngineClient, EngineError
from console.jobs import health_watch, webhooks
from console.jobs.choices import JobStatus
from console.jobs.models import Job, LayoutCause, LayoutObservation
from contracts.control import EngineState

__all__ = ["RESTARTED_MID_APPLY", "UNEXPLAINED_CHANGE", "led_there", "note_job_end", "note_restart_mid_apply",
           "recent_restart_mid_apply", "recent_unexplained_change", "restarted_since", "watch"]

log = logging.getLogger("seam.jobs")

UNEXPLAINED_CHANGE = webhooks.UNEXPLAINED_CHANGE  # the audit event and the webhook share the name
RESTARTED_MID_APPLY = webhooks.RESTARTED_MID_APPLY  # the audit event and the webhook share the name
# The endings of a job whose operation ran on the engine: after these the engine may run another layout.
_ENDED_ON_ENGINE = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.ROLLED_BACK)
# How long the dashboard keeps warning of an unexplained change: long enough that nobody misses it over a weekend;
# the audit trail keeps it for good.
WARN_FOR = timedelta(days=7)


def note_job_end(job: Job, state: EngineState, engine_url: str) -> None:
    """The job's operation has ended: the layout the engine runs now (its `state`, read by the worker) is the job's
    doing."""
    known = LayoutObservation.objects.known(engine_url)
    LayoutObservation.objects.create(engine_url=engine_url, cause=LayoutCause.JOB, job=job,
                                     before=known.layout() if known else None, **state.layout())


def restarted_since(job: Job, state: EngineState) -> bool:
    """Whether the engine has restarted since the worker gave it the job's plan: another boot id than the one the job
    applied to. Without both ids nothing tells, and this says no."""
    boot_id = state.boot_id or ""
    return bool(job.engine_boot_id and boot_id and boot_id != job.engine_boot_id)


def led_there(job: Job, state: EngineState) -> bool:
    """Whether the engine's layout is one the job's operation could have left it on: the layout the job started from
    (a rollback's) or the job's target (its incumbent's shape with the target's cut and shape fields)."""
    if state.fingerprint == job.incumbent_fingerprint:
        return True
    shape = {**((job.incumbent_layout or {}).get("shape") or {}),
             **{name: value for name, value in job.target.items() if name not in ("cut", "rung")}}
    running_shape = state.shape.to_dict()
    return (state.cut.to_list() == (job.prediction or {}).get("cut")
            and all(running_shape.get(name) == value for name, value in shape.items()))


def note_restart_mid_apply(job: Job, state: EngineState, engine_url: str) -> LayoutObservation:
    """The engine restarted under `job`'s apply and runs `state`'s layout, one the job did not lead to: noted as the
    known layout (cause `restarted`, with the job, which it does not credit), one `engine.restarted_mid_apply` audit
    event (actor: the system) and, on commit, the webhook of that name. Call it in the transaction that ends the
    job, so the alert and the job's end commit together."""
    known = LayoutObservation.objects.known(engine_url)
    before, now = known.layout() if known else job.incumbent_layout, state.layout()
    seen = LayoutObservation.objects.create(engine_url=engine_url, cause=LayoutCause.RESTARTED_MID_APPLY, job=job,
                                            before=before, **now)
    engine = {"url": engine_url, "before": before, "after": now, "boot_id_before": job.engine_boot_id,
              "boot_id_after": state.boot_id or ""}
    record(actor=None, action=RESTARTED_MID_APPLY, subject=f"engine:{engine_url}"[:255], before=before, after=now,
           payload={**engine, "job": job.pk, "target": job.target, "observation": seen.pk,
                    "cause": f"the engine restarted under job {job.pk}'s apply, on a layout the job did not lead to"})
    transaction.on_commit(partial(_announce_restart, job.pk, engine), robust=True)
    log.warning("the engine at %s restarted under job %s's apply and came back on layout %s, which the job did not "
                "lead to", engine_url, job.pk, state.fingerprint)
    return seen


def _announce_restart(job_id: int, engine: dict) -> None:
    job = Job.objects.filter(pk=job_id).first()  # as committed: ended
    if job is not None:
        webhooks.announce_restart_mid_apply(job, engine)


def watch(client: EngineClient | None = None) -> str:
    """Compare the engine's layout with the known one, and note its health (console.jobs.health_watch); returns
    what was found about the layout, in words."""
    if client is None:
        with EngineClient() as own:
            return watch(own)
    try:
        state = client.state()
    except EngineError as error:
        health_watch.note_health(client.base_url, *health_watch.health_of(None, str(error)))
        return f"the engine's layout was not read: {error}"
    health_watch.note_health(client.base_url, *health_watch.health_of(state))
    url, now = client.base_url, state.layout()
    with transaction.atomic():
        known = LayoutObservation.objects.known(url)
        if known is None:
            LayoutObservation.objects.create(engine_url=url, cause=LayoutCause.FIRST_SEEN, **now)
            return f"first seen: layout {state.fingerprint}"
        if state.fingerprint == known.fingerprint:
            return f"unchanged: layout {known.fingerprint}"
        if state.phase != "serving":
            return f"the engine is {state.phase}: looked at again next time"
        running = Job.objects.filter(status=JobStatus.RUNNING).order_by("pk").first()
        if running is not None:
            return f"job {running.pk} is running: its end explains the change"
        cause = (Job.objects.filter(status__in=_ENDED_ON_ENGINE, finished_at__gte=known.observed_at,
                                    layout_observations__isnull=True).exclude(engine_operation_id="")
                 .order_by("-finished_at").first())
        if cause is not None and restarted_since(cause, state):
            note_restart_mid_apply(cause, state, url)
            return f"restarted: job {cause.pk}'s engine came back on layout {state.fingerprint}"
        if cause is not None:
            LayoutObservation.objects.create(engine_url=url, cause=LayoutCause.JOB, job=cause, before=known.layout(),
                                             **now)
            return f"layout {state.fingerprint}: job {cause.pk}'s doing"
        seen = LayoutObservation.objects.create(engine_url=url, cause=LayoutCause.UNEXPLAINED, before=known.layout(),
                                                **now)
        record(actor=None, action=UNEXPLAINED_CHANGE, subject=f"engine:{url}"[:255], before=known.layout(), after=now,
               payload={"engine_url": url, "observation": seen.pk, "known_since": known.observed_at.isoformat(),
                        "cause": "no job of the console caused it"})
        engine = {"url": url, "before": known.layout(), "after": now, "observation": seen.pk,
                  "known_since": known.observed_at.isoformat()}
        transaction.on_commit(partial(webhooks.announce_unexplained_change, engine), robust=True)
    log.warning("the engine at %s changed its layout from %s to %s and no job of the console caused it", url,
                known.fingerprint, state.fingerprint)
    return f"unexplained: layout {known.fingerprint} -> {state.fingerprint}"


def recent_unexplained_change() -> LayoutObservation | None:
    """The newest layout change no job caused, if it happened within WARN_FOR: the dashboard's warning."""
    return LayoutObservation.objects.filter(cause=LayoutCause.UNEXPLAINED,
                                            observed_at__gte=timezone.now() - WARN_FOR).first()


def recent_restart_mid_apply() -> LayoutObservation | None:
    """The newest layout an engine came back on after restarting under a job's apply, within WARN_FOR: the
    dashboard's warning."""
    return LayoutObservation.objects.filter(cause=LayoutCause.RESTARTED_MID_APPLY,
                                            observed_at__gte=timezone.now() - WARN_FOR).select_related("job").first()

"""Noticing a layout change that no job of the console caused (docs/console.md, "Trust model").

The console keeps the layout it knows each engine runs: the newest LayoutObservation of that engine's URL. When a
job's operation ends on the engine, the worker notes the layout the engine then runs as that job's doing
(`note_job_end`). Beat runs `watch()` every SEAM_LAYOUT_WATCH_S; when the engine's fingerprint has moved from the
known one:

- while a job is running or the engine is between layouts, nothing is decided (the job's end will explain it);
- a job that ended on the engine since the known layout was noted, without a note of its own (its worker lost
  the engine just then), explains it;
- otherwise nothing the console did explains it — an operator bypassing the console, or someone holding its
  credentials: one `engine.unexplained_change` audit event (actor: the system) with the layouts before and after,
  recorded once per change (the new layout becomes the known one), and a warning on the dashboard.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from console.audit.services import record
from console.jobs.choices import JobStatus
from console.jobs.engine_client import EngineClient, EngineError, EngineState
from console.jobs.models import Job, LayoutCause, LayoutObservation

__all__ = ["UNEXPLAINED_CHANGE", "note_job_end", "recent_unexplained_change", "watch"]

log = logging.getLogger("seam.jobs")

UNEXPLAINED_CHANGE = "engine.unexplained_change"
# The endings of a job whose operation ran on the engine: after these the engine may run another layout.
_ENDED_ON_ENGINE = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.ROLLED_BACK)
# How long the dashboard keeps warning of an unexplained change: long enough that nobody misses it over a weekend;
# the audit trail keeps it for good.
WARN_FOR = timedelta(days=7)


def _layout(state: EngineState) -> dict:
    return {"fingerprint": state["fingerprint"], "cut": state["cut"], "shape": state["shape"]}


def note_job_end(job: Job, state: EngineState, engine_url: str) -> None:
    """The job's operation has ended: the layout the engine runs now (its `state`, read by the worker) is the job's
    doing."""
    known = LayoutObservation.objects.known(engine_url)
    LayoutObservation.objects.create(engine_url=engine_url, cause=LayoutCause.JOB, job=job,
                                     before=known.layout() if known else None, **_layout(state))


def watch(client: EngineClient | None = None) -> str:
    """Compare the engine's layout with the known one; returns what was found, in words."""
    if client is None:
        with EngineClient() as own:
            return watch(own)
    try:
        state = client.state()
    except EngineError as error:
        return f"the engine's layout was not read: {error}"
    url, now = client.base_url, _layout(state)
    with transaction.atomic():
        known = LayoutObservation.objects.known(url)
        if known is None:
            LayoutObservation.objects.create(engine_url=url, cause=LayoutCause.FIRST_SEEN, **now)
            return f"first seen: layout {now['fingerprint']}"
        if now["fingerprint"] == known.fingerprint:
            return f"unchanged: layout {known.fingerprint}"
        if state.get("phase") != "serving":
            return f"the engine is {state.get('phase')}: looked at again next time"
        running = Job.objects.filter(status=JobStatus.RUNNING).order_by("pk").first()
        if running is not None:
            return f"job {running.pk} is running: its end explains the change"
        cause = (Job.objects.filter(status__in=_ENDED_ON_ENGINE, finished_at__gte=known.observed_at,
                                    layout_observations__isnull=True).exclude(engine_operation_id="")
                 .order_by("-finished_at").first())
        if cause is not None:
            LayoutObservation.objects.create(engine_url=url, cause=LayoutCause.JOB, job=cause, before=known.layout(),
                                             **now)
            return f"layout {now['fingerprint']}: job {cause.pk}'s doing"
        seen = LayoutObservation.objects.create(engine_url=url, cause=LayoutCause.UNEXPLAINED, before=known.layout(),
                                                **now)
        record(actor=None, action=UNEXPLAINED_CHANGE, subject=f"engine:{url}"[:255], before=known.layout(), after=now,
               payload={"engine_url": url, "observation": seen.pk, "known_since": known.observed_at.isoformat(),
                        "cause": "no job of the console caused it"})
    log.warning("the engine at %s changed its layout from %s to %s and no job of the console caused it", url,
                known.fingerprint, now["fingerprint"])
    return f"unexplained: layout {known.fingerprint} -> {now['fingerprint']}"


def recent_unexplained_change() -> LayoutObservation | None:
    """The newest layout change no job caused, if it happened within WARN_FOR: the dashboard's warning."""
    return LayoutObservation.objects.filter(cause=LayoutCause.UNEXPLAINED,
                                            observed_at__gte=timezone.now() - WARN_FOR).first()

"""Noticing the engine's health change: ok, unhealthy (broken, or caught in a recovery loop: the engine says why) or
unreachable (its state could not be read).

The layout watch (console.jobs.layout_watch.watch, run by beat every SEAM_LAYOUT_WATCH_S) reads the engine's state
and hands what it found here. When the status or its reason differs from the newest HealthObservation of that
engine, a new one is noted with an `engine.health_changed` audit event (actor: the system) and, on commit, the
`engine.health` webhook (console.jobs.webhooks); an unchanged health notes nothing, so a sick engine is announced
once, and again when it recovers. The first sight of an engine notes its health and announces it only when it is
not ok.
"""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction

from console.audit.services import record
from console.jobs import webhooks
from console.jobs.models import EngineHealth, HealthObservation
from contracts.control import EngineState

__all__ = ["HEALTH_CHANGED", "health_of", "note_health"]

log = logging.getLogger("seam.jobs")

HEALTH_CHANGED = "engine.health_changed"
_REASON_CHARS = 500


def health_of(state: EngineState | None, error: str | None = None) -> tuple[str, str]:
    """(status, reason) of an engine whose state was read (`state`) or could not be (`error`, why)."""
    if state is None:
        return EngineHealth.UNREACHABLE.value, (error or "its state could not be read")[:_REASON_CHARS]
    if state.health is None or state.health.ok:
        return EngineHealth.OK.value, ""
    return EngineHealth.UNHEALTHY.value, (state.health.reason or f"phase {state.health.phase}")[:_REASON_CHARS]


def note_health(engine_url: str, status: str, reason: str) -> str:
    """Note the engine's health when it changed; returns what was found, in words."""
    with transaction.atomic():
        known = HealthObservation.objects.select_for_update().filter(engine_url=engine_url) \
            .order_by("-observed_at", "-id").first()
        if known is not None and (known.status, known.reason) == (status, reason):
            return f"health unchanged: {status}"
        seen = HealthObservation.objects.create(engine_url=engine_url[:255], status=status, reason=reason)
        if known is None and status == EngineHealth.OK:
            return f"health first seen: {status}"
        engine = {"url": engine_url, "before": known.to_dict() if known else None, "after": seen.to_dict()}
        record(actor=None, action=HEALTH_CHANGED, subject=f"engine:{engine_url}"[:255],
               before=engine["before"], after=engine["after"], payload={**engine, "observation": seen.pk})
        transaction.on_commit(partial(webhooks.announce_engine_health, engine), robust=True)
    log.warning("the engine at %s is now %s%s", engine_url, status, f": {reason}" if reason else "")
    return f"health {known.status if known else 'unknown'} -> {status}"

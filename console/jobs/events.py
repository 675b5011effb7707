"""The one hook that tells browsers a job changed: `publish_job_update(job)` -> channel group `job-<id>`.

Called by the lifecycle on commit of every change (transitions and progress), never before, so a browser
never sees a state that rolled back. The message is

    {"type": "job.update", "job": {id, status, phase, progress, error, plan_hash, engine_operation_id,
                                  prediction_pool_tokens, measured_pool_tokens, updated}}

(a consumer handles it in `job_update`). Sending is best effort: the change is committed already, so a
channel layer that is down is logged, never raised into the job.

Celery workers are synchronous: each send runs `async_to_sync` on a fresh event loop, and channels-redis
keeps its connection pools per loop. Each send uses a layer of its own and closes that layer's pools before
the loop ends, so no connection is left bound to a dead loop (the "Event loop is closed" errors a long-lived
worker otherwise collects) and the shared layer that serves websockets in this process is never touched.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import channel_layers, get_channel_layer

__all__ = ["group_name", "job_message", "publish_job_update"]

log = logging.getLogger("seam.jobs")


def group_name(job_id: int) -> str:
    return f"job-{job_id}"


def _pool(figures: dict | None) -> int | None:
    return figures.get("pool_tokens") if isinstance(figures, dict) else None


def job_message(job) -> dict:
    """JSON-only (the Redis layer packs with msgpack): what a job page needs to redraw its status."""
    return {"type": "job.update", "job": {
        "id": job.pk, "status": job.status, "phase": job.phase, "progress": job.progress, "error": job.error,
        "plan_hash": job.plan_hash, "engine_operation_id": job.engine_operation_id,
        "prediction_pool_tokens": _pool(job.prediction), "measured_pool_tokens": _pool(job.measured),
        "updated": job.updated.isoformat() if job.updated else None,
    }}


async def _send(group: str, message: dict) -> None:
    # A layer of our own: closing the shared layer's pools would cut the sockets this process serves.
    if get_channel_layer() is None:
        return
    layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
    try:
        await layer.group_send(group, message)
    finally:
        close_pools = getattr(layer, "close_pools", None)
        if close_pools is not None:
            await close_pools()


def publish_job_update(job) -> None:
    """THE hook for live job pages: send the job's current state to group `job-<id>`. Call it on commit."""
    try:
        async_to_sync(_send)(group_name(job.pk), job_message(job))
    except Exception:  # the change is committed; a missed live message is refetched by the page
        log.warning("could not publish job %s to the channel layer", job.pk, exc_info=True)

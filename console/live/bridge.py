"""Engine telemetry (Redis pub/sub) -> the channel-layer group `telemetry`, and gap fills from the recent list.

The engine publishes each snapshot's JSON on `TELEMETRY_CHANNEL`, keeps the newest at `{channel}:latest` and
the last 256, newest first, in the list `{channel}:recent` (engine/telemetry/publisher.py); the key names are
contracts/telemetry.py's. The bridge relays snapshots as they were published: it reads only their seq.

`run_bridge` forwards every snapshot as `{"type": "telemetry.snapshot", "snapshot": {...}}` to the group
`telemetry`. Redis going away never ends it: it logs once, backs off (doubling, capped) and resubscribes.
Snapshots published while it was away are not replayed here: pages fetch any gap by seq (`recent_since`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable

import redis
import redis.asyncio as aioredis
from channels.layers import channel_layers

from contracts.telemetry import published_seq, telemetry_keys

__all__ = ["TELEMETRY_GROUP", "run_bridge", "recent_since"]

log = logging.getLogger("seam.live")

TELEMETRY_GROUP = "telemetry"
SNAPSHOT_EVENT = "telemetry.snapshot"
BACKOFF_S = (0.25, 5.0)  # first retry delay, ceiling; doubled per failure in between
POLL_S = 0.5  # how often a quiet bridge looks at its stop flag


async def recent_since(client: aioredis.Redis, channel: str, after_seq: int) -> list[dict]:
    """Snapshots with seq > after_seq still held in the recent list, oldest first (a subscriber's gap fill)."""
    held = []
    for raw in await client.lrange(telemetry_keys(channel)[1], 0, -1):
        decoded = _decode(raw)
        if decoded is not None and decoded[0] > after_seq:
            held.append(decoded)
    return [snapshot for _seq, snapshot in sorted(held, key=lambda pair: pair[0])]


def _decode(raw: bytes | str) -> tuple[int, dict] | None:
    """(seq, the snapshot as published) for a snapshot with an integer seq, or None (logged) for anything else."""
    try:
        snapshot = json.loads(raw)
    except ValueError:
        log.warning("telemetry bridge: skipping a message that is not JSON: %.80r", raw)
        return None
    seq = published_seq(snapshot)
    if seq is None:
        log.warning("telemetry bridge: skipping a message without an integer seq: %.80r", raw)
        return None
    return seq, snapshot


async def _forward(pubsub, layer, stop: threading.Event | asyncio.Event) -> None:
    while not stop.is_set():
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=POLL_S)
        if message is None or message.get("type") != "message":
            continue
        decoded = _decode(message["data"])
        if decoded is not None:
            await layer.group_send(TELEMETRY_GROUP, {"type": SNAPSHOT_EVENT, "snapshot": decoded[1]})


async def run_bridge(redis_url: str, channel: str, *, stop: threading.Event | asyncio.Event | None = None,
                     on_subscribed: Callable[[], None] | None = None, layer_alias: str = "default") -> None:
    """Forward `channel`'s snapshots to the group `telemetry` until `stop` is set (forever without one).

    `on_subscribed` is called after each (re)subscription, so a caller knows from when messages are caught.
    The channel layer is a backend of its own, and its pools are closed on the way out.
    """
    stop = stop or asyncio.Event()
    layer = channel_layers.make_backend(layer_alias)
    backoff, outage = BACKOFF_S[0], False
    try:
        while not stop.is_set():
            client = aioredis.Redis.from_url(redis_url, socket_connect_timeout=2.0, health_check_interval=10)
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(channel)
                if outage:
                    log.info("telemetry bridge: Redis is back; forwarding %s again", channel)
                else:
                    log.info("telemetry bridge: forwarding %s to group %r", channel, TELEMETRY_GROUP)
                backoff, outage = BACKOFF_S[0], False
                if on_subscribed is not None:
                    on_subscribed()
                await _forward(pubsub, layer, stop)
            except (redis.RedisError, OSError) as error:
                if not outage:
                    log.warning("telemetry bridge: Redis unavailable (%s); retrying with backoff up to %gs",
                                error, BACKOFF_S[1])
                outage = True
                await layer.close_pools()  # pooled connections may point at the Redis that went away
                await _sleep_unless_stopped(stop, backoff)
                backoff = min(backoff * 2, BACKOFF_S[1])
            finally:
                await _quietly(pubsub.aclose())
                await _quietly(client.aclose())
    finally:
        await layer.close_pools()


async def _sleep_unless_stopped(stop: threading.Event | asyncio.Event, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stop.is_set() and loop.time() < deadline:
        await asyncio.sleep(min(POLL_S, deadline - loop.time()))


async def _quietly(closing) -> None:
    with contextlib.suppress(redis.RedisError, OSError):
        await closing

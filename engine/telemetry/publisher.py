"""Telemetry out of the engine: snapshots to Redis, and the snapshot's schema (no Django).

The publisher keeps three things per channel, so a live page can follow AWX's protocol (load the
latest, subscribe, fetch any gap by seq): pub/sub messages on `channel`, the newest snapshot at
`{channel}:latest`, and the last RECENT snapshots, newest first, in the list `{channel}:recent` (the key names are
contracts/telemetry.py's, which the console reads them by).
Redis going away must never take the engine with it: the publisher logs once, backs off, and resumes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from numbers import Real

import redis

from contracts.telemetry import DEFAULT_CHANNEL, telemetry_keys
from engine.telemetry.schema import validate_snapshot

log = logging.getLogger(__name__)

RECENT = 256
MAX_HZ = 100.0
BACKOFF_S = (0.25, 5.0)  # first retry delay, ceiling; doubled per failure in between


def recent_since(client: redis.Redis, channel: str, after_seq: int) -> list[dict]:
    """Snapshots with seq > after_seq still held in the recent list, oldest first (a subscriber's gap fill)."""
    held = [json.loads(raw) for raw in client.lrange(telemetry_keys(channel)[1], 0, -1)]
    return sorted((snap for snap in held if snap.get("seq", -1) > after_seq), key=lambda snap: snap["seq"])


class TelemetryPublisher:
    """Calls `snapshot_fn` `hz` times a second on a daemon thread and publishes each snapshot's JSON."""

    def __init__(self, snapshot_fn: Callable[[], dict], redis_url: str, channel: str = DEFAULT_CHANNEL,
                 hz: float = 4.0, *, recent: int = RECENT, validate: bool = True):
        if isinstance(hz, bool) or not isinstance(hz, Real) or not 0 < hz <= MAX_HZ:
            raise ValueError(f"telemetry hz must be a number in (0, {MAX_HZ:g}] (got {hz!r})")
        if not isinstance(recent, int) or recent < 1:
            raise ValueError(f"telemetry recent must be a positive whole number (got {recent!r})")
        self.snapshot_fn, self.channel, self.period_s = snapshot_fn, channel, 1.0 / float(hz)
        self.latest_key, self.recent_key = telemetry_keys(channel)
        self.recent, self.validate = recent, validate
        # Short socket timeouts: a stalled Redis must not hold the thread (or stop()) for long.
        self.client = redis.Redis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.published = 0  # snapshots stored and published
        self.failures = 0  # ticks lost to snapshot_fn or to Redis
        self.last_seq: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"telemetry:{channel}", daemon=True)

    def start(self) -> TelemetryPublisher:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop ticking and join the thread; the Redis connection is closed afterwards."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.client.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> TelemetryPublisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _payload(self) -> tuple[int | None, str]:
        snapshot = self.snapshot_fn()
        if self.validate:
            validate_snapshot(snapshot)
        # Same JSON rules as a plan: no NaN/inf, which browsers' JSON.parse refuses.
        return snapshot.get("seq"), json.dumps(snapshot, separators=(",", ":"), allow_nan=False)

    def _publish(self, payload: str) -> None:
        # Store before publishing: whoever sees seq N on the channel can already refetch it.
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.latest_key, payload)
        pipe.lpush(self.recent_key, payload)
        pipe.ltrim(self.recent_key, 0, self.recent - 1)
        pipe.publish(self.channel, payload)
        pipe.execute()

    def _publish_until_stopped(self, seq: int | None, payload: str) -> None:
        """Publish; while Redis is away, log once and retry this same snapshot with doubling backoff.

        No new snapshot is taken meanwhile (each would spend a seq no subscriber could refetch), so the
        stream resumes gapless when Redis comes back.
        """
        backoff, outage = BACKOFF_S[0], False
        while not self._stop.is_set():
            try:
                self._publish(payload)
            except redis.RedisError as error:
                self.failures += 1
                if not outage:
                    log.warning("telemetry: Redis unavailable (%s); retrying with backoff up to %gs",
                                error, BACKOFF_S[1])
                outage = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_S[1])
                continue
            if outage:
                log.info("telemetry: Redis is back; publishing resumed at seq %s", seq)
            self.published, self.last_seq = self.published + 1, seq
            return

    def _run(self) -> None:
        snapshot_failing = False
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                seq, payload = self._payload()
            except Exception:  # the engine's snapshot code is not ours to crash on: log a streak once
                self.failures += 1
                if not snapshot_failing:
                    log.exception("telemetry: snapshot failed; skipping ticks until it works again")
                snapshot_failing = True
            else:
                if snapshot_failing:
                    log.info("telemetry: snapshots work again")
                snapshot_failing = False
                self._publish_until_stopped(seq, payload)
            # A fixed grid keeps the rate honest; after a stall, restart the grid instead of bursting.
            next_tick += self.period_s
            now = time.monotonic()
            if next_tick < now:
                next_tick = now + self.period_s
            self._stop.wait(next_tick - now)

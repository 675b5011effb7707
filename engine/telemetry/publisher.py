"""Telemetry out of the engine: snapshots to Redis, and the Prometheus text for /metrics (no Django).

The publisher keeps three things per channel, so a live page can follow AWX's protocol (load the
latest, subscribe, fetch any gap by seq): pub/sub messages on `channel`, the newest snapshot at
`{channel}:latest`, and the last RECENT snapshots, newest first, in the list `{channel}:recent` (the key names are
contracts/telemetry.py's, which the console reads them by).
Redis going away must never take the engine with it: the publisher logs once, backs off, and resumes.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from numbers import Integral, Real
from typing import Any

import redis

from contracts.control import OperationStatus
from contracts.measurement import STEP_KINDS
from contracts.telemetry import DEFAULT_CHANNEL, telemetry_keys

log = logging.getLogger(__name__)

RECENT = 256
MAX_HZ = 100.0
BACKOFF_S = (0.25, 5.0)  # first retry delay, ceiling; doubled per failure in between
USED_CATEGORIES = ("weights", "kv_pool", "state_pool", "arena", "workspace", "other")
# Exported even at zero; `queued` only while an operation is (it is queued for an instant).
OPERATION_STATUSES = tuple(status.value for status in OperationStatus if status is not OperationStatus.QUEUED)


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


# --- the snapshot schema (docs/architecture.md §3.4) ---------------------------------------------

_INT, _NUM, _BOOL, _STR = "int", "number", "bool", "str"
RANK_SCHEMA: dict[str, Any] = {
    "rank": _INT, "name": _STR, "device": _STR, "total_bytes": _INT,
    "used": dict.fromkeys(USED_CATEGORIES, _INT), "free_bytes": _INT,
    "corridor_floor_bytes": _INT, "arming_floor_bytes": _INT, "armable": _BOOL,
    "kv": {"tokens_total": _INT, "tokens_used": _INT}, "state_slots": {"total": _INT, "used": _INT},
}
ENGINE_SCHEMA: dict[str, Any] = {
    "cut": [_INT], "shape": {}, "phase": _STR, "running": _INT, "waiting": _INT,
    "prefill_tok_s": _NUM, "decode_tok_s": _NUM, "reconfiguring": _BOOL,
}
SNAPSHOT_SCHEMA: dict[str, Any] = {"seq": _INT, "ts": _NUM, "ranks": [RANK_SCHEMA], "engine": ENGINE_SCHEMA}


_TYPES: dict[str, Callable[[Any], bool]] = {  # bool is an int in Python, never in the schema
    _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    _NUM: lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
    _BOOL: lambda v: isinstance(v, bool), _STR: lambda v: isinstance(v, str),
}


def _check(value: object, schema: Any, where: str) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        for key, sub in schema.items():  # extra keys are allowed: the schema grows, consumers ignore
            if key not in value:
                raise ValueError(f"{where}.{key}: missing")
            _check(value[key], sub, f"{where}.{key}")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        for index, item in enumerate(value):
            _check(item, schema[0], f"{where}[{index}]")
    elif not _TYPES[schema](value):
        raise ValueError(f"{where}: expected {schema}, got {type(value).__name__} {value!r:.60}")


def validate_snapshot(snapshot: object) -> None:
    """Raise ValueError naming the first missing or ill-typed key (e.g. `snapshot.ranks[1].used.arena`)."""
    _check(snapshot, SNAPSHOT_SCHEMA, "snapshot")


# --- Prometheus text exposition -----------------------------------------------------------------

def _escape_label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Real) -> str:
    if isinstance(value, Integral):  # bool too: 1 or 0
        return str(int(value))
    value = float(value)  # plain float repr, also for numpy scalars (whose repr names the type)
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    return repr(value)


class _Exposition:
    """Collects samples per metric so each family prints once: HELP, TYPE, then its samples."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, help_text: str, value: object, labels: dict[str, object] | None = None) -> None:
        if not isinstance(value, Real):
            return  # an absent figure (None) is absent, not zero
        # All gauges: even seam_operations_total, whose per-status counts fall as operations finish.
        family = self.families.setdefault(name, (help_text, "gauge", []))
        label_text = ",".join(f'{key}="{_escape_label(val)}"' for key, val in (labels or {}).items())
        family[2].append(f"{name}{{{label_text}}} {_number(value)}" if label_text else f"{name} {_number(value)}")

    def text(self) -> str:
        lines: list[str] = []
        for name, (help_text, kind, samples) in self.families.items():
            help_escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
            lines += [f"# HELP {name} {help_escaped}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(lines) + "\n"


RANK_METRICS = (  # (metric, help, path in the rank's snapshot)
    ("seam_rank_total_bytes", "Memory budget of the rank in bytes.", ("total_bytes",)),
    ("seam_rank_free_bytes", "Free bytes on the rank after everything resident.", ("free_bytes",)),
    ("seam_rank_corridor_floor_bytes", "Free bytes the rank must keep to survive traffic.", ("corridor_floor_bytes",)),
    ("seam_rank_arming_floor_bytes", "Corridor floor plus seam reserve, in bytes.", ("arming_floor_bytes",)),
    ("seam_rank_armable", "1 when the rank's free bytes clear its arming floor.", ("armable",)),
    ("seam_kv_tokens_total", "KV pool capacity of the rank in tokens.", ("kv", "tokens_total")),
    ("seam_kv_tokens_used", "KV tokens in use on the rank.", ("kv", "tokens_used")),
    ("seam_state_slots_total", "Recurrent state slots on the rank.", ("state_slots", "total")),
    ("seam_state_slots_used", "Recurrent state slots in use on the rank.", ("state_slots", "used")),
)
ENGINE_METRICS = (
    ("seam_engine_running", "Requests running.", "running"),
    ("seam_engine_waiting", "Requests waiting for admission.", "waiting"),
    ("seam_engine_prefill_tokens_per_second", "Prefill throughput over the recent window.", "prefill_tok_s"),
    ("seam_engine_decode_tokens_per_second", "Decode throughput over the recent window.", "decode_tok_s"),
    ("seam_engine_reconfiguring", "1 while a reconfiguration is in progress.", "reconfiguring"),
    ("seam_engine_pool_tokens", "Predicted KV pool of the current layout in tokens.", "pool_tokens"),
    ("seam_engine_preemptions", "Requests preempted by recompute since start.", "preemptions"),
    ("seam_engine_healthy", "1 when /healthz is ok: not broken and not in a recovery loop.", "healthy"),
    ("seam_engine_recoveries_in_a_row", "Failed steps recovered since the last step that succeeded.",
     "recoveries_in_a_row"),
    ("seam_engine_recoveries", "Failed steps recovered since start.", "recoveries"),
)
LATENCY_METRICS = (  # the snapshot's engine.measurement.latency: recent finished requests of the current layout
    ("seam_engine_latency_requests", "Finished requests the latency medians are over.", "requests"),
    ("seam_engine_ttft_ms", "Median time to first token of recent requests, in ms.", "ttft_ms"),
    ("seam_engine_itl_ms", "Median time between output tokens of recent requests, in ms.", "itl_ms"),
)


def _dig(data: dict, path: Iterable[str]) -> object:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _measurement(out: _Exposition, ranks: list[dict], measurement: object) -> None:
    """Stage medians per rank and kind, and the latency medians, of the snapshot's measurement (if it has one)."""
    for kind in STEP_KINDS:
        per_rank = _dig(measurement, (kind, "median_ms"))
        if per_rank is None:
            continue  # no step of this kind since the layout changed
        for rank, ms in zip(ranks, per_rank, strict=True):
            out.add("seam_engine_stage_ms", "Median stage time of the rank over recent steps of the kind, in ms.", ms,
                    {"rank": rank["rank"], "name": rank["name"], "kind": kind})
    for metric, help_text, key in LATENCY_METRICS:
        out.add(metric, help_text, _dig(measurement, ("latency", key)))


def prometheus_text(snapshot: dict, operations: list[dict]) -> str:
    """The /metrics body for one snapshot (validated first) and the engine's operations."""
    validate_snapshot(snapshot)
    out = _Exposition()
    for rank in snapshot["ranks"]:
        labels = {"rank": rank["rank"], "name": rank["name"]}
        for category in USED_CATEGORIES:
            out.add("seam_rank_memory_bytes", "Bytes used on the rank, by category.", rank["used"][category],
                    {**labels, "category": category})
        for metric, help_text, path in RANK_METRICS:
            out.add(metric, help_text, _dig(rank, path), labels)
    engine = snapshot["engine"]
    out.add("seam_engine_info", "The serving layout: cut and phase as labels.", 1,
            {"cut": ",".join(str(n) for n in engine["cut"]), "phase": engine["phase"]})
    for metric, help_text, key in ENGINE_METRICS:
        out.add(metric, help_text, engine.get(key))
    _measurement(out, snapshot["ranks"], engine.get("measurement"))
    counts = dict.fromkeys(OPERATION_STATUSES, 0)
    for operation in operations:
        status = str(operation.get("status", "unknown"))
        counts[status] = counts.get(status, 0) + 1
    for status, count in counts.items():
        out.add("seam_operations_total", "Operations the engine knows of, by status.", count, {"status": status})
    out.add("seam_telemetry_seq", "Sequence number of the snapshot these figures come from.", snapshot["seq"])
    return out.text()

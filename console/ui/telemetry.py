"""The engine's telemetry as the dashboard loads it: the newest snapshot and a short history, from Redis, read as
contracts/telemetry.py's Snapshot.

The history is what the engine still holds in its recent list (engine/telemetry/publisher.py keeps the last 256
snapshots, about a minute at its default 4 Hz): the last HISTORY of them, or, for a time range, every held snapshot
inside it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import redis
from django.conf import settings

from contracts.errors import ContractError
from contracts.measurement import STEP_KINDS, LayoutMeasurement
from contracts.telemetry import EngineSnapshot, Snapshot, telemetry_keys

__all__ = ["HISTORY", "Telemetry", "read_telemetry", "summary"]

HISTORY = 120  # snapshots kept for the sparklines (the engine keeps the last 256)


@dataclass
class Telemetry:
    latest: Snapshot | None = None
    history: list[dict] = field(default_factory=list)  # oldest first: seq, ts and the engine's rates and queue
    error: str | None = None


def _history_point(snapshot: Snapshot) -> dict:
    engine = snapshot.engine
    return {"seq": snapshot.seq, "ts": snapshot.ts,
            "engine": {"prefill_tok_s": engine.prefill_tok_s, "decode_tok_s": engine.decode_tok_s,
                       "running": engine.running, "waiting": engine.waiting}}


def read_telemetry(range_s: int | None = None) -> Telemetry:
    """The newest snapshot, and the history: the last HISTORY snapshots, or those of the last `range_s` seconds."""
    latest_key, recent_key = telemetry_keys(settings.TELEMETRY_CHANNEL)
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        raw_latest = client.get(latest_key)
        raw_recent = client.lrange(recent_key, 0, -1 if range_s else HISTORY - 1)
    except redis.RedisError as error:
        return Telemetry(error=f"the telemetry store at {settings.REDIS_URL} is unreachable ({error})")
    finally:
        client.close()
    latest = _snapshot(raw_latest)
    if raw_latest is not None and latest is None:
        return Telemetry(error=f"the snapshot at {latest_key} is not a telemetry snapshot")
    since = time.time() - range_s if range_s else float("-inf")
    history = sorted((snap for snap in map(_snapshot, raw_recent) if snap is not None and snap.ts >= since),
                     key=lambda s: s.seq)
    return Telemetry(latest=latest, history=[_history_point(snap) for snap in history])


def _snapshot(raw: bytes | None) -> Snapshot | None:
    if raw is None:
        return None
    try:
        return Snapshot.from_dict(json.loads(raw))
    except (ValueError, ContractError):  # not JSON, or not a snapshot
        return None


def summary(snapshot: Snapshot) -> dict:
    """The figures the dashboard shows as text (static/js/dashboard.js derives the same from live snapshots)."""
    engine = snapshot.engine
    pools = [rank for rank in snapshot.ranks if rank.pool_tokens]
    return {
        "cut": engine.cut.to_text(),
        "kv_total": min((rank.pool_tokens for rank in pools), default=0),
        "kv_used": max((rank.pool_tokens_used for rank in pools), default=0),
        "binding_rank": engine.binding_rank,
        "phase": engine.phase,
        "shape": engine.shape,
        "fingerprint": engine.fingerprint or "",
        **measured(engine, [rank.name for rank in snapshot.ranks]),
    }


def measured(engine: EngineSnapshot, rank_names: list[str]) -> dict:
    """What the engine measured of its layout (engine.measurement, contracts/measurement.py): model, rig, each rank's
    stage medians and spread per kind of step, and the latency medians. `stages` is empty while the window has no
    steps, `latency` None while no request has finished: the page says "not measured yet"."""
    measurement: LayoutMeasurement | None = engine.measurement
    if measurement is None:
        return {"model": "", "rig": "", "stages": [], "latency": None, "measurement_error": engine.measurement_error}
    stages = []
    if any(measurement.stats(kind).steps for kind in STEP_KINDS):
        for rank in range(len(measurement.cut)):
            row = {"rank": rank, "name": rank_names[rank] if rank < len(rank_names) else ""}
            for kind in STEP_KINDS:
                stats = measurement.stats(kind)
                row[kind] = None if stats.median_ms is None else {"median_ms": stats.median_ms[rank],
                                                                  "spread_ms": stats.spread_ms[rank]}
            stages.append(row)
    latency = measurement.latency if measurement.latency.requests else None
    return {"model": measurement.model, "rig": measurement.rig, "fingerprint": measurement.fingerprint,
            "stages": stages, "steps": {kind: measurement.stats(kind).steps for kind in STEP_KINDS},
            "latency": latency, "measurement_error": None}

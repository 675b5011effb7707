"""The engine's telemetry as the dashboard loads it: the newest snapshot and a short history, from Redis."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import redis
from django.conf import settings

from console.live.bridge import telemetry_keys

__all__ = ["HISTORY", "Telemetry", "read_telemetry", "summary"]

HISTORY = 120  # snapshots kept for the sparklines (the engine keeps the last 256)


@dataclass
class Telemetry:
    latest: dict | None = None
    history: list[dict] = field(default_factory=list)  # oldest first: seq, ts and the engine's rates and queue
    error: str | None = None


def _history_point(snapshot: dict) -> dict:
    engine = snapshot.get("engine") or {}
    return {"seq": snapshot["seq"], "ts": snapshot.get("ts"),
            "engine": {name: engine.get(name) for name in ("prefill_tok_s", "decode_tok_s", "running", "waiting")}}


def read_telemetry() -> Telemetry:
    latest_key, recent_key = telemetry_keys(settings.TELEMETRY_CHANNEL)
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        raw_latest, raw_recent = client.get(latest_key), client.lrange(recent_key, 0, HISTORY - 1)
    except redis.RedisError as error:
        return Telemetry(error=f"the telemetry store at {settings.REDIS_URL} is unreachable ({error})")
    finally:
        client.close()
    latest = _snapshot(raw_latest)
    if raw_latest is not None and latest is None:
        return Telemetry(error=f"the snapshot at {latest_key} is not a telemetry snapshot")
    history = sorted((snap for snap in map(_snapshot, raw_recent) if snap is not None), key=lambda s: s["seq"])
    return Telemetry(latest=latest, history=[_history_point(snap) for snap in history])


def _snapshot(raw: bytes | None) -> dict | None:
    try:
        snapshot = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    ok = isinstance(snapshot, dict) and isinstance(snapshot.get("seq"), int) and isinstance(snapshot.get("ranks"), list)
    return snapshot if ok else None


def summary(snapshot: dict) -> dict:
    """The figures the dashboard shows as text (static/js/dashboard.js derives the same from live snapshots)."""
    engine = snapshot.get("engine") or {}
    pools = [rank["kv"] for rank in snapshot["ranks"] if (rank.get("kv") or {}).get("tokens_total")]
    return {
        "cut": ",".join(str(layers) for layers in engine.get("cut") or []),
        "kv_total": min((kv["tokens_total"] for kv in pools), default=0),
        "kv_used": max((kv.get("tokens_used", 0) for kv in pools), default=0),
        "binding_rank": engine.get("binding_rank"),
        "phase": engine.get("phase", ""),
        "shape": engine.get("shape") or {},
    }

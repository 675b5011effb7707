"""The engine's telemetry: one snapshot a tick (the schema of docs/architecture.md §3.4), and where it is kept.

The engine publishes each snapshot's JSON on a Redis channel, keeps the newest at `{channel}:latest` and the last
few, newest first, in the list `{channel}:recent` (engine/telemetry/publisher.py); the console's bridge and pages read
them there (console/live, console/ui). `telemetry_keys` is the one place those names are made.

A snapshot is `{seq, ts, ranks: [RankSnapshot], engine: EngineSnapshot}`. Consumers ignore keys they do not know,
so the fields past the published schema's first ones are optional when parsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.errors import ContractError
from contracts.layout import Cut
from contracts.measurement import LayoutMeasurement
from contracts.reading import count, field, flag, mapping, number, obj, path, text

__all__ = ["DEFAULT_CHANNEL", "EngineSnapshot", "MemoryUse", "RankSnapshot", "Snapshot", "published_seq",
           "telemetry_keys"]

DEFAULT_CHANNEL = "seam:telemetry"
USED_CATEGORIES = ("weights", "kv_pool", "state_pool", "arena", "workspace", "other")


def telemetry_keys(channel: str) -> tuple[str, str]:
    """(latest, recent) keys of a channel: `seam:telemetry` gives `seam:telemetry:latest` / `:recent`."""
    return f"{channel}:latest", f"{channel}:recent"


def published_seq(data: Any) -> int | None:
    """The seq of what came off a telemetry channel, None when it has none: all a relay needs to order and gap-fill
    (the console's bridge forwards snapshots as they were published)."""
    seq = data.get("seq") if isinstance(data, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{where}: expected a whole number, got {value!r:.40}")
    return value


@dataclass(frozen=True)
class MemoryUse:
    """Bytes a rank holds, by category."""

    weights: int
    kv_pool: int
    state_pool: int
    arena: int
    workspace: int
    other: int

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in USED_CATEGORIES}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> MemoryUse:
        return cls(**{name: _int(field(data, name, where), path(where, name)) for name in USED_CATEGORIES})


@dataclass(frozen=True)
class RankSnapshot:
    """One rank: its memory, floors and pools. The KV pool is `pool_tokens` (with `pool_tokens_used`); on the wire
    they are `kv.tokens_total` and `kv.tokens_used`. `device_memory` is the real device's figures (None on CPU)."""

    rank: int
    name: str
    device: str
    total_bytes: int
    used: MemoryUse
    free_bytes: int
    corridor_floor_bytes: int
    arming_floor_bytes: int
    armable: bool
    pool_tokens: int
    pool_tokens_used: int
    state_slots: int
    state_slots_used: int
    device_memory: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "name": self.name, "device": self.device, "total_bytes": self.total_bytes,
                "used": self.used.to_dict(), "free_bytes": self.free_bytes,
                "corridor_floor_bytes": self.corridor_floor_bytes, "arming_floor_bytes": self.arming_floor_bytes,
                "armable": self.armable, "kv": {"tokens_total": self.pool_tokens, "tokens_used": self.pool_tokens_used},
                "state_slots": {"total": self.state_slots, "used": self.state_slots_used},
                "device_memory": self.device_memory}

    @classmethod
    def from_dict(cls, data: Any, where: str = "rank") -> RankSnapshot:
        def at(name: str) -> str:
            return path(where, name)

        kv, slots = field(data, "kv", where), field(data, "state_slots", where)
        return cls(rank=_int(field(data, "rank", where), at("rank")), name=text(field(data, "name", where), at("name")),
                   device=text(field(data, "device", where), at("device")),
                   total_bytes=_int(field(data, "total_bytes", where), at("total_bytes")),
                   used=MemoryUse.from_dict(field(data, "used", where), at("used")),
                   free_bytes=_int(field(data, "free_bytes", where), at("free_bytes")),
                   corridor_floor_bytes=_int(field(data, "corridor_floor_bytes", where), at("corridor_floor_bytes")),
                   arming_floor_bytes=_int(field(data, "arming_floor_bytes", where), at("arming_floor_bytes")),
                   armable=flag(field(data, "armable", where), at("armable")),
                   pool_tokens=_int(field(kv, "tokens_total", at("kv")), at("kv.tokens_total")),
                   pool_tokens_used=_int(field(kv, "tokens_used", at("kv")), at("kv.tokens_used")),
                   state_slots=_int(field(slots, "total", at("state_slots")), at("state_slots.total")),
                   state_slots_used=_int(field(slots, "used", at("state_slots")), at("state_slots.used")),
                   device_memory=mapping(data.get("device_memory"), at("device_memory"), allow_none=True))


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine as a whole: layout and phase, queue and rates, pool, health, and its measurement of the layout
    (a measurement that does not parse leaves `measurement` None and says why in `measurement_error`). `shape` is
    carried as it came."""

    cut: Cut
    shape: dict[str, Any]
    phase: str
    running: int
    waiting: int
    prefill_tok_s: float
    decode_tok_s: float
    reconfiguring: bool
    fingerprint: str | None = None
    pool_tokens: int | None = None
    binding_rank: int | None = None
    preemptions: int | None = None
    healthy: bool | None = None
    recoveries_in_a_row: int | None = None
    recoveries: int | None = None
    measurement: LayoutMeasurement | None = None
    measurement_error: str | None = None  # parsing only: why `measurement` is None although one was sent

    def to_dict(self) -> dict[str, Any]:
        return {"cut": self.cut.to_list(), "shape": dict(self.shape), "phase": self.phase, "running": self.running,
                "waiting": self.waiting, "prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s,
                "reconfiguring": self.reconfiguring, "fingerprint": self.fingerprint,
                "pool_tokens": self.pool_tokens, "binding_rank": self.binding_rank, "preemptions": self.preemptions,
                "healthy": self.healthy, "recoveries_in_a_row": self.recoveries_in_a_row,
                "recoveries": self.recoveries,
                "measurement": None if self.measurement is None else self.measurement.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str = "engine") -> EngineSnapshot:
        def at(name: str) -> str:
            return path(where, name)

        measurement, measurement_error = None, None
        if obj(data, where).get("measurement") is not None:
            try:
                measurement = LayoutMeasurement.from_dict(data["measurement"], at("measurement"))
            except ContractError as error:
                measurement_error = str(error)
        healthy = data.get("healthy")
        return cls(cut=Cut.parse(field(data, "cut", where), at("cut")),
                   shape=mapping(field(data, "shape", where), at("shape")),
                   phase=text(field(data, "phase", where), at("phase")),
                   running=count(field(data, "running", where), at("running")),
                   waiting=count(field(data, "waiting", where), at("waiting")),
                   prefill_tok_s=number(field(data, "prefill_tok_s", where), at("prefill_tok_s")),
                   decode_tok_s=number(field(data, "decode_tok_s", where), at("decode_tok_s")),
                   reconfiguring=flag(field(data, "reconfiguring", where), at("reconfiguring")),
                   fingerprint=text(data.get("fingerprint"), at("fingerprint"), allow_none=True),
                   pool_tokens=count(data.get("pool_tokens"), at("pool_tokens"), allow_none=True),
                   binding_rank=count(data.get("binding_rank"), at("binding_rank"), allow_none=True),
                   preemptions=count(data.get("preemptions"), at("preemptions"), allow_none=True),
                   healthy=None if healthy is None else flag(healthy, at("healthy")),
                   recoveries_in_a_row=count(data.get("recoveries_in_a_row"), at("recoveries_in_a_row"),
                                             allow_none=True),
                   recoveries=count(data.get("recoveries"), at("recoveries"), allow_none=True),
                   measurement=measurement, measurement_error=measurement_error)


@dataclass(frozen=True)
class Snapshot:
    """One telemetry tick, numbered by `seq` (a subscriber fetches any gap by seq); `ts` is the engine's clock."""

    seq: int
    ts: float
    ranks: tuple[RankSnapshot, ...]
    engine: EngineSnapshot

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "ts": self.ts, "ranks": [rank.to_dict() for rank in self.ranks],
                "engine": self.engine.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str = "snapshot") -> Snapshot:
        ranks = field(data, "ranks", where)
        if not isinstance(ranks, list):
            raise ContractError(f"{where}.ranks: expected a list, got {type(ranks).__name__}")
        return cls(seq=_int(field(data, "seq", where), f"{where}.seq"),
                   ts=number(field(data, "ts", where), f"{where}.ts"),
                   ranks=tuple(RankSnapshot.from_dict(rank, f"{where}.ranks[{index}]")
                               for index, rank in enumerate(ranks)),
                   engine=EngineSnapshot.from_dict(field(data, "engine", where), f"{where}.engine"))

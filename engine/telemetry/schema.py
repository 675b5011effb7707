"""The telemetry snapshot's schema (docs/architecture.md §3.4), checked where a snapshot is made: by the publisher
before it goes to Redis, and by the metrics exposition before it is scraped. Apart from the publisher, so that what
serves /metrics (the engine's front end) needs no Redis client.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from contracts.telemetry import USED_CATEGORIES

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

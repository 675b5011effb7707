"""Canonical JSON: the one byte form that plans, attestations, layout fingerprints and the audit chain are hashed in."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from contracts.errors import ContractError
from contracts.reading import show

__all__ = ["canonical_json"]


def _check_json(value: object, where: str) -> None:
    """Only plain JSON types: a tuple and a list hash alike, but {1: x} and {"1": x} must not."""
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ContractError(f"{where}: {value!r} has no JSON form; plans carry finite numbers only")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ContractError(f"{where}: key {show(key)} is not a string")
            _check_json(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]")
    else:
        raise ContractError(f"{where}: {type(value).__name__} has no JSON form")


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, ASCII only, floats as Python repr; NaN and infinities refused."""
    _check_json(obj, "plan")
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except ValueError as error:  # e.g. an integer past Python's digit limit
        raise ContractError(f"plan: cannot be written as canonical JSON ({error})") from error

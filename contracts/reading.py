"""Reading untrusted JSON into the contract types: each helper names the field by its path when it refuses.

Messages must stay short whatever arrives (a hostile body must not make the message itself huge), hence `show`.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

from contracts.errors import ContractError

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 3, 4, 40, 40, 24


def show(value: object) -> str:
    """A short repr for messages: hostile input must not make the message itself huge or fail."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return f"a {value.bit_length()}-bit integer"
    try:
        return _REPR.repr(value)
    except ValueError:  # an integer past Python's digit limit, nested in a container
        return f"a {type(value).__name__} holding an over-long integer"


def path(where: str, name: str) -> str:
    """`where.name`, or `name` at the root (where == "")."""
    return f"{where}.{name}" if where else name


def obj(data: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise ContractError(f"{where or 'reply'}: expected an object, got {type(data).__name__}")
    return data


def field(data: Any, name: str, where: str) -> Any:
    """`data[name]`; ContractError when `data` is no object or has no `name`."""
    if name not in obj(data, where):
        raise ContractError(f"{path(where, name)}: missing")
    return data[name]


def number(value: Any, where: str, *, allow_none: bool = False) -> float | None:
    """A finite number >= 0, as a float."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ContractError(f"{where}: expected a finite number >= 0, got {value!r}")
    return float(value)


def count(value: Any, where: str, *, allow_none: bool = False) -> int | None:
    """A whole number >= 0."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ContractError(f"{where}: expected a whole number >= 0, got {value!r}")
    return value


def text(value: Any, where: str, *, allow_none: bool = False, allow_empty: bool = True) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not (allow_empty or value):
        what = "a string" if allow_empty else "a non-empty string"
        raise ContractError(f"{where}: expected {what}, got {show(value)}")
    return value


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError(f"{where}: expected true or false, got {show(value)}")
    return value


def texts(value: Any, where: str) -> tuple[str, ...]:
    """A list of strings, as a tuple."""
    if not isinstance(value, list | tuple):
        raise ContractError(f"{where}: expected a list of strings, got {type(value).__name__}")
    return tuple(text(item, f"{where}[{index}]") for index, item in enumerate(value))


def mapping(value: Any, where: str, *, allow_none: bool = False) -> dict[str, Any] | None:
    """An object kept as it came (a shape the contract carries without reading it)."""
    if value is None and allow_none:
        return None
    return dict(obj(value, where))

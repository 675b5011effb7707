"""Sizes and bandwidths as operators write them ("20GiB", "600 MiB", "12.5GB/s") and as tables print them."""

from __future__ import annotations

import re

from solvers.errors import SolverError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(-?[0-9]*\.?[0-9]+)\s*([a-z]*)\s*$")


def parse_size(value: int | float | str, where: str = "size", *, require_unit: bool = False) -> int:
    """Bytes from an int or a string with a unit; refuses negatives and unknown units.

    `require_unit` (what a rig file gets) refuses a bare non-zero number: `memory: 24` could be bytes
    or GB, and guessing either boots a rig that is not the one described. Zero needs no unit.
    """
    if isinstance(value, bool):
        raise SolverError(f"{where}: expected a size like '20GiB' or a byte count, got {value!r}")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    elif isinstance(value, str) and (match := _SIZE.match(value.lower())):
        number, unit = float(match.group(1)), match.group(2)
    else:
        raise SolverError(f"{where}: expected a size like '20GiB' or a byte count, got {value!r}")
    if unit not in _UNITS:
        raise SolverError(f"{where}: unknown unit {unit!r} in {value!r}; use B, KiB, MiB, GiB, KB, MB, GB")
    if number < 0:
        raise SolverError(f"{where}: a size cannot be negative (got {value!r})")
    if require_unit and not unit and number != 0:
        shown = str(value).strip()
        raise SolverError(f"{where}: {value!r} has no unit (bytes or GB?); write '{shown}GiB' or '{shown}GB' "
                          f"(or '{shown}B' for bytes)")
    return round(number * _UNITS[unit])


def parse_bandwidth(value: int | float | str, where: str = "bandwidth", *, require_unit: bool = False) -> float:
    """Bytes per second from e.g. '12.5GB/s' or a number of bytes per second; must be positive."""
    text = value.lower().removesuffix("/s") if isinstance(value, str) else value
    bytes_per_s = parse_size(text, where, require_unit=require_unit)
    if bytes_per_s <= 0:
        raise SolverError(f"{where}: a bandwidth must be positive (got {value!r})")
    return float(bytes_per_s)


def exact_size(count: int, *, decimal: bool = False) -> str:
    """`count` bytes in the largest unit that holds it exactly ('32GiB', '600MiB', '858993459B'), so
    parse_size reads back the same number; `decimal` prefers GB/MB/KB (link speeds are quoted so)."""
    binary = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
    metric = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
    for unit, size in (metric + binary if decimal else binary + metric):
        if count and count % size == 0:
            return f"{count // size}{unit}"
    return f"{count}B"


def format_bytes(count: int | float) -> str:
    """A compact human size for tables (binary units)."""
    sign = "-" if count < 0 else ""
    size = abs(float(count))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{sign}{size:.0f} {unit}" if unit == "B" else f"{sign}{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")

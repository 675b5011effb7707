"""The pages' one way to write units and numbers (`{% load formatting %}`); static/js/format.js writes the same for
the live pages, so a figure reads alike whether the server or the browser drew it.

Byte counts are binary (KiB, MiB, GiB), per-rank lists (a cut, stage ms) are separated by " · ", times carry "ms"
with two decimals, speedups an "x", errors a sign and a "%". A missing value is "—".
"""

from __future__ import annotations

from collections.abc import Sequence

from django import template

__all__ = ["binary_bytes", "cut", "ms", "ms_list", "percent", "speedup", "speedup_interval"]

register = template.Library()

MISSING = "—"
SEPARATOR = " · "
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _missing(value) -> bool:
    return value is None or value == ""


@register.filter
def binary_bytes(value: int | float | None) -> str:
    """33554432 -> "32.0 MiB"; 512 -> "512 B" (as format.js bytes())."""
    if _missing(value):
        return MISSING
    amount, unit = float(value), 0
    while abs(amount) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        amount /= 1024
        unit += 1
    return f"{amount:.1f} {_BYTE_UNITS[unit]}" if unit else f"{amount:.0f} B"


@register.filter
def cut(values: Sequence[int] | None) -> str:
    """[7, 5, 4] -> "7 · 5 · 4" (layers per rank, or any per-rank count)."""
    if not values:
        return MISSING
    return SEPARATOR.join(str(value) for value in values)


@register.filter
def ms(value: float | None, digits: int = 2) -> str:
    """6.3969 -> "6.40 ms"."""
    if _missing(value):
        return MISSING
    return f"{float(value):.{int(digits)}f} ms"


@register.filter
def ms_list(values: Sequence[float | None] | None, digits: int = 2) -> str:
    """[6.3969, 4.5071, 3.9725] -> "6.40 · 4.51 · 3.97 ms" (one figure per rank)."""
    if not values:
        return MISSING
    figures = SEPARATOR.join(MISSING if value is None else f"{float(value):.{int(digits)}f}" for value in values)
    return f"{figures} ms"


@register.filter
def speedup(value: float | None) -> str:
    """1.0712 -> "1.07x"."""
    if _missing(value):
        return MISSING
    return f"{float(value):.2f}x"


@register.filter
def speedup_interval(bounds: Sequence[float | None] | None) -> str:
    """[0.96, 1.07] -> "0.96x–1.07x"; an open upper end is "∞"."""
    if not bounds:
        return MISSING
    low, high = bounds
    return f"{speedup(low)}–{'∞' if high is None else speedup(high)}"


@register.filter
def percent(fraction: float | None, digits: int = 1) -> str:
    """0.0123 -> "+1.2%" (a signed error)."""
    if _missing(fraction):
        return MISSING
    return f"{float(fraction) * 100:+.{int(digits)}f}%"

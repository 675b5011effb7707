"""Template filters for the calibration pages: errors as signed percentages, cuts as "7,5,4"."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def percent(fraction: float | None, digits: int = 1) -> str:
    """0.0123 -> "+1.2%"; None -> "—" (nothing to compare yet)."""
    if fraction is None or fraction == "":
        return "—"
    return f"{float(fraction) * 100:+.{int(digits)}f}%"


@register.filter
def numbers(values: list | None, digits: int = 2) -> str:
    """[18.81, 10.5] -> "18.81, 10.50"; None -> "—"."""
    if not values:
        return "—"
    return ", ".join("—" if value is None else f"{float(value):.{int(digits)}f}" for value in values)

"""Plain-text tables for the command line: right-aligned numbers, left-aligned text."""

from __future__ import annotations

from collections.abc import Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[_text(value) for value in row] for row in rows]
    widths = [max(len(str(h)), *(len(row[i]) for row in cells)) if cells else len(str(h))
              for i, h in enumerate(headers)]
    numeric = [all(_is_number(row[i]) for row in rows) if rows else False for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True))

    out = [line([str(h) for h in headers]), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    return "\n".join(text.rstrip() for text in out)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list | tuple):
        return ",".join(_text(v) for v in value)
    return str(value)

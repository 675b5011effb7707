"""Reading a rig file's fields: every error names the file and the field path, and sizes need units."""

from __future__ import annotations

from typing import Any

from solvers.errors import RigError, SolverError
from solvers.units import parse_bandwidth, parse_size


class FieldReader:
    """Field readers that raise RigError naming the file and the field path."""

    def __init__(self, source: str):
        self.source = source

    def error(self, where: str, message: str) -> RigError:
        return RigError(f"rig {self.source}: {where + ': ' if where else ''}{message}")

    def only(self, data: dict, where: str, allowed: set[str]) -> None:
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise self.error(where, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")

    def size(self, value: Any, where: str) -> int:
        try:
            return parse_size(value, where, require_unit=True)
        except SolverError as error:
            raise self.error("", str(error)) from error

    def bandwidth(self, value: Any, where: str) -> float:
        try:
            return parse_bandwidth(value, where, require_unit=True)
        except SolverError as error:
            raise self.error("", str(error)) from error

    def components(self, data: Any, where: str) -> dict[str, int]:
        if not isinstance(data, dict) or not data:
            raise self.error(where, "must name at least one component, e.g. {staging: 512MiB}")
        return {str(name): self.size(value, f"{where}.{name}") for name, value in data.items()}

    def cut(self, value: Any, where: str, ranks: int) -> tuple[int, ...]:
        if (not isinstance(value, list | tuple) or len(value) != ranks
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)):
            raise self.error(where, f"must be {ranks} positive layer counts, one per rank (got {value!r})")
        return tuple(value)

"""Reading a config's fields with errors that name the family and every missing field."""

from __future__ import annotations

from typing import Any

from solvers.errors import CensusError

_MISSING = object()


class ConfigFields:
    """A config dict seen through one family adapter."""

    def __init__(self, config: dict[str, Any], family: str, source: str):
        self.config = config
        self.family = family
        self.source = source

    def get(self, *names: str, default: Any = _MISSING) -> Any:
        """The first of `names` present (configs disagree on names), else `default`."""
        for name in names:
            value = self.config.get(name)
            if value is not None:
                return value
        if default is _MISSING:
            raise self.missing(" or ".join(names))
        return default

    def require(self, *names: str) -> list[Any]:
        """All `names`, or one error listing every one that is absent."""
        absent = [name for name in names if self.config.get(name) is None]
        if absent:
            raise self.missing(*absent)
        return [self.config[name] for name in names]

    def missing(self, *names: str) -> CensusError:
        return CensusError(
            f"{self.source}: family {self.family!r} cannot be priced: missing field(s) {', '.join(names)}"
        )

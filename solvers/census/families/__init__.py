"""Family adapters: each maps one family's config vocabulary onto a ModelCensus.

ADAPTERS maps a config's `model_type` to the adapter that prices it.
"""

from __future__ import annotations

from collections.abc import Callable

from solvers.census.fields import ConfigFields
from solvers.census.model import ModelCensus

Adapter = Callable[[ConfigFields], ModelCensus]

ADAPTERS: dict[str, Adapter] = {}


def adapter(*model_types: str) -> Callable[[Adapter], Adapter]:
    """Register a family adapter for the given `model_type` values."""

    def register(function: Adapter) -> Adapter:
        for model_type in model_types:
            ADAPTERS[model_type] = function
        return function

    return register

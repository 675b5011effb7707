"""Numeric query parameters declared once: each is read from the request with its limits (a value outside them is
refused with 400 naming the parameter) and documented in the OpenAPI schema with the same limits, so a client that
keeps to the schema (schemathesis' positive_data_acceptance checks it) is never refused, and one that does not is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError

__all__ = ["NumberQuery"]


@dataclass(frozen=True, kw_only=True)
class NumberQuery:
    """?name=: a finite number (`whole`: a whole number, digits only) in [minimum, maximum], or [minimum, below)."""

    name: str
    description: str
    minimum: float
    maximum: float | None = None
    below: float | None = None  # an exclusive upper limit
    whole: bool = False
    example: str

    def read(self, query_params, default: float | None = None) -> float | None:
        """The value of ?name=, `default` when it is absent; ValidationError naming it when outside its limits."""
        raw = query_params.get(self.name)
        if raw is None:
            return default  # absent; an empty value (`?limit=`) is not a number and is refused below
        try:
            if self.whole and not (raw.isascii() and raw.isdigit()):
                raise ValueError(raw)
            value = int(raw) if self.whole else float(raw)
        except ValueError:
            value = math.nan  # refused below, with the limits in words
        # NaN fails every comparison, so it is refused here too; inf fails the finiteness test.
        if not (math.isfinite(value) and value >= self.minimum and (self.maximum is None or value <= self.maximum)
                and (self.below is None or value < self.below)):
            raise ValidationError({self.name: f"expected {self.limits()}, e.g. {self.example} (got {raw[:40]!r})"})
        return value

    def limits(self) -> str:
        kind = "a whole number" if self.whole else "a finite number"
        if self.below is not None:
            return f"{kind} from {self.minimum:g} up to (not including) {self.below:g}"
        if self.maximum is not None:
            return f"{kind} from {self.minimum:g} to {self.maximum:g}"
        return f"{kind} >= {self.minimum:g}"

    def schema(self) -> dict:
        schema = {"type": "integer" if self.whole else "number", "minimum": self.minimum}
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.below is not None:  # OpenAPI 3.0: a boolean beside maximum
            schema.update(maximum=self.below, exclusiveMaximum=True)
        return schema

    def parameter(self) -> OpenApiParameter:
        return OpenApiParameter(self.name, self.schema(), description=f"{self.description}: {self.limits()}")

"""Limit/offset pages whose parameters are checked: a limit or offset that is not a whole number in range is
refused with 400 naming it, never silently replaced by the default."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

__all__ = ["Pages"]


class Pages(LimitOffsetPagination):
    default_limit, max_limit = 100, 1000

    def get_limit(self, request) -> int:
        return min(self._count(request, self.limit_query_param, self.default_limit, minimum=1), self.max_limit)

    def get_offset(self, request) -> int:
        return self._count(request, self.offset_query_param, 0, minimum=0)

    @staticmethod
    def _count(request, name: str, default: int, minimum: int) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default  # absent; an empty value (`?limit=`) is not a number and is refused below
        if not raw.isascii() or not raw.isdigit() or int(raw) < minimum:
            raise ValidationError({name: f"expected a whole number >= {minimum}, got {raw[:40]!r}"})
        return int(raw)

    def get_schema_operation_parameters(self, view) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1 if parameter["name"] == self.limit_query_param else 0
        return parameters

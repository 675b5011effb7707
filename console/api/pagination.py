"""Limit/offset pages whose parameters are checked: a limit or offset that is not a whole number in range is
refused with 400 naming it, never silently replaced by the default; the schema declares the same limits
(console/api/query.py). A limit above `max_limit` is answered with `max_limit` items, as DRF does."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

from console.api.query import NumberQuery

__all__ = ["Pages"]


class Pages(LimitOffsetPagination):
    default_limit, max_limit = 100, 1000
    LIMIT = NumberQuery(name="limit", minimum=1, whole=True, example="100",
                        description=f"items per page (default {default_limit}; more than {max_limit} answers "
                                    f"{max_limit})")
    OFFSET = NumberQuery(name="offset", minimum=0, whole=True, example="0", description="items to skip (default 0)")

    def get_limit(self, request) -> int:
        return min(self.LIMIT.read(request.query_params, self.default_limit), self.max_limit)

    def get_offset(self, request) -> int:
        return self.OFFSET.read(request.query_params, 0)

    @classmethod
    def parameters(cls) -> list:
        """The two parameters for an extend_schema of a view that pages by hand (PredictionsView)."""
        return [cls.LIMIT.parameter(), cls.OFFSET.parameter()]

    def get_schema_operation_parameters(self, view) -> list[dict]:
        return [{"name": query.name, "required": False, "in": "query", "description": query.parameter().description,
                 "schema": query.schema()} for query in (self.LIMIT, self.OFFSET)]

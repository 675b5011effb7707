"""Request ids: stamped on every request by middleware, returned as X-Request-ID, read by the audit service.

The id is kept in a contextvar for the request's duration, so `services.record` finds it without every
caller threading it through; Celery tasks carry it explicitly and re-bind it with `bind_request_id`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

__all__ = ["HEADER", "RequestIdMiddleware", "bind_request_id", "current_request_id", "is_sane_request_id",
           "new_request_id"]

HEADER = "X-Request-ID"
_META_KEY = "HTTP_X_REQUEST_ID"
# What an upstream proxy may hand us: a short token of safe characters (uuids, hex, dotted trace ids).
_SANE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")

_current: ContextVar[str | None] = ContextVar("seam_request_id", default=None)


def is_sane_request_id(value: object) -> bool:
    return isinstance(value, str) and _SANE.fullmatch(value) is not None


def new_request_id() -> str:
    return str(uuid.uuid4())


def current_request_id() -> str | None:
    """The id of the request (or task) this code runs for; None outside one."""
    return _current.get()


@contextmanager
def bind_request_id(request_id: str | None) -> Iterator[str | None]:
    """Run a block as part of `request_id` (e.g. a Celery task carrying the id of the request that queued it)."""
    if request_id is not None and not is_sane_request_id(request_id):
        raise ValueError(f"request id {request_id[:80]!r} is not a short token of letters, digits and ._:-")
    token = _current.set(request_id)
    try:
        yield request_id
    finally:
        _current.reset(token)


class RequestIdMiddleware:
    """Sets `request.request_id` (the incoming X-Request-ID when sane, else a new uuid4) and echoes it back."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self._async:
            return self.__acall__(request)
        request_id = self._stamp(request)
        with bind_request_id(request_id):
            response = self.get_response(request)
        response[HEADER] = request_id
        return response

    async def __acall__(self, request):
        request_id = self._stamp(request)
        with bind_request_id(request_id):
            response = await self.get_response(request)
        response[HEADER] = request_id
        return response

    @staticmethod
    def _stamp(request) -> str:
        incoming = request.META.get(_META_KEY)
        request_id = incoming if is_sane_request_id(incoming) else new_request_id()
        request.request_id = request_id
        return request_id

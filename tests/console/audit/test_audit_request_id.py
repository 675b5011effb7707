"""RequestIdMiddleware stamps every request with an id, returns it, and the audit service records it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import iscoroutinefunction
from django.http import HttpResponse
from django.test import RequestFactory

from console.audit.request_id import RequestIdMiddleware, bind_request_id, current_request_id
from console.audit.services import record


def _echo(request):
    return HttpResponse(f"{request.request_id}|{current_request_id()}")


def _call(header: str | None = None, view=_echo):
    extra = {} if header is None else {"HTTP_X_REQUEST_ID": header}
    request = RequestFactory().get("/", **extra)
    return request, RequestIdMiddleware(view)(request)


def test_a_sane_incoming_id_is_kept():
    request, response = _call("edge-7f3a.1:2")
    assert request.request_id == "edge-7f3a.1:2"
    assert response["X-Request-ID"] == "edge-7f3a.1:2"
    assert response.content.decode() == "edge-7f3a.1:2|edge-7f3a.1:2"


@pytest.mark.parametrize("header", [None, "", "has space", "x" * 65, "semi;colon", "new\nline", "-leading-dash",
                                    "caf\u00e9"])
def test_a_missing_or_odd_incoming_id_is_replaced_by_a_uuid4(header):
    request, response = _call(header)
    assert uuid.UUID(request.request_id).version == 4
    assert response["X-Request-ID"] == request.request_id
    assert response.content.decode() == f"{request.request_id}|{request.request_id}"


def test_the_id_does_not_outlive_the_request():
    _call("req-a")
    assert current_request_id() is None


def test_the_id_is_unset_even_when_the_view_raises():
    def boom(request):
        raise RuntimeError("view failed")
    with pytest.raises(RuntimeError):
        _call("req-b", view=boom)
    assert current_request_id() is None


def test_async_stack():
    async def view(request):
        return HttpResponse(current_request_id())

    middleware = RequestIdMiddleware(view)
    assert iscoroutinefunction(middleware)
    response = asyncio.run(middleware(RequestFactory().get("/", HTTP_X_REQUEST_ID="async-1")))
    assert (response["X-Request-ID"], response.content) == ("async-1", b"async-1")
    assert current_request_id() is None


def test_bind_request_id_refuses_odd_ids():
    with pytest.raises(ValueError, match="not a short token"), bind_request_id("two words"):
        pass


@pytest.mark.django_db
def test_an_event_recorded_during_a_request_carries_its_id():
    def view(request):
        event = record(actor=None, action="job.propose", subject="job:1", payload={})
        return HttpResponse(event.request_id)

    request, response = _call(view=view)
    assert response.content.decode() == request.request_id == response["X-Request-ID"]

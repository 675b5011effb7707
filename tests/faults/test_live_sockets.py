"""Live sockets under the channel layer as the settings configure it (real Redis): a socket that hears nothing
for longer than channels-redis' 5 s blocking pop stays open, and far more than 100 sockets subscribe at once.
Both closed sockets with 1011 before the settings raised redis-py's socket timeout and pool cap."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.testing import WebsocketCommunicator

from console.asgi import application
from tests.support.live import TIMEOUT_S, login_headers, request, run, subscribe, wake_receivers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def configured_layer(settings):
    """The configured channel layer (its hosts exactly as console.settings has them), on a prefix of its own."""
    default = settings.CHANNEL_LAYERS["default"]
    settings.CHANNEL_LAYERS = {"default": {**default, "CONFIG": {**default["CONFIG"],
                                                                 "prefix": f"seam-test-{uuid.uuid4().hex[:12]}"}}}
    return settings


@pytest.mark.slow
def test_a_socket_that_hears_nothing_for_a_while_stays_open(configured_layer, make_user):
    headers = login_headers(make_user("viewer"))

    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT_S))[0]
        await subscribe(communicator, "job-1")
        assert await communicator.receive_nothing(timeout=8)  # past the 5 s pop: the consumer must still be there
        reply = await request(communicator, {"action": "fetch", "after_seq": 0})
        assert reply["type"] == "fetched"
        await wake_receivers()
        await communicator.disconnect(timeout=TIMEOUT_S)
    run(scenario)


def test_many_more_than_100_sockets_subscribe_at_once(configured_layer, make_user):
    headers = login_headers(make_user("viewer"))
    sockets = 150

    async def one() -> WebsocketCommunicator:
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT_S))[0]
        return communicator

    async def scenario():
        communicators = await asyncio.gather(*(one() for _ in range(sockets)))
        replies = await asyncio.gather(*(request(c, {"action": "subscribe", "groups": ["telemetry"]})
                                         for c in communicators))
        assert [reply["type"] for reply in replies] == ["subscribed"] * sockets
        await wake_receivers()
        await asyncio.gather(*(c.disconnect(timeout=TIMEOUT_S) for c in communicators))
    run(scenario)

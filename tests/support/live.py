"""The live tests' world: real Redis, the real Redis channel layer, the real ASGI application.

Each test gets a channel-layer prefix and a telemetry channel of its own, so a bridge or a browser elsewhere
on this Redis neither sees nor disturbs ours. Sockets log in the way a browser does: a session cookie made
by Django's test client, through console.asgi's AuthMiddlewareStack and origin check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client

from console.asgi import application
from console.live.bridge import run_bridge
from contracts.telemetry import telemetry_keys

TIMEOUT_S = 5


@pytest.fixture
def live_settings(settings):
    token = uuid.uuid4().hex[:12]
    settings.CHANNEL_LAYERS = {"default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [settings.REDIS_URL], "prefix": f"seam-test-{token}"},
    }}
    settings.TELEMETRY_CHANNEL = f"seam:test:{token}:telemetry"
    yield settings
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*telemetry_keys(settings.TELEMETRY_CHANNEL))
    client.close()


@pytest.fixture
def redis_client(live_settings):
    client = redis.Redis.from_url(live_settings.REDIS_URL)
    yield client
    client.close()


def publish(client: redis.Redis, channel: str, seq: int, **extra) -> dict:
    """Store and publish one snapshot the way engine/telemetry/publisher.py does (store first, then publish)."""
    snapshot = {"seq": seq, "ts": 1000.0 + seq, "ranks": [], "engine": {"phase": "serving"}, **extra}
    payload = json.dumps(snapshot)
    latest, recent = telemetry_keys(channel)
    pipe = client.pipeline(transaction=True)
    pipe.set(latest, payload)
    pipe.lpush(recent, payload)
    pipe.ltrim(recent, 0, 255)
    pipe.publish(channel, payload)
    pipe.execute()
    return snapshot


def login_headers(user=None, origin: str = "http://127.0.0.1:8000",
                  host: str = "127.0.0.1:8000") -> list[tuple[bytes, bytes]]:
    """A browser's handshake headers: its page's Origin, the Host it connects to, and `user`'s session."""
    headers = [(b"origin", origin.encode()), (b"host", host.encode())]
    if user is not None:
        client = Client()
        client.force_login(user)
        cookie = client.cookies[django_settings.SESSION_COOKIE_NAME].value
        headers.append((b"cookie", f"{django_settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    return headers


@contextlib.asynccontextmanager
async def live_socket(headers):
    """An open /ws/live/ socket, disconnected (and its consumer's groups discarded) however the test ends."""
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    connected, _ = await communicator.connect(timeout=TIMEOUT_S)
    assert connected
    try:
        yield communicator
    finally:
        await wake_receivers()
        await communicator.disconnect(timeout=TIMEOUT_S)


async def wake_receivers() -> None:
    """A consumer's pending channel-layer receive holds its shutdown for channels-redis' 5 s BZPOPMIN (the
    cancel waits for it); one message on this process's channel key ends the wait at once."""
    layer = get_channel_layer()
    await layer.send(await layer.new_channel(), {"type": "test.wake"})


async def request(communicator: WebsocketCommunicator, message: dict) -> dict:
    await communicator.send_json_to(message)
    return await communicator.receive_json_from(timeout=TIMEOUT_S)


async def subscribe(communicator: WebsocketCommunicator, *groups: str) -> None:
    reply = await request(communicator, {"action": "subscribe", "groups": list(groups)})
    assert reply == {"type": "subscribed", "groups": sorted(set(groups))}, reply


async def close_layer() -> None:
    """Close this loop's channel-layer pools before the loop ends (no connection bound to a dead loop)."""
    layer = get_channel_layer()
    if layer is None:
        return
    await layer.close_pools()


def run(scenario) -> None:
    """Run an async scenario on a fresh loop, closing the channel layer's pools at the end."""
    async def wrapped():
        try:
            await asyncio.wait_for(scenario(), timeout=30)
        finally:
            await close_layer()
    async_to_sync(wrapped)()  # sync_to_async work (sessions, users) runs on this, the test's, thread


class BridgeThread:
    """`run_bridge` on its own thread and event loop, as `manage.py telemetry_bridge` runs it."""

    def __init__(self, redis_url: str, channel: str):
        self.redis_url, self.channel = redis_url, channel
        self.subscribed, self.stop = threading.Event(), threading.Event()
        self.subscriptions = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def _on_subscribed(self) -> None:
        self.subscriptions += 1
        self.subscribed.set()

    async def _run(self) -> None:
        await run_bridge(self.redis_url, self.channel, stop=self.stop, on_subscribed=self._on_subscribed)

    def __enter__(self) -> BridgeThread:
        self.thread.start()
        assert self.subscribed.wait(TIMEOUT_S), "the bridge did not subscribe"
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT_S)
        assert not self.thread.is_alive(), "the bridge did not stop"


@pytest.fixture
def bridge(live_settings):
    with BridgeThread(live_settings.REDIS_URL, live_settings.TELEMETRY_CHANNEL) as running:
        yield running

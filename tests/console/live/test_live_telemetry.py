"""Telemetry through the bridge to a subscribed socket, and gap fills by seq from the recent list."""

import pytest
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

import engine.telemetry.publisher
from console.live import bridge as live_bridge
from tests.support.live import TIMEOUT_S, live_socket, login_headers, publish, request, run, subscribe

pytestmark = pytest.mark.django_db(transaction=True)


def test_subscribed_client_receives_a_snapshot_through_the_bridge(live_settings, make_user, redis_client, bridge):
    headers, channel = login_headers(make_user("viewer")), live_settings.TELEMETRY_CHANNEL

    async def scenario():
        async with live_socket(headers) as communicator:
            await subscribe(communicator, "telemetry")
            sent = publish(redis_client, channel, seq=41)
            received = await communicator.receive_json_from(timeout=TIMEOUT_S)
            assert received == {"type": "telemetry", "snapshot": sent}
            redis_client.publish(channel, b"not json")  # skipped, and the bridge carries on
            sent = publish(redis_client, channel, seq=42)
            assert (await communicator.receive_json_from(timeout=TIMEOUT_S))["snapshot"] == sent
    run(scenario)


def test_unsubscribed_client_gets_no_telemetry(live_settings, make_user, redis_client, bridge):
    headers, channel = login_headers(make_user("viewer")), live_settings.TELEMETRY_CHANNEL

    async def scenario():
        async with live_socket(headers) as watcher, live_socket(headers) as other:
            await subscribe(watcher, "telemetry")
            await subscribe(other, "job-3")
            publish(redis_client, channel, seq=1)
            assert (await watcher.receive_json_from(timeout=TIMEOUT_S))["snapshot"]["seq"] == 1
            # The watcher has it, so the layer delivered it; the other socket's first message is its job's.
            await get_channel_layer().group_send("job-3", {"type": "job.update", "job": {"id": 3}})
            assert (await other.receive_json_from(timeout=TIMEOUT_S)) == {"type": "job", "job": {"id": 3}}
    run(scenario)


def test_gap_fetch_returns_the_missing_snapshots_oldest_first(live_settings, make_user, redis_client):
    headers, channel = login_headers(make_user("viewer")), live_settings.TELEMETRY_CHANNEL
    sent = [publish(redis_client, channel, seq=seq) for seq in range(1, 8)]

    async def scenario():
        async with live_socket(headers) as communicator:
            # The page loaded seq 3, subscribed, and asks for what came after.
            await subscribe(communicator, "telemetry")
            reply = await request(communicator, {"action": "fetch", "after_seq": 3})
            assert reply == {"type": "fetched", "after_seq": 3, "snapshots": sent[3:]}
            assert [s["seq"] for s in reply["snapshots"]] == [4, 5, 6, 7]
            reply = await request(communicator, {"action": "fetch", "after_seq": 7})
            assert reply["snapshots"] == []
    run(scenario)


def test_gap_fetch_of_an_unknown_channel_is_empty(live_settings, make_user):
    headers = login_headers(make_user("viewer"))

    async def scenario():
        async with live_socket(headers) as communicator:
            assert (await request(communicator, {"action": "fetch", "after_seq": -1}))["snapshots"] == []
    run(scenario)


def test_key_names_match_the_engine(live_settings, redis_client):
    """Console and engine take the key names from contracts/telemetry.py: the bridge's gap fill reads what the
    engine's reads."""
    channel = live_settings.TELEMETRY_CHANNEL
    for seq in (5, 6, 7):
        publish(redis_client, channel, seq=seq)

    async def ours():
        client = aioredis.Redis.from_url(live_settings.REDIS_URL)
        try:
            return await live_bridge.recent_since(client, channel, 5)
        finally:
            await client.aclose()

    assert async_to_sync(ours)() == engine.telemetry.publisher.recent_since(redis_client, channel, 5)

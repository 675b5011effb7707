"""Who may open /ws/live/ and what they may subscribe to."""

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from console.asgi import application
from console.live.consumers import CLOSE_UNAUTHENTICATED
from tests.support.live import TIMEOUT_S, live_socket, login_headers, publish, request, run, subscribe, wake_receivers

pytestmark = pytest.mark.django_db(transaction=True)


def test_anonymous_socket_is_closed_with_4401(live_settings):
    async def scenario():
        async with live_socket(login_headers(user=None)) as communicator:
            closed = await communicator.receive_output(timeout=TIMEOUT_S)
            assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}
    run(scenario)


@pytest.mark.parametrize("origin", ["http://evil.example:8000", "http://127.0.0.1:9999"])
def test_foreign_origin_is_refused(live_settings, make_user, origin):
    headers = login_headers(make_user("viewer"), origin=origin)

    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
        connected, _ = await communicator.connect(timeout=TIMEOUT_S)
        assert not connected
        await wake_receivers()  # the denier waits on the channel layer until the disconnect, like any consumer
        await communicator.disconnect(timeout=TIMEOUT_S)
    run(scenario)


def test_logged_in_user_subscribes_to_telemetry_and_a_job(live_settings, make_user):
    headers = login_headers(make_user("viewer"))

    async def scenario():
        async with live_socket(headers) as communicator:
            reply = await request(communicator, {"action": "subscribe", "groups": ["telemetry", "job-42"]})
            assert reply == {"type": "subscribed", "groups": ["job-42", "telemetry"]}
    run(scenario)


@pytest.mark.parametrize("groups", [["telemetry"], ["job-42"], ["telemetry", "job-42"]])
def test_a_user_without_a_console_role_is_refused_every_group(live_settings, make_user, groups):
    headers = login_headers(make_user(name="nobody"))

    async def scenario():
        async with live_socket(headers) as communicator:
            reply = await request(communicator, {"action": "subscribe", "groups": groups})
            assert reply["type"] == "error" and reply["refused"] == sorted(groups), reply
            assert "none of the console roles" in reply["error"]
            await get_channel_layer().group_send("telemetry", {"type": "telemetry.snapshot", "snapshot": {"seq": 1}})
            await get_channel_layer().group_send("job-42", {"type": "job.update", "job": {"id": 42}})
            assert await communicator.receive_nothing(timeout=0.5)
    run(scenario)


def test_a_user_without_a_console_role_cannot_fetch_telemetry(live_settings, make_user, redis_client):
    publish(redis_client, live_settings.TELEMETRY_CHANNEL, 1)
    headers = login_headers(make_user(name="nobody"))

    async def scenario():
        async with live_socket(headers) as communicator:
            reply = await request(communicator, {"action": "fetch", "after_seq": 0})
            assert reply["type"] == "error" and "none of the console roles" in reply["error"], reply
    run(scenario)


def test_a_revoked_role_refuses_the_next_subscribe(live_settings, make_user):
    user = make_user("viewer")
    headers = login_headers(user)

    async def scenario():
        async with live_socket(headers) as communicator:
            await subscribe(communicator, "telemetry")
            await database_sync_to_async(user.groups.clear)()
            reply = await request(communicator, {"action": "subscribe", "groups": ["telemetry"]})
            assert reply["type"] == "error" and reply["refused"] == ["telemetry"], reply
    run(scenario)


@pytest.mark.parametrize("group", ["nope", "job-", "job-0", "job-x", "telemetry2", "", 7, None])
def test_unknown_group_is_refused_and_nothing_is_joined(live_settings, make_user, group):
    headers = login_headers(make_user("viewer"))

    async def scenario():
        async with live_socket(headers) as communicator:
            reply = await request(communicator, {"action": "subscribe", "groups": ["telemetry", group]})
            assert reply["type"] == "error" and reply["refused"] == [str(group)], reply
            assert "unknown group" in reply["error"]
            # All or nothing: "telemetry" was not joined either. Ordering proves it without a wait: a telemetry
            # event sent before a job event would arrive first.
            await subscribe(communicator, "job-9")
            layer = get_channel_layer()
            await layer.group_send("telemetry", {"type": "telemetry.snapshot", "snapshot": {"seq": 1}})
            await layer.group_send("job-9", {"type": "job.update", "job": {"id": 9}})
            assert await communicator.receive_json_from(timeout=TIMEOUT_S) == {"type": "job", "job": {"id": 9}}
    run(scenario)


@pytest.mark.parametrize("message", [{"action": "dance"}, {"groups": ["telemetry"]}, {"action": "subscribe"},
                                     {"action": "fetch"}, {"action": "fetch", "after_seq": "3"},
                                     {"action": "fetch", "after_seq": True}])
def test_malformed_requests_get_an_error_message(live_settings, make_user, message):
    headers = login_headers(make_user("viewer"))

    async def scenario():
        async with live_socket(headers) as communicator:
            reply = await request(communicator, message)
            assert reply["type"] == "error" and reply["error"]
    run(scenario)

"""Who may open /ws/live/ and what they may subscribe to."""

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from live_helpers import TIMEOUT_S, live_socket, login_headers, request, run, subscribe

from console.asgi import application
from console.live.consumers import CLOSE_UNAUTHENTICATED

pytestmark = pytest.mark.django_db(transaction=True)


def test_anonymous_socket_is_closed_with_4401(live_settings):
    async def scenario():
        async with live_socket(login_headers(user=None)) as communicator:
            closed = await communicator.receive_output(timeout=TIMEOUT_S)
            assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}
    run(scenario)


def test_foreign_origin_is_refused(live_settings, make_user):
    headers = login_headers(make_user(), origin="http://evil.example")

    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
        connected, _ = await communicator.connect(timeout=TIMEOUT_S)
        assert not connected
    run(scenario)


def test_logged_in_user_subscribes_to_telemetry_and_a_job(live_settings, make_user):
    headers = login_headers(make_user())

    async def scenario():
        async with live_socket(headers) as communicator:
            reply = await request(communicator, {"action": "subscribe", "groups": ["telemetry", "job-42"]})
            assert reply == {"type": "subscribed", "groups": ["job-42", "telemetry"]}
    run(scenario)


@pytest.mark.parametrize("group", ["nope", "job-", "job-0", "job-x", "telemetry2", "", 7, None])
def test_unknown_group_is_refused_and_nothing_is_joined(live_settings, make_user, group):
    headers = login_headers(make_user())

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
    headers = login_headers(make_user())

    async def scenario():
        async with live_socket(headers) as communicator:
            reply = await request(communicator, message)
            assert reply["type"] == "error" and reply["error"]
    run(scenario)

"""Job updates from console.jobs.events reach the sockets subscribed to that job, and only those."""

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from console.jobs.events import group_name
from tests.support.live import TIMEOUT_S, live_socket, login_headers, request, run, subscribe

pytestmark = pytest.mark.django_db(transaction=True)


def test_job_update_reaches_only_the_job_s_subscribers(live_settings, make_user):
    headers = login_headers(make_user("viewer"))
    update = {"type": "job.update", "job": {"id": 7, "status": "running", "progress": 0.5}}

    async def scenario():
        async with live_socket(headers) as watcher, live_socket(headers) as other:
            await subscribe(watcher, "job-7")
            await subscribe(other, "job-8", "telemetry")
            layer = get_channel_layer()
            await layer.group_send(group_name(7), update)
            await layer.group_send(group_name(8), {"type": "job.update", "job": {"id": 8}})
            assert await watcher.receive_json_from(timeout=TIMEOUT_S) == {"type": "job", "job": update["job"]}
            # Sent after job 7's update: had job 7's reached `other`, it would have come first.
            assert await other.receive_json_from(timeout=TIMEOUT_S) == {"type": "job", "job": {"id": 8}}
    run(scenario)


def test_resubscribing_replaces_the_groups(live_settings, make_user):
    headers = login_headers(make_user("viewer"))

    async def scenario():
        async with live_socket(headers) as communicator:
            await subscribe(communicator, "job-7")
            assert (await request(communicator, {"action": "subscribe", "groups": ["job-8"]}))["groups"] == ["job-8"]
            layer = get_channel_layer()
            await layer.group_send("job-7", {"type": "job.update", "job": {"id": 7}})
            await layer.group_send("job-8", {"type": "job.update", "job": {"id": 8}})
            assert await communicator.receive_json_from(timeout=TIMEOUT_S) == {"type": "job", "job": {"id": 8}}
    run(scenario)


def test_publish_job_update_hook_reaches_a_socket(live_settings, make_user):
    """The jobs app's own hook (sync, as services call it on commit) delivers to a subscribed socket."""
    from types import SimpleNamespace

    from console.jobs.events import publish_job_update
    headers = login_headers(make_user("viewer"))
    job = SimpleNamespace(pk=7, status="running", phase="apply", progress=0.25, error="", plan_hash="h",
                          engine_operation_id="op", prediction={"pool_tokens": 10}, measured=None, updated=None)

    async def scenario():
        async with live_socket(headers) as communicator:
            await subscribe(communicator, "job-7")
            await sync_to_async(publish_job_update, thread_sensitive=False)(job)
            received = await communicator.receive_json_from(timeout=TIMEOUT_S)
            assert received["type"] == "job" and received["job"]["id"] == 7
            assert received["job"]["progress"] == 0.25 and received["job"]["prediction_pool_tokens"] == 10
    run(scenario)

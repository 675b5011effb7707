import json
import uuid

import pytest
import redis

pytestmark = pytest.mark.django_db


@pytest.fixture
def channel(settings):
    settings.TELEMETRY_CHANNEL = f"seam-test-telemetry-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client, settings.TELEMETRY_CHANNEL
    client.delete(f"{settings.TELEMETRY_CHANNEL}:latest")
    client.close()


def test_latest_snapshot(channel, get, make_user):
    client, name = channel
    client.set(f"{name}:latest", json.dumps({"seq": 7, "ranks": []}))
    assert get("/api/v1/telemetry/latest/", user=make_user("viewer")) == {"seq": 7, "ranks": []}


def test_no_snapshot_yet_is_404_with_a_message(channel, get, make_user):
    body = get("/api/v1/telemetry/latest/", user=make_user("viewer"), expect=404)
    assert "no telemetry snapshot yet" in body["detail"]

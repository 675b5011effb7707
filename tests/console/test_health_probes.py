"""GET /healthz and /readyz (console.probes): open to probes, against the real database, Redis and engine.

A dependency that is down is a closed port; one that hangs is a socket that accepts and never answers.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from console.engine import EngineClient

SECRET = "hunter2-not-for-probes"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes the connection (the kernel's backlog) and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def channel_layer_at(settings, url: str) -> None:
    settings.CHANNEL_LAYERS = {"default": {**settings.CHANNEL_LAYERS["default"],
                                           "CONFIG": {**settings.CHANNEL_LAYERS["default"]["CONFIG"],
                                                      "hosts": [{"address": url}]}}}


def test_healthz_answers_any_host_over_plain_http_without_a_login_or_the_database(client, settings):
    """No django_db mark: pytest-django fails any database access, so this also shows liveness touches none."""
    settings.SECURE_SSL_REDIRECT = True
    response = client.get("/healthz", HTTP_HOST="10.1.2.3:8000")  # a load balancer probes by address
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert response["Cache-Control"] == "no-store" and response["X-Request-ID"]


@pytest.mark.django_db
def test_pages_still_refuse_a_host_outside_allowed_hosts(client):
    """The exemption is the probes' only: the same request to a page is refused."""
    assert client.get("/login/", HTTP_HOST="10.1.2.3:8000").status_code == 400


def test_probes_answer_get_only(client):
    response = client.post("/readyz")
    assert (response.status_code, response["Allow"]) == (405, "GET, HEAD")


@pytest.mark.django_db
def test_readyz_is_ready_with_the_database_redis_and_the_engine(client, live_engine):
    response = client.get("/readyz", HTTP_HOST="10.1.2.3")
    body = response.json()
    assert (response.status_code, body["status"], body["failed"]) == (200, "ready", []), body
    assert sorted(body["checks"]) == ["database", "engine", "redis"]
    assert all(check["ok"] for check in body["checks"].values())


@pytest.mark.django_db
def test_readyz_names_redis_when_it_is_unreachable_and_shows_no_password(client, live_engine, settings):
    url = f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0"
    channel_layer_at(settings, url)
    settings.CELERY_BROKER_URL = url
    response = client.get("/readyz")
    body = response.json()
    assert (response.status_code, body["status"], body["failed"]) == (503, "not ready", ["redis"]), body
    assert "the channel layer's Redis and the Celery broker" in body["checks"]["redis"]["error"]
    assert "refused" in body["checks"]["redis"]["error"].lower()
    assert SECRET not in response.content.decode() and "Traceback" not in response.content.decode()


@pytest.mark.django_db
def test_readyz_checks_a_celery_broker_of_its_own(client, live_engine, settings):
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{closed_port()}/0"  # the channel layer's Redis is up
    body = client.get("/readyz").json()
    assert body["failed"] == ["redis"] and body["checks"]["redis"]["error"].startswith("the Celery broker at"), body


@pytest.mark.django_db
def test_readyz_names_the_engine_when_it_is_unreachable(client, settings):
    settings.ENGINE_URL = f"http://127.0.0.1:{closed_port()}"
    response = client.get("/readyz")
    body = response.json()
    assert (response.status_code, body["failed"]) == (503, ["engine"]), body
    assert settings.ENGINE_URL in body["checks"]["engine"]["error"]
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]


@pytest.mark.django_db
def test_a_redis_and_an_engine_that_never_answer_cost_the_probe_its_timeout(client, settings, silent_port):
    settings.SEAM_READYZ_TIMEOUT_S = 0.5
    channel_layer_at(settings, f"redis://127.0.0.1:{silent_port}/0")
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{silent_port}/0"
    settings.ENGINE_URL = f"http://127.0.0.1:{silent_port}"
    started = time.monotonic()
    body = client.get("/readyz").json()
    assert time.monotonic() - started < 2.5, "the checks ran one after another, or without their timeout"
    assert body["failed"] == ["redis", "engine"], body
    assert "Timeout reading" in body["checks"]["redis"]["error"], body
    assert "did not answer GET" in body["checks"]["engine"]["error"], body


def test_the_engine_clients_health_reads_an_unhealthy_engines_503_as_its_report():
    report = {"ok": False, "phase": "broken", "reason": "the engine is broken: no verified layout",
              "recoveries_in_a_row": 0, "recoveries": 3, "last_error": "boom"}
    transport = httpx.MockTransport(lambda request: httpx.Response(503, json=report))
    with EngineClient("http://engine.test", transport=transport, token="") as engine:
        health = engine.health()
    assert (health.ok, health.phase, health.reason) == (False, "broken", report["reason"])

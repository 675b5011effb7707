"""The websocket handshake is accepted from the console's own origin only — scheme, host and port — or from one
named in CSRF_TRUSTED_ORIGINS: a page on the same host but another port (which the browser sends the
console's session cookie from) is refused. Driven through console.asgi.application, as daphne drives it.

One handshake per test: the channel layer's pools belong to the event loop of one `run`."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator

from console.asgi import application
from tests.support.live import TIMEOUT_S, run, wake_receivers

pytestmark = pytest.mark.django_db(transaction=True)

CONSOLE = "127.0.0.1:8000"
PROXIED = "seam.example.org"  # TLS ends at the proxy, which passes the Host on: the console sees ws://


def _connects(headers: dict[str, str], scheme: str = "ws") -> bool:
    """Whether a logged-out handshake with these headers is accepted (the consumer accepts, then closes 4401)."""
    outcome = []

    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/live/",
                                             headers=[(k.encode(), v.encode()) for k, v in headers.items()])
        communicator.scope["scheme"] = scheme  # the application starts at the first message, with this scope
        connected, _ = await communicator.connect(timeout=TIMEOUT_S)
        outcome.append(connected)
        await wake_receivers()  # a denied handshake's consumer too waits on the channel layer until disconnect
        await communicator.disconnect(timeout=TIMEOUT_S)
    run(scenario)
    return outcome[0]


def test_the_console_s_own_origin_is_accepted(live_settings):
    assert _connects({"origin": f"http://{CONSOLE}", "host": CONSOLE})


@pytest.mark.parametrize("origin", [
    "http://127.0.0.1:9999",  # same host, another port: what AllowedHostsOriginValidator let through
    "http://127.0.0.1",  # port 80
    "https://127.0.0.1:8000",  # another scheme
    "http://localhost:8000",  # another host, though an allowed one
    "http://evil.example:8000",
    "null",
    "http://127.0.0.1:8000/page",
])
def test_any_other_origin_is_refused(live_settings, origin):
    assert not _connects({"origin": origin, "host": CONSOLE})


@pytest.mark.parametrize("headers", [{"host": CONSOLE}, {"origin": f"http://{CONSOLE}"}])
def test_a_handshake_without_origin_or_host_is_refused(live_settings, headers):
    assert not _connects(headers)


def test_a_host_outside_allowed_hosts_is_refused_even_with_a_matching_origin(live_settings):
    # DNS rebinding: the attacker's name resolves to the console, so its page's Origin matches the Host it sends.
    assert not _connects({"origin": "http://rebound.example:8000", "host": "rebound.example:8000"})


@pytest.mark.parametrize("origin, host, scheme, accepted", [
    ("http://localhost", "localhost:80", "ws", True),
    ("https://localhost", "localhost", "wss", True),
    ("https://localhost", "localhost", "ws", False),
])
def test_default_ports_and_the_socket_s_scheme_count(live_settings, origin, host, scheme, accepted):
    assert _connects({"origin": origin, "host": host}, scheme) is accepted


@pytest.mark.parametrize("overrides, origin, forwarded, accepted", [
    ({}, f"https://{PROXIED}", None, False),  # https page, ws socket: not the same origin on its own
    ({"CSRF_TRUSTED_ORIGINS": [f"https://{PROXIED}"]}, f"https://{PROXIED}", None, True),
    ({"CSRF_TRUSTED_ORIGINS": [f"https://{PROXIED}"]}, f"https://{PROXIED}:8443", None, False),
    ({"CSRF_TRUSTED_ORIGINS": ["https://*.example.org"]}, "https://console.example.org", None, True),
    ({"CSRF_TRUSTED_ORIGINS": ["https://*.example.org"]}, "http://console.example.org", None, False),
    ({"SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}, f"https://{PROXIED}", "https", True),
    ({"SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}, f"https://{PROXIED}", "http", False),
])
def test_behind_a_proxy_a_trusted_origin_or_the_forwarded_scheme_counts(live_settings, overrides, origin, forwarded,
                                                                         accepted):
    live_settings.ALLOWED_HOSTS = [PROXIED]
    for name, value in overrides.items():
        setattr(live_settings, name, value)
    headers = {"origin": origin, "host": PROXIED}
    if forwarded is not None:
        headers["x-forwarded-proto"] = forwarded
    assert _connects(headers) is accepted

"""What a web page could send to /v1 is refused (issue 30, item 8), against the real engine service: a Host the
engine does not serve under (DNS rebinding: 421) and a POST not labelled application/json (a "simple" cross-site
request, sent without a CORS preflight: 415). engine/serve/cross_site.py says why; /control and the probes are not
affected, and the clients that call /v1 properly (httpx's json=, as the console's demo traffic and the openai
package send) are served.
"""

from __future__ import annotations

import pytest

from engine.cli import build_parser
from engine.serve.cross_site import AllowedHosts, host_name
from tests.support.live_service import LiveService

PROMPT = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
FOREIGN_HOSTS = ["evil.example", "attacker.test:8100", "127.0.0.1.nip.io", "localhost.evil.example", ""]


def _v1_calls(client, host: str):
    headers = {"host": host}
    return [client.post("/v1/completions", json=PROMPT, headers=headers),
            client.post("/v1/chat/completions", json=CHAT, headers=headers),
            client.get("/v1/models", headers=headers)]


@pytest.mark.parametrize("host", FOREIGN_HOSTS)
def test_v1_under_a_foreign_host_is_421_naming_the_flag(engine, host):
    """Pins AllowedHosts.require in the /v1 gate (issue 30, item 8): without it a page that re-points its own name at
    the engine is served."""
    for reply in _v1_calls(engine.client, host):
        assert reply.status_code == 421, reply.text
        error = reply.json()["error"]
        assert "--allowed-hosts" in error["message"] and "127.0.0.1, [::1], localhost" in error["message"]
        assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST.", "127.0.0.1", "[::1]"])
def test_v1_under_a_loopback_name_is_served(engine, host):
    for reply in _v1_calls(engine.client, f"{host}:{engine.port}"):
        assert reply.status_code == 200, reply.text


def test_control_and_probes_answer_under_any_host(engine):
    """/control's bearer token is a header no page can add unasked, and a console may call the engine by any name;
    /healthz and /metrics carry nothing a page could use."""
    for path in ("/control/state", "/healthz", "/metrics"):
        assert engine.client.get(path, headers={"host": "engine.internal:8100"}).status_code == 200, path


@pytest.mark.parametrize("content_type", [None, "text/plain", "text/plain;charset=UTF-8",
                                          "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                          "application/json-seq", "application/jsonx"])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_v1_post_not_labelled_json_is_415_naming_the_type(engine, route, content_type):
    """Pins require_json in the /v1 gate (issue 30, item 8): without it a page's form or text/plain POST, sent
    without a preflight, generates (the body is JSON all the same)."""
    body = (b'{"prompt": [5, 6, 7], "max_tokens": 2}' if route == "/v1/completions"
            else b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}')
    headers = {"content-type": content_type} if content_type else {}
    reply = engine.client.post(route, content=body, headers=headers)
    assert reply.status_code == 415, reply.text
    message = reply.json()["error"]["message"]
    assert "Content-Type must be application/json" in message and (content_type or "none") in message


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
def test_json_with_parameters_or_in_capitals_is_served(engine, content_type):
    reply = engine.client.post("/v1/completions", content=b'{"prompt": [5, 6, 7], "max_tokens": 2}',
                               headers={"content-type": content_type})
    assert reply.status_code == 200, reply.text


@pytest.mark.slow
def test_allowed_hosts_adds_names_to_v1(demo_checkpoint):
    """`engine serve --allowed-hosts` reaches the gate: its names are served, others still refused by name."""
    # An engine of its own: the flag under test is given at start.
    live = LiveService(demo_checkpoint, rig="cpu-single", extra_args=("--allowed-hosts", "engine.lan,10.0.0.5"))
    try:
        for host in ("engine.lan", f"Engine.LAN:{live.port}", "10.0.0.5", "localhost"):
            assert live.client.post("/v1/completions", json=PROMPT, headers={"host": host}).status_code == 200, host
        refused = live.client.post("/v1/completions", json=PROMPT, headers={"host": "evil.example"})
        assert refused.status_code == 421 and "engine.lan" in refused.json()["error"]["message"]
    finally:
        live.stop()


def test_host_names_are_compared_as_host_headers_name_them():
    assert [host_name(h) for h in ("[::1]:8100", "::1", "Example.COM.", "example.com:80", "10.0.0.5:8100",
                                   "fe80::1")] == ["[::1]", "[::1]", "example.com", "example.com", "10.0.0.5",
                                                   "[fe80::1]"]


def test_the_bound_address_is_allowed_unless_it_is_a_wildcard():
    loopback = {"localhost", "127.0.0.1", "[::1]"}
    assert AllowedHosts.for_bind("127.0.0.1").names == loopback
    assert AllowedHosts.for_bind("10.0.0.5").names == loopback | {"10.0.0.5"}
    assert AllowedHosts.for_bind("2001:db8::5").names == loopback | {"[2001:db8::5]"}
    for wildcard in ("0.0.0.0", "::", ""):
        assert AllowedHosts.for_bind(wildcard).names == loopback
    assert AllowedHosts.for_bind("0.0.0.0", ["gpu01", "*"]).names == loopback | {"gpu01", "*"}
    AllowedHosts.for_bind("0.0.0.0", ["*"]).require({"host": "anything.example"})  # '*' turns the check off


@pytest.mark.parametrize("bad", ["http://engine.lan", "engine.lan/v1", "a,,b", "a b"])
def test_allowed_hosts_refuses_a_url_or_an_empty_name(bad, capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["serve", "--checkpoint", ".", "--allowed-hosts", bad])
    assert stopped.value.code == 2 and "--allowed-hosts" in capsys.readouterr().err

"""`make run`'s demo traffic (launch/demo_traffic.py) against a small local HTTP server standing in for the engine:
it sends short completions one at a time with the API key, backs off while refused and logs that once, recovers,
and stops when told."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from launch.demo_traffic import DemoTraffic
from launch.local_redis import free_port


class FakeEngine(ThreadingHTTPServer):
    """Answers POST /v1/completions with `status`, recording each request and the most ever in flight at once."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.status = 200
        self.requests: list[dict] = []  # {at, path, body, authorization}
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def wait_for(self, count: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            assert time.monotonic() < deadline, f"{len(self.requests)} requests after {timeout}s, expected {count}"
            time.sleep(0.01)


class _Handler(BaseHTTPRequestHandler):
    server: FakeEngine

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        with self.server.lock:
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(0.02)  # a request takes a while, so overlapping ones would be seen
        status = self.server.status
        self.server.requests.append({"at": time.monotonic(), "path": self.path, "body": body,
                                     "authorization": self.headers.get("Authorization")})
        payload = json.dumps({"choices": [{"text": "ok"}]} if status == 200 else {"error": {"message": "busy"}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload.encode())
        with self.server.lock:
            self.server.in_flight -= 1

    def log_message(self, *args) -> None:  # keep the test output quiet
        pass


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    server = FakeEngine()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def apart(requests: list[dict]) -> list[float]:
    """Seconds between consecutive requests."""
    return [later["at"] - earlier["at"] for earlier, later in itertools.pairwise(requests)]


@contextmanager
def driving(url: str, **options) -> Iterator[DemoTraffic]:
    traffic = DemoTraffic(url, **options).start()
    try:
        yield traffic
    finally:
        traffic.stop()


def test_it_sends_short_completions_one_at_a_time_with_the_api_key(engine):
    with driving(engine.url, api_key="demo-api-key", pause_s=0.01, max_tokens=8) as traffic:
        engine.wait_for(5)
    assert {request["path"] for request in engine.requests} == {"/v1/completions"}
    for request in engine.requests:
        assert request["authorization"] == "Bearer demo-api-key"
        assert request["body"]["max_tokens"] == 8
        assert isinstance(request["body"]["prompt"], str) and request["body"]["prompt"]
    assert len({request["body"]["prompt"] for request in engine.requests}) > 1  # not one prompt over and over
    assert engine.most_in_flight == 1
    assert traffic.answered >= 5 and traffic.failed == 0


def test_without_an_api_key_it_sends_no_authorization(engine):
    with driving(engine.url, pause_s=0.01):
        engine.wait_for(2)
    assert {request["authorization"] for request in engine.requests} == {None}


def test_it_backs_off_while_refused_logs_once_and_recovers(engine, caplog):
    engine.status = 503
    caplog.set_level(logging.INFO, logger="seam.demo_traffic")
    with driving(engine.url, pause_s=0.01, backoff_s=(0.05, 0.4)) as traffic:
        engine.wait_for(5, timeout=20)
        gaps = apart(engine.requests)
        # 0.05, 0.1, 0.2, 0.4 s apart (plus the request's own time): doubling, so growing
        assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2 and gaps[3] >= 0.4, gaps
        assert gaps[3] < 1.0, gaps  # the ceiling holds (0.4 s plus the request)
        refused = [record for record in caplog.records if record.levelno == logging.WARNING]
        assert len(refused) == 1 and "503" in refused[0].getMessage(), [r.getMessage() for r in caplog.records]
        # The engine counts a request when it arrives, the client its failure once the answer is back: wait for it.
        deadline = time.monotonic() + 5
        while traffic.failed < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert traffic.failed >= 5 and traffic.running
        engine.status = 200
        answered = len(engine.requests)
        engine.wait_for(answered + 3, timeout=20)
    assert traffic.answered >= 2
    assert any("answers again" in record.getMessage() for record in caplog.records)
    fast = apart(engine.requests[answered + 1:])
    assert max(fast) < 0.3, fast  # back at the normal pause, not the backoff's ceiling


def test_a_refused_api_key_names_seam_api_key(engine, caplog):
    engine.status = 401
    with driving(engine.url, pause_s=0.01, backoff_s=(0.01, 0.02)):
        engine.wait_for(3)
    assert "SEAM_API_KEY" in caplog.text


def test_an_unreachable_engine_is_logged_once_and_does_not_stop_it(caplog):
    with driving(f"http://127.0.0.1:{free_port()}", backoff_s=(0.01, 0.02)) as traffic:
        deadline = time.monotonic() + 10
        while traffic.failed < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert traffic.running
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot be reached" in warnings[0].getMessage()


def test_stop_ends_it_promptly_even_in_a_long_pause(engine):
    traffic = DemoTraffic(engine.url, pause_s=30).start()
    engine.wait_for(1)
    started = time.monotonic()
    traffic.stop()
    assert time.monotonic() - started < 2
    assert not traffic.running
    time.sleep(0.2)
    assert len(engine.requests) == 1

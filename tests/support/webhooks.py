"""A real HTTP receiver for the console's webhooks (http.server on a thread), and settings pointing at it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

KEY = "webhook-test-key"


class Receiver:
    """A local HTTP endpoint answering each POST with the next of `statuses` (the last one repeats), recording what
    it received."""

    def __init__(self, statuses=(204,)):
        self.statuses = list(statuses)
        self.received: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/seam"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"got {len(self.received)} of {count} POSTs"
            time.sleep(0.05)
        return self.received

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    """receiver(*statuses) -> a started Receiver answering with `statuses` (204 by default); closed after the test."""
    made = []

    def make(*statuses):
        made.append(Receiver(statuses or (204,)))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def hooked(settings) -> Callable[[Receiver], Receiver]:
    """settings pointing webhooks at a receiver: hooked(receiver) -> receiver."""
    def point(target):
        settings.SEAM_WEBHOOK_URLS, settings.SEAM_WEBHOOK_KEY = [target.url], KEY
        return target
    return point

"""`make run` as a newcomer meets it: the URL and where the logins' password is printed, the login page in a
browser, demo traffic moving the engine's figures, and Ctrl-C (SIGINT to the whole process group, as a terminal
sends it) stopping every process it started."""

from __future__ import annotations

import sys
import time

import httpx
import psutil
import pytest

from tests.support.live_service import free_port
from tests.support.stack import PASSWORD, READY_LINE, launch, stack_env, stop

pytestmark = pytest.mark.slow


def test_make_run_prints_the_url_and_logins_serves_the_login_page_and_stops_on_ctrl_c(tmp_path, browser):
    port, engine_port = free_port(), free_port()
    unreachable_redis = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: a private Redis is started
    env = stack_env(tmp_path, f"sqlite:///{tmp_path / 'run.sqlite3'}", unreachable_redis, port, engine_port)
    stack = launch(["make", "--no-print-directory", "run", f"PY={sys.executable}"], env, port, engine_port, None,
                   timeout=300)
    try:
        printed = stack.printed()
        assert f"{READY_LINE} http://127.0.0.1:{port}/" in printed
        assert "logins:       operator, reviewer, viewer; password: the one in SEAM_DEMO_PASSWORD" in printed
        assert PASSWORD not in printed  # the terminal says where the password is, never the password
        # The password the private Redis asks for is never printed either.
        private = (f"redis:        nothing answered at REDIS_URL={unreachable_redis}; started a private one at "
                   "redis://:***@127.0.0.1:")
        assert private in printed
        assert f"stack:        port{port} (SEAM_STACK" in printed  # keyed by the console's port, unless SEAM_STACK
        assert "demo traffic: on" in printed and _decode_tokens_per_second(stack.engine_url) > 0
        assert httpx.get(f"{stack.url}/", follow_redirects=True).status_code == 200
        page = browser.new_page()
        page.goto(f"{stack.url}/")
        assert "/login/" in page.url
        for selector in ("#id_username", "#id_password", "button[type=submit]"):
            assert page.is_visible(selector), selector
        page.close()
        processes = stack.descendants()
        names = " ".join(" ".join(process.cmdline()) for process in processes)
        for part in ("launch", "redis-server", "engine serve", "telemetry_bridge", "celery", "daphne"):
            assert part in names, f"{part} not among the processes `make run` started"
    finally:
        alive = stop(stack, signal_group=True)
    assert not alive, f"still running after Ctrl-C: {alive}"
    assert "stopping Seam" in stack.printed()
    assert not [process for process in processes if psutil.pid_exists(process.pid)
                and process.status() != psutil.STATUS_ZOMBIE]


def _decode_tokens_per_second(engine_url: str, timeout: float = 60) -> float:
    """The demo engine's decode throughput once the demo traffic has moved it (0.0 if it never did)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in httpx.get(f"{engine_url}/metrics").text.splitlines():
            if line.startswith("seam_engine_decode_tokens_per_second ") and float(line.split()[1]) > 0:
                return float(line.split()[1])
        time.sleep(0.5)
    return 0.0

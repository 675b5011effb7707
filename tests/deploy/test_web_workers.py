"""The console under `uvicorn console.asgi:application --workers 2`, as deploy/systemd/seam-web.service and
deploy/compose.yaml serve it: a real subprocess on a free port, driven over HTTP (probes, the login form) and
websockets. Sockets are opened until each worker process holds one (psutil reads which process holds which
connection), then one message to the `telemetry` group through the Redis channel layer, as the bridge sends it, must
reach every socket: a socket in the other worker hears it only through Redis."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import websockets
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from console.live.bridge import SNAPSHOT_EVENT, TELEMETRY_GROUP
from tests.support.jobs import database_url
from tests.support.users import PASSWORD

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
MAX_SOCKETS = 40  # the kernel hands each connection to one of the workers; this many reach both
START_S = 90


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Uvicorn:
    def __init__(self, port: int, env: dict[str, str], log: Path):
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--workers", str(WORKERS), "--lifespan", "off"], cwd=ROOT, env=env, stdout=log.open("w"),
            stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"uvicorn exited:\n{self.log.read_text()[-3000:]}"
            if len(self.workers()) == WORKERS:
                try:
                    if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        raise AssertionError(f"uvicorn did not answer in {START_S} s:\n{self.log.read_text()[-3000:]}")

    def workers(self) -> list[psutil.Process]:
        """The worker processes: the children that hold the listening socket."""
        return [child for child in psutil.Process(self.process.pid).children()
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
                       for c in _connections(child))]

    def holder(self, client_port: int) -> int | None:
        """The pid of the worker holding the connection from `client_port`."""
        for worker in self.workers():
            if any(c.raddr and c.raddr.port == client_port and c.laddr.port == self.port for c in _connections(worker)):
                return worker.pid
        return None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _connections(process: psutil.Process) -> list:
    try:
        return process.net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return []


@pytest.fixture
def stack_key() -> str:
    return f"web-workers-{secrets.token_hex(4)}"


@pytest.fixture
def uvicorn(transactional_db, stack_key, tmp_path) -> Iterator[Uvicorn]:
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL, "SEAM_STACK": stack_key,
           "SEAM_DEBUG": "0", "SEAM_LOOPBACK_HTTP": "1", "SEAM_SECRET_KEY": secrets.token_urlsafe(64),
           "SEAM_AUDIT_KEY": secrets.token_urlsafe(48), "SEAM_VAR_DIR": str(tmp_path / "var"),
           "SEAM_STATIC_ROOT": str(tmp_path / "static"), "PYTHONUNBUFFERED": "1"}
    server = Uvicorn(free_port(), env, tmp_path / "uvicorn.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def log_in(server: Uvicorn, username: str) -> str:
    """The login form, as a browser posts it; the session cookie it sets."""
    with httpx.Client(base_url=server.url) as browser:
        page = browser.get("/login/")
        assert page.status_code == 200, page.status_code
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        reply = browser.post("/login/", data={"username": username, "password": PASSWORD,
                                              "csrfmiddlewaretoken": token})
        assert reply.status_code == 302, (reply.status_code, reply.text[:500])
        return browser.cookies["sessionid"]


async def subscribed_sockets(server: Uvicorn, session: str) -> tuple[list, dict[int, int]]:
    """Sockets subscribed to telemetry, opened until every worker holds one; and how many each worker holds."""
    sockets, held = [], {}
    while len(held) < WORKERS and len(sockets) < MAX_SOCKETS:
        ws = await websockets.connect(f"ws://127.0.0.1:{server.port}/ws/live/", origin=server.url,
                                      additional_headers={"Cookie": f"sessionid={session}"})
        sockets.append(ws)
        await ws.send(json.dumps({"action": "subscribe", "groups": [TELEMETRY_GROUP]}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "subscribed", "groups": ["telemetry"]}
        pid = server.holder(ws.local_address[1])
        assert pid is not None, "no worker holds the socket"
        held[pid] = held.get(pid, 0) + 1
    return sockets, held


@pytest.mark.django_db(transaction=True)
def test_http_and_websockets_work_across_two_uvicorn_workers(uvicorn, vic, stack_key):
    ready = httpx.get(f"{uvicorn.url}/readyz", timeout=10).json()
    assert ready["checks"]["database"]["ok"] and ready["checks"]["redis"]["ok"], ready
    session = log_in(uvicorn, vic.username)

    async def scenario() -> None:
        sockets, held = await subscribed_sockets(uvicorn, session)
        try:
            assert len(held) == WORKERS, f"{len(sockets)} sockets all went to one worker: {held}"
            snapshot = {"seq": 7, "ts": time.time(), "ranks": [], "engine": {"phase": "serving"}}
            layer = RedisChannelLayer(hosts=[settings.REDIS_URL], prefix=f"seam:{stack_key}:asgi")
            await layer.group_send(TELEMETRY_GROUP, {"type": SNAPSHOT_EVENT, "snapshot": snapshot})
            await layer.close_pools()
            for ws in sockets:
                assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "telemetry",
                                                                             "snapshot": snapshot}
        finally:
            for ws in sockets:
                await ws.close()

    asyncio.run(scenario())

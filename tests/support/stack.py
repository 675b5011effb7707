"""The real Seam stack for browser and fault tests: `python -m launch` (what `make run` runs) in its own process
group, against a redis-server of the test's own and a fresh database, stopped with SIGINT like Ctrl-C.

The `stack` fixture is one per test module, not per session: the stack should not keep eating CPU after the module
that drives it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
import redis

from launch.local_redis import redis_server_binary
from tests.support.live_service import free_port

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "e2e-demo-password"
READY_LINE = "Seam is running at"


class RedisServer:
    """A redis-server on a fixed port of its own, which a test can kill and start again on the same port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                   "no"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: Redis goes away without a goodbye, as in a crash."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)


@contextmanager
def fresh_database(folder: Path) -> Iterator[str]:
    """A temporary SQLite file, or a fresh PostgreSQL database when the suite runs with a PostgreSQL DATABASE_URL."""
    suite_url = os.environ.get("DATABASE_URL", "")
    if not suite_url.startswith(("postgres://", "postgresql://")):
        yield f"sqlite:///{folder / 'e2e.sqlite3'}"
        return
    name = f"seam_e2e_{uuid.uuid4().hex[:10]}"
    server = suite_url.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Stack:
    """A running `launch` and what it printed."""

    launcher: subprocess.Popen
    port: int
    engine_port: int
    redis: RedisServer | None
    output: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None
    clients: dict[str, httpx.Client] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # what the launcher was started with (its database, var dir)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    def printed(self) -> str:
        return "".join(self.output)

    def log_tails(self, lines: int = 20) -> str:
        """The end of every log the stack's processes wrote (var/log/<name>.log, launch/logs.py)."""
        folder = Path(self.env.get("SEAM_VAR_DIR", ROOT / "var")) / "log"
        return "".join(f"\n--- {path.name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                       for path in sorted(folder.glob("*.log")))

    def token(self, username: str) -> str:
        reply = httpx.post(f"{self.url}/api/v1/auth/token/", data={"username": username, "password": PASSWORD})
        reply.raise_for_status()
        return reply.json()["token"]

    def api(self, username: str) -> httpx.Client:
        """An API client with `username`'s token (one per user, closed when the stack stops)."""
        if username not in self.clients:
            self.clients[username] = httpx.Client(
                base_url=f"{self.url}/api/v1", headers={"Authorization": f"Token {self.token(username)}"}, timeout=10)
        return self.clients[username]

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.launcher.pid).children(recursive=True)

    def _read_output(self) -> None:
        assert self.launcher.stdout is not None
        for line in self.launcher.stdout:
            self.output.append(line)
            if READY_LINE in line:
                self.ready.set()


def launch(command: list[str], env: dict[str, str], port: int, engine_port: int, redis_server: RedisServer | None,
           timeout: float = 120) -> Stack:
    """Start `command` (launch or `make run`) in its own process group and wait for its ready line."""
    launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    stack = Stack(launcher, port, engine_port, redis_server, env=env)
    stack.reader = threading.Thread(target=stack._read_output, daemon=True)
    stack.reader.start()
    deadline = time.monotonic() + timeout
    while not stack.ready.wait(0.2):
        if launcher.poll() is not None or time.monotonic() > deadline:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
            raise RuntimeError(f"the stack did not start (status {launcher.poll()}):\n{stack.printed()[-4000:]}"
                               f"{stack.log_tails()}")
    # The ready line and the logins after it come in one print; give the reader thread a moment for the rest.
    time.sleep(0.2)
    return stack


def stack_env(folder: Path, database_url: str, redis_url: str, port: int, engine_port: int) -> dict[str, str]:
    return {**os.environ, "SEAM_PORT": str(port), "SEAM_ENGINE_PORT": str(engine_port), "SEAM_DEMO_PASSWORD": PASSWORD,
            "DATABASE_URL": database_url, "REDIS_URL": redis_url, "SEAM_VAR_DIR": str(folder / "var"),
            "PYTHONUNBUFFERED": "1"}


def stop(stack: Stack, signal_group: bool = False) -> list[psutil.Process]:
    """SIGINT (to the launcher, or to its whole group as a terminal's Ctrl-C does); returns processes left alive."""
    for client in stack.clients.values():
        client.close()
    children = stack.descendants()
    if signal_group:
        os.killpg(stack.launcher.pid, signal.SIGINT)
    else:
        stack.launcher.send_signal(signal.SIGINT)
    try:
        stack.launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
        children.append(psutil.Process(stack.launcher.pid))
    _, alive = psutil.wait_procs(children, timeout=15)
    for process in alive:  # not to leak them into the rest of the suite; the caller fails the test
        process.kill()
    stack.reader.join(timeout=5)  # the launcher's last words
    return alive


# The secrets the suite sets for the processes it starts (tests/conftest.py); a stack that is to make its own, as
# `make run` does for a newcomer, is started without them.
SUITE_SECRETS = ("SEAM_ENGINE_TOKEN", "SEAM_APPROVAL_KEY", "SEAM_SECRET_KEY", "SEAM_AUDIT_KEY",
                 "SEAM_AUDIT_ANCHOR_PATH")


@contextmanager
def running_stack(folder: Path, own_secrets: bool = False) -> Iterator[Stack]:
    """`python -m launch` on free ports with its own redis-server and database; every child must exit on SIGINT.
    With `own_secrets` the stack generates its secrets itself, none set in its environment."""
    redis_server = RedisServer()
    redis_server.start()
    try:
        with fresh_database(folder) as database_url:
            port, engine_port = free_port(), free_port()
            env = stack_env(folder, database_url, redis_server.url, port, engine_port)
            for name in SUITE_SECRETS if own_secrets else ():
                env.pop(name, None)
            # An explicit channel (it wins over the stack key's, seam:port<port>:telemetry): the Redis restart test
            # reads the telemetry keys by this name. Each stack here has a redis-server of its own to itself.
            env["SEAM_TELEMETRY_CHANNEL"] = "seam:telemetry"
            stack = launch([sys.executable, "-m", "launch"], env, port, engine_port, redis_server, timeout=300)
            try:
                yield stack
            finally:
                alive = stop(stack)
                assert not alive, f"processes left after SIGINT: {alive}"
                assert stack.launcher.returncode == 0, stack.printed()[-4000:]
                assert "stopping Seam" in stack.printed()
    finally:
        if redis_server.process and redis_server.process.poll() is None:
            redis_server.process.terminate()
            redis_server.process.wait(timeout=10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("e2e-stack")) as running:
        yield running

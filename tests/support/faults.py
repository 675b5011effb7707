"""Helpers for the fault tests: hold a rank mid-operation, kill processes for real, read the engine's counters,
run Celery workers on a queue of the test's own."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import httpx

from tests.support.jobs import Worker

_OPERATIONS = re.compile(r'^seam_operations_known\{status="[^"]*"\} ([0-9.]+)$', re.MULTILINE)
_WAITING = re.compile(r"^seam_num_requests_waiting ([0-9.]+)$", re.MULTILINE)


def wait_until(predicate: Callable[[], object], timeout: float = 60.0, what: str = "the condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def operations_total(engine) -> int:
    """Every operation the engine knows of (its /metrics), whatever its status: how many applies it saw."""
    return int(sum(float(n) for n in _OPERATIONS.findall(engine.client.get("/metrics").text)))


def waiting_requests(engine) -> int:
    found = _WAITING.search(engine.client.get("/metrics").text)
    return int(float(found.group(1))) if found else 0


def rank_pids(engine) -> list[int]:
    """The rank processes' PIDs, as each rank reported them when it last built its layout."""
    return [rank["measured"]["pid"] for rank in engine.state()["ranks"]]


def operation_phase(engine, operation_id: str) -> str:
    return engine.client.get(f"/control/operations/{operation_id}").json()["phase"]


@contextmanager
def rank_held(pid: int) -> Iterator[None]:
    """SIGSTOP a rank so an operation that needs it stays in flight (phase `acting`) until the test acts; the
    rank is let go (SIGCONT) on the way out unless the test killed it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


class Requests:
    """Completion requests sent on threads; every one ends with its status and body — none may vanish."""

    def __init__(self, url: str, prompts: list[list[int]], max_tokens: int):
        self.results: list[tuple[int, dict] | None] = [None] * len(prompts)
        self.threads = [threading.Thread(target=self._one, args=(url, i, p, max_tokens), daemon=True)
                        for i, p in enumerate(prompts)]
        for thread in self.threads:
            thread.start()

    def _one(self, url: str, index: int, prompt: list[int], max_tokens: int) -> None:
        reply = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0}, timeout=180)
        self.results[index] = (reply.status_code, reply.json())

    def join(self, timeout: float = 180) -> list[tuple[int, dict] | None]:
        for thread in self.threads:
            thread.join(timeout)
        return self.results


class Workers:
    """Real Celery worker processes on one queue; stopped (or already killed) at the end."""

    def __init__(self, queue: str, env: dict):
        self.queue, self.env, self.started = queue, env, []

    def start(self, **env: str) -> Worker:
        worker = Worker(self.queue, {**self.env, **env})
        self.started.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()

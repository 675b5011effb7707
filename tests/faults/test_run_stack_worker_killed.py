"""`make run`'s stack (`python -m launch`) with its Celery worker killed outright (SIGKILL) while four streaming
completions run against its engine: the engine keeps serving (all four streams finish), `make run` logs the death
and starts a new worker, which then runs a job through the review gate; SIGTERM to `make run` still stops every
process of it, beat included. Pins the supervision half of issue 30, item 7 (before it, one dead child stopped the
whole stack, cutting every stream)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import httpx
import psutil
import pytest

from contracts.attestation import CONTROL_TOKEN_ENV, bearer_token
from tests.support.faults import wait_until
from tests.support.live_service import free_port
from tests.support.stack import RedisServer, Stack, fresh_database, launch, stack_env, stop

pytestmark = pytest.mark.slow
STREAMS, MAX_TOKENS = 4, 400
CUTS = ([8, 4, 4], [7, 5, 4], [6, 6, 4])


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run-stack")
    redis_server = RedisServer()
    redis_server.start()
    try:
        with fresh_database(folder) as database_url:
            port, engine_port = free_port(), free_port()
            env = stack_env(folder, database_url, redis_server.url, port, engine_port)
            env["SEAM_TELEMETRY_CHANNEL"] = "seam:telemetry"
            running = launch([sys.executable, "-m", "launch", "--no-demo-traffic"], env, port, engine_port,
                             redis_server, timeout=300)
            try:
                yield running
            finally:
                if running.launcher.poll() is None:  # still up: the test failed before its SIGTERM
                    assert not stop(running), "processes left after SIGINT"
    finally:
        redis_server.process.terminate()
        redis_server.process.wait(timeout=10)


class Stream:
    """One streaming completion on a thread of its own: its tokens as they come, and whether [DONE] came."""

    def __init__(self, url: str, index: int) -> None:
        self.tokens: list[int] = []
        self.done = False
        self.error: BaseException | None = None
        body = {"prompt": [5 + index, 77, 300, 12], "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                "stream": True}
        self.thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self.thread.start()

    def _run(self, url: str, body: dict) -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    data = line.removeprefix("data: ")
                    if data == "[DONE]":
                        self.done = True
                    elif line.startswith("data: "):
                        self.tokens.extend(json.loads(data)["choices"][0]["token_ids"])
        except BaseException as error:  # reported to the test
            self.error = error


def _child(stack: Stack, *parts: str) -> psutil.Process | None:
    for child in psutil.Process(stack.launcher.pid).children():
        if all(any(part in word for word in child.cmdline()) for part in parts):
            return child
    return None


def _job_runs(stack: Stack, control_token: str) -> dict:
    """Propose a cut other than the engine's, approve it, and wait for the worker to run it to its end."""
    current = httpx.get(f"{stack.engine_url}/control/state", headers=bearer_token(control_token)).json()["cut"]
    cut = next(cut for cut in CUTS if cut != current)
    proposed = stack.api("operator").post("jobs/", json={"kind": "cut", "target": {"cut": cut}})
    assert proposed.status_code == 201, proposed.text
    job = proposed.json()
    approved = stack.api("reviewer").post(f"jobs/{job['id']}/approve/", json={"plan_hash": job["plan_hash"]})
    assert approved.status_code == 200, approved.text
    return wait_until(lambda: (lambda seen: seen if seen["status"] in ("succeeded", "failed", "cancelled") else None)(
        stack.api("operator").get(f"jobs/{job['id']}/").json()), timeout=180, what="the job to end")


def test_a_killed_worker_is_restarted_while_the_engine_keeps_streaming_and_sigterm_stops_everything(stack):
    engine, worker = _child(stack, "engine", "serve"), _child(stack, "celery", "worker")
    control_token = engine.environ()[CONTROL_TOKEN_ENV]
    streams = [Stream(stack.engine_url, index) for index in range(STREAMS)]
    wait_until(lambda: all(stream.tokens or stream.error for stream in streams), timeout=120,
               what="every stream's first tokens")
    os.kill(worker.pid, signal.SIGKILL)
    running_at_kill = sum(not stream.done for stream in streams)
    wait_until(lambda: f"the Celery worker (pid {worker.pid}) was killed by SIGKILL" in stack.printed(),
               timeout=60, what="make run's line about the dead worker")
    new_worker = wait_until(lambda: (lambda found: found if found and found.pid != worker.pid else None)(
        _child(stack, "celery", "worker")), timeout=60, what="a new worker process")
    for stream in streams:
        stream.thread.join(timeout=300)
    assert [stream.error for stream in streams] == [None] * STREAMS
    assert [(stream.done, len(stream.tokens)) for stream in streams] == [(True, MAX_TOKENS)] * STREAMS
    assert running_at_kill > 0, "the streams ended before the kill: make MAX_TOKENS larger"
    assert _child(stack, "engine", "serve").pid == engine.pid  # the engine was never stopped
    assert _job_runs(stack, control_token)["status"] == "succeeded"
    assert _child(stack, "celery", "worker").pid == new_worker.pid
    assert "make run: restarted the Celery worker" in stack.printed()

    everything = stack.descendants()
    assert any("beat" in process.cmdline() for process in everything)
    stack.launcher.send_signal(signal.SIGTERM)
    assert stack.launcher.wait(timeout=90) == 0
    _, alive = psutil.wait_procs(everything, timeout=30)
    left = [process for process in alive if process.is_running() and process.status() != psutil.STATUS_ZOMBIE]
    commands = [" ".join(process.cmdline()) for process in left]
    for process in left:  # not to leak them into the rest of the suite
        process.kill()
    assert not left, commands
    stack.reader.join(timeout=10)
    assert "stopping Seam" in stack.printed()

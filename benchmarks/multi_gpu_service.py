"""The engine service as the multi-GPU run drives it: `python -m engine serve` in its own process, and its HTTP API.

`HttpEngine` is the service seen through /v1/completions with the surface benchmarks.rig_load.Load drives (`config`
and `submit`), so the same request accounting runs against the real service; `change` is a cut change through the
control API (plan, apply, wait), under load when given.

The run is its own console: it generates a control token and approval key, hands them to every engine it starts
(through the environment) and sends the token and a signed attestation with each change.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from benchmarks.rig_load import Load
from contracts.attestation import (
    API_KEY_ENV,
    APPROVAL_KEY_ENV,
    CONTROL_TOKEN_ENV,
    AuditHead,
    bearer_token,
    sign_attestation,
)
from engine.config import ModelConfig
from engine.control.protocol import RequestHandle
from engine.errors import EngineRequestError
from engine.runtime.sampler import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("seam.multi_gpu")
# One run, one process: the engines it starts and its clients share these, and nothing else ever sees them.
CONTROL_TOKEN = secrets.token_urlsafe(32)
APPROVAL_KEY = secrets.token_urlsafe(32)
_JOB_IDS = itertools.count(1)  # each change is its own "job": an engine applies a job id once


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Service:
    """One `python -m engine serve` process; its output goes to the run's log line by line."""

    def __init__(self, label: str, checkpoint: Path, rig: str, cut: list[int], live: list,
                 extra_args: tuple[str, ...] = ()):
        self.label, self.port = label, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, CONTROL_TOKEN_ENV: CONTROL_TOKEN, APPROVAL_KEY_ENV: APPROVAL_KEY}
        env.pop("REDIS_URL", None)  # no telemetry publishing: nothing here listens
        env.pop(API_KEY_ENV, None)  # the engine listens on loopback, for this run's own requests only
        # A state folder of its own: this run's job ids start at 1, and a port an earlier run used keeps that run's
        # spent ids in the default folder for a day (engine/control/job_ledger.py).
        state_dir = tempfile.mkdtemp(prefix=f"seam-bench-{label}-")
        command = [sys.executable, "-m", "engine", "serve", "--checkpoint", str(checkpoint), "--rig", rig,
                   "--cut", ",".join(map(str, cut)), "--port", str(self.port), "--state-dir", state_dir, *extra_args]
        self.command = " ".join(command)
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        live.append(self)  # from here the watchdog and the stop step can end it
        self.ranks: list[psutil.Process] = []
        threading.Thread(target=self._drain, name=f"log-{label}", daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stdout:
            log.info("service %s: %s", self.label, line.rstrip())

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service {self.label} exited with {self.process.returncode} (see the log)")
            try:
                if httpx.get(self.url + "/healthz", timeout=5).status_code == 200:
                    self.ranks = self.rank_processes()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"service {self.label} did not answer /healthz within {timeout_s:.0f} s")

    def rank_processes(self) -> list[psutil.Process]:
        """The rank processes the service spawned (multiprocessing's spawn children, not its resource tracker, nor
        the front end: the spawn child that listens on the service's port)."""
        children = psutil.Process(self.process.pid).children(recursive=True)
        return [child for child in children if "spawn_main" in " ".join(child.cmdline())
                and not self._listens(child)]

    def _listens(self, process: psutil.Process) -> bool:
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port
                   for c in process.net_connections(kind="inet"))

    def rank_environments(self, names: tuple[str, ...]) -> list[dict]:
        """What each rank process really has in its environment for `names` (None: unset)."""
        return [{"pid": rank.pid, **{name: rank.environ().get(name) for name in names}} for rank in self.ranks]

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (the service shuts its ranks down), then kill whatever of it is left, by process id."""
        if self.process.poll() is None:
            with contextlib.suppress(psutil.Error):  # a service stopped while starting: find its ranks now
                self.ranks = self.rank_processes() or self.ranks
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for rank in self.ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()
        return self.process.returncode


@dataclass
class TimedHandle(RequestHandle):
    """A request streamed over HTTP, with when it was submitted, saw its first token and ended (perf_counter s)."""

    submitted_s: float = 0.0
    first_token_s: float | None = None
    done_s: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each token arrived


class HttpEngine:
    def __init__(self, url: str, checkpoint: Path, timeout_s: float = 600.0):
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                   limits=httpx.Limits(max_connections=256), headers=bearer_token(CONTROL_TOKEN))
        self.config = ModelConfig.from_pretrained(checkpoint)
        self.ids = itertools.count()

    def submit(self, prompt: list[int], params: SamplingParams) -> TimedHandle:
        """Stream one request; a refusal at the door raises EngineRequestError with the service's reason."""
        handle = TimedHandle(next(self.ids), list(prompt), submitted_s=time.perf_counter())
        response = self.client.send(self.client.build_request("POST", "/v1/completions",
                                                              json=stream_body(prompt, params)), stream=True)
        if response.status_code != 200:
            message = _message(response.read())
            response.close()
            raise EngineRequestError(f"HTTP {response.status_code}: {message}")
        threading.Thread(target=self._read, args=(response, handle), name=f"stream-{handle.request_id}",
                         daemon=True).start()
        return handle

    @staticmethod
    def _read(response: httpx.Response, handle: TimedHandle) -> None:
        try:
            for line in response.iter_lines():
                take_event(handle, line)
        except (httpx.HTTPError, ValueError, KeyError) as error:
            handle.finish_reason, handle.error = "refused", f"the stream broke: {type(error).__name__}: {error}"
        finally:
            response.close()
            end_stream(handle)

    def complete(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy token ids of one request on its own (the batch is the same in every engine compared)."""
        reply = self.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0, "ignore_eos": True})
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {_message(reply.content)}")
        return reply.json()["choices"][0]["token_ids"]

    def state(self) -> dict:
        return self.client.get("/control/state").json()

    def close(self) -> None:
        self.client.close()


def stream_body(prompt: list[int], params: SamplingParams) -> dict:
    """A streaming /v1/completions body: token ids in, greedy (the batch is the same in every engine compared)."""
    return {"prompt": prompt, "max_tokens": params.max_tokens, "temperature": 0, "ignore_eos": params.ignore_eos,
            "stream": True}


def take_event(handle: TimedHandle, line: str) -> None:
    """One line of a completion's event stream into `handle`, timing each token's arrival."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    chunk = json.loads(line.removeprefix("data: "))
    if "error" in chunk:  # admitted, then refused (400) or failed (500) mid-stream: said in the stream
        handle.finish_reason, handle.error = "refused", chunk["error"]["message"]
        return
    choice = chunk["choices"][0]
    arrived = time.perf_counter()
    if choice["token_ids"] and handle.first_token_s is None:
        handle.first_token_s = arrived
    for token in choice["token_ids"]:
        handle.token_times.append(arrived)
        handle.emit(token)
    handle.finish_reason = choice["finish_reason"] or handle.finish_reason


def end_stream(handle: TimedHandle) -> None:
    """The stream is over: a stream that ended without a finish reason is a refusal."""
    if handle.finish_reason is None:
        handle.finish_reason, handle.error = "refused", "the stream ended without a finish reason"
    handle.done_s = time.perf_counter()
    handle.end(handle.finish_reason, handle.error)


def _message(raw: bytes) -> str:
    try:
        error = json.loads(raw)["error"]
        return error["message"] if isinstance(error, dict) else str(error)
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:500]


def change(engine: HttpEngine, cut: list[int], load: Load | None, budget_s: float, out: dict) -> None:
    """A cut change through /control/plan, /control/apply and /control/operations (under load when given); raises
    when it is refused, fails or outlives `budget_s`, with what was seen in `out`."""
    client = engine.client
    planned = client.post("/control/plan", json={"kind": "cut", "target": {"cut": cut},
                                                 "incumbent_fingerprint": engine.state()["fingerprint"]}).json()
    out.update(target=cut, feasible=planned["feasible"], plan_reasons=planned["reasons"])
    if not planned["feasible"]:
        raise RuntimeError(f"cut {cut} refused by the engine's plan: {planned['reasons']}")
    if load is not None:
        out["streaming_at_apply"] = load.streaming(timeout=min(60.0, budget_s / 3))
        out["in_flight_at_apply"] = load.in_flight()
    started = time.perf_counter()
    # A trail of its own: no console signs here, and the engine witnesses each trail apart.
    head = AuditHead(secrets.token_hex(32), 1, secrets.token_hex(32))
    attestation = sign_attestation(APPROVAL_KEY, planned["plan_hash"], next(_JOB_IDS), ["multi-gpu-run"], time.time(),
                                   head)
    applied = client.post("/control/apply", json={"plan": planned["plan"], "plan_hash": planned["plan_hash"],
                                                  "attestation": attestation})
    if applied.status_code != 202:
        raise RuntimeError(f"apply refused, HTTP {applied.status_code}: {_message(applied.content)}")
    operation_id = applied.json()["operation_id"]
    deadline = time.monotonic() + budget_s
    while True:
        operation = client.get(f"/control/operations/{operation_id}").json()
        # The operation reads done a moment before the engine serves again.
        if operation["phase"] == "done" and engine.state()["phase"] in ("serving", "broken"):
            break
        if time.monotonic() > deadline:
            out.update(status=operation["status"], phase=operation["phase"])
            raise TimeoutError(f"operation {operation_id} still {operation['phase']} after {budget_s:.0f} s")
        time.sleep(0.05)
    predicted = operation["predicted"] or {}
    out.update(operation_id=operation_id, seconds=round(time.perf_counter() - started, 3),
               status=operation["status"], error=operation["error"], notes=operation["notes"],
               predicted={key: predicted.get(key) for key in ("pool_tokens", "binding_rank")},
               cut_after=engine.state()["cut"])
    if operation["status"] != "succeeded":
        raise RuntimeError(f"cut {cut}: operation {operation['status']}: {operation['error']}")

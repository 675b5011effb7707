"""Starting the real engine service (`python -m engine serve`) for integration tests, and talking to it.

The engine reads its credentials from the environment it inherits (tests/conftest.py sets the control token and
approval key; `extra_env` may add or blank any). `client` sends the control token, `complete` the API key when one
is set, and `apply` signs an attestation with the approval key, as a console would; `anonymous` sends nothing.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from contracts.attestation import (
    API_KEY_ENV,
    APPROVAL_KEY_ENV,
    CONTROL_TOKEN_ENV,
    AuditHead,
    bearer_token,
    sign_attestation,
)

# Far above the ids of the console's jobs, so a test's direct apply never collides with a job a console runs on the
# same engine (the engine refuses a job id twice).
_JOB_IDS = itertools.count(10**9)
ROOT = Path(__file__).resolve().parents[2]


def lone_head() -> AuditHead:
    """The audit head of a trail of its own, for an attestation no console signed: the engine witnesses each trail
    apart, so no other test's trail ever meets it."""
    return AuditHead(secrets.token_hex(32), 1, secrets.token_hex(32))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveService:
    def __init__(self, checkpoint: Path, rig: str = "cpu-demo", extra_env: dict | None = None,
                 redis_url: str | None = None, channel: str = "seam:telemetry", ladder: str | None = None,
                 state_dir: Path | None = None, port: int | None = None, extra_args: tuple[str, ...] = ()):
        """`state_dir`: the engine's --state-dir (default: a fresh folder, so no test sees another's spent jobs);
        `port`: to restart an engine where it was; `extra_args`: more `engine serve` flags."""
        self.port = port or free_port()
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix="seam-engine-state-"))
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **(extra_env or {})}
        env.pop("REDIS_URL", None)
        self.control_token, self.approval_key, self.api_key = (env.get(name) or None for name in (
            CONTROL_TOKEN_ENV, APPROVAL_KEY_ENV, API_KEY_ENV))
        command = [sys.executable, "-m", "engine", "serve", "--checkpoint", str(checkpoint), "--rig", rig,
                   "--port", str(self.port), "--state-dir", str(self.state_dir)]
        if ladder:
            command += ["--ladder", ladder]
        command += extra_args
        if redis_url:
            command += ["--redis-url", redis_url, "--telemetry-hz", "10", "--telemetry-channel", channel]
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        self.output: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        control = bearer_token(self.control_token) if self.control_token else {}
        self.client = httpx.Client(base_url=self.url, timeout=120, headers=control)
        self.anonymous = httpx.Client(base_url=self.url, timeout=120)
        self._wait_ready()

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)

    def _wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("engine service exited:\n" + "".join(self.output))
            try:
                if self.client.get("/healthz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("engine service did not start:\n" + "".join(self.output))

    def complete(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        reply = self.client.post("/v1/completions", json={"prompt": prompt_ids, "max_tokens": max_tokens,
                                                            "temperature": 0}, headers=self.api_headers())
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]

    def state(self) -> dict:
        return self.client.get("/control/state").json()

    def plan(self, kind: str, target: dict) -> dict:
        reply = self.client.post("/control/plan", json={"kind": kind, "target": target,
                                                        "incumbent_fingerprint": self.state()["fingerprint"]})
        assert reply.status_code == 200, reply.text
        return reply.json()

    def api_headers(self) -> dict[str, str]:
        return bearer_token(self.api_key) if self.api_key else {}

    def attest(self, plan_hash: str, job_id: int | None = None, audit_head: AuditHead | None = None) -> dict:
        """An attestation as the console signs it, with the approval key this engine was given, a fresh job id and
        (unless given) a trail of its own."""
        return sign_attestation(self.approval_key or "", plan_hash, next(_JOB_IDS) if job_id is None else job_id,
                                ["live-service-reviewer"], time.time(), audit_head or lone_head())

    def apply(self, planned: dict, attestation: dict | None = None) -> httpx.Response:
        """POST /control/apply with `attestation`, by default a fresh valid one for the plan."""
        attestation = attestation or self.attest(planned["plan_hash"])
        return self.client.post("/control/apply", json={"plan": planned["plan"], "plan_hash": planned["plan_hash"],
                                                         "attestation": attestation})

    def wait_operation(self, operation_id: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            operation = self.client.get(f"/control/operations/{operation_id}").json()
            if operation["status"] not in ("queued", "running"):
                return operation
            time.sleep(0.05)
        raise AssertionError(f"operation {operation_id} did not finish")

    def stop(self) -> int:
        self.client.close()
        self.anonymous.close()
        self.process.terminate()
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def run_concurrently(service: LiveService, prompts: list[list[int]], max_tokens: int) -> tuple[list, list]:
    """Start every request on its own thread; returns (threads, results) — join the threads to read results."""
    results: list = [None] * len(prompts)

    def one(index: int) -> None:
        results[index] = service.complete(prompts[index], max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    return threads, results

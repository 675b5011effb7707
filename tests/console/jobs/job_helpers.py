"""Helpers for the job tests: move the engine, wait for jobs, run a Celery worker, listen to a job's group."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

from channels.layers import channel_layers
from django.db import connection, connections

from console.audit.models import AuditEvent
from console.engine import EngineClient
from console.jobs.attestation import attest
from console.jobs.choices import TERMINAL
from console.jobs.events import group_name
from console.jobs.models import Job

ROOT = Path(__file__).resolve().parents[3]


def other_cut(engine) -> list[int]:
    """A feasible cut that is not the engine's current one."""
    current = engine.state()["cut"]
    for cut in ([8, 4, 4], [7, 5, 4], [6, 6, 4], [7, 4, 5]):
        if cut != current and engine.plan("cut", {"cut": cut})["feasible"]:
            return cut
    raise AssertionError(f"no feasible cut other than {current}")


def move_engine(engine) -> str:
    """Change the engine's layout directly over HTTP (a shape change), as if someone else did — an operator
    bypassing the console, or whoever holds its control token and approval key: LiveService.apply attests the plan
    itself, for a job no console has. Returns the new fingerprint."""
    seqs = engine.state()["shape"]["max_num_seqs"]
    planned = engine.plan("shape", {"max_num_seqs": 6 if seqs != 6 else 7})
    assert planned["feasible"], planned["reasons"]
    reply = engine.apply(planned)
    assert reply.status_code == 202, reply.text
    assert engine.wait_operation(reply.json()["operation_id"])["status"] == "succeeded"
    return engine.state()["fingerprint"]


def apply_as_the_worker(job: Job) -> str:
    """Apply the job's plan as its worker does (attested for this job, by the console's code) and record nothing:
    what a worker that died right after the engine accepted the plan leaves behind. Returns the operation id."""
    with EngineClient() as engine:
        return engine.apply(job.plan, job.plan_hash, attest(job))


def wait_for_end(job_id: int, timeout: float = 60.0) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job_id)
        if job.status in TERMINAL:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not end: {Job.objects.get(pk=job_id).status}")


def database_url() -> str:
    """The database this process's connection uses now (after django_db_setup: the test database)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    if connection.vendor == "postgresql":
        credentials = quote(db["USER"] or "", safe="") + (f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"]
                                                          else "")
        host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
        return f"postgresql://{credentials}@{host}/{quote(db['NAME'], safe='')}"
    raise RuntimeError(f"no worker database URL for {connection.vendor}")


class Worker:
    def __init__(self, queue: str, env: dict):
        self.queue = queue
        command = [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool=solo", "--concurrency=1",
                   "-Q", queue, "-n", f"{queue}@%h", "--without-mingle", "--without-gossip", "--without-heartbeat",
                   "--loglevel=INFO"]
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        self.output: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if not self.ready.wait(60) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError("the Celery worker did not start:\n" + "".join(self.output))

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            if " ready." in line:
                self.ready.set()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # warm shutdown: a task in progress finishes first
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()




class JobListener:
    """Subscribes to group `job-<id>` on its own event loop and thread (as a browser's consumer would), and
    collects every message until a terminal status arrives or it is stopped."""

    def __init__(self, job_id: int):
        self.group = group_name(job_id)
        self.messages: list[dict] = []
        self._subscribed, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._listen()), daemon=True)

    def __enter__(self) -> JobListener:
        self._thread.start()
        assert self._subscribed.wait(10), "could not subscribe to the channel layer"
        return self

    def __exit__(self, *exc) -> None:
        self.wait(timeout=10)
        self._stop.set()
        self._thread.join(timeout=10)

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (self.statuses and self.statuses[-1] in TERMINAL):
            time.sleep(0.05)

    @property
    def statuses(self) -> list[str]:
        return [message["job"]["status"] for message in self.messages]

    async def _listen(self) -> None:
        layer = channel_layers.make_backend("default")
        channel = await layer.new_channel()
        await layer.group_add(self.group, channel)
        self._subscribed.set()
        try:
            while not self._stop.is_set():
                try:
                    self.messages.append(await asyncio.wait_for(layer.receive(channel), 0.25))
                except TimeoutError:
                    continue
        finally:
            await layer.group_discard(self.group, channel)
            await layer.close_pools()


def actions(job) -> list[str]:
    return list(AuditEvent.objects.filter(subject=f"job:{job.pk}").order_by("seq").values_list("action", flat=True))


def at_once(calls) -> list:
    """Run each call on its own thread, released together; returns each result or exception."""
    barrier, results = threading.Barrier(len(calls)), [None] * len(calls)

    def run(index, call):
        try:
            barrier.wait()
            results[index] = call()
        except Exception as error:  # reported to the test
            results[index] = error
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results

"""The job tests' world: a real Celery worker process, real Redis, real databases, and helpers to move the engine,
wait for jobs and listen to a job's group.

How a worker in another process sees the test database
------------------------------------------------------
pytest-django builds a test database and points this process at it; a Celery worker is a separate process
that reads DATABASE_URL when it starts. So:

* On SQLite the test database must be a file: pytest-django's default is an in-memory database that no
  other process can open. This plugin names a file (in a fresh temporary folder) as the test database
  when it is loaded (tests/conftest.py), before any database is set up. Only SQLite is touched; on
  PostgreSQL the test database (`test_<name>`) is a server database already.
* The worker fixture asks for `django_db_setup` (so the test database exists and this process's
  connection names it) and hands the worker a DATABASE_URL built from that connection's settings: the very
  database the tests write to.
* Tests that share rows with the worker use `django_db(transaction=True)`: their writes are committed (a
  plain `django_db` test keeps everything in a transaction the worker cannot see), and the tables are
  emptied after each test. Groups made by the roles migration go with them, so `make_user` recreates them.

Work for the worker goes through the real Redis broker on a queue of its own (`seam-test-jobs-<random>`),
set as this process's default queue while the worker runs, so no other worker on this Redis takes our
jobs and ours takes no one else's. Tests that run jobs in this process instead use `handoffs`, which
records what would have been sent.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from channels.layers import channel_layers
from django.conf import settings
from django.db import connection, connections

from console.audit.models import AuditEvent
from console.engine import EngineClient
from console.jobs import lifecycle
from console.jobs.attestation import attest
from console.jobs.choices import TERMINAL
from console.jobs.events import group_name
from console.jobs.models import Job

ROOT = Path(__file__).resolve().parents[2]

_default = settings.DATABASES["default"]
if _default["ENGINE"].endswith("sqlite3") and not (_default.get("TEST") or {}).get("NAME"):
    _default.setdefault("TEST", {})["NAME"] = str(Path(tempfile.mkdtemp(prefix="seam-jobs-db-")) / "test.sqlite3")


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


# --- fixtures ----------------------------------------------------------------------------------

@pytest.fixture
def propose_cut(live_engine, operator):
    """propose_cut(user=operator, cut=None) -> a proposed job for a feasible cut change."""
    def propose(user=None, cut=None):
        return lifecycle.propose(user or operator, {"kind": "cut", "target": {"cut": cut or other_cut(live_engine)}})
    return propose


@pytest.fixture
def handoffs(monkeypatch) -> list[int]:
    """Record the job ids handed to the worker (after commit) instead of sending them to a broker."""
    sent: list[int] = []
    monkeypatch.setattr(lifecycle, "hand_off", lambda job_id, request_id=None: sent.append(job_id))
    return sent


@pytest.fixture(scope="module")
def celery_worker(django_db_setup, django_db_blocker, engine) -> Iterator[Worker]:
    """A real `celery -A console worker --pool=solo` process on the real Redis broker, on a queue of its own,
    reading the test database and talking to the test engine."""
    from console.celery import app

    queue = f"seam-test-jobs-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        url = database_url()
    env = {**os.environ, "DATABASE_URL": url, "SEAM_ENGINE_URL": engine.url, "PYTHONUNBUFFERED": "1"}
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    worker = Worker(queue, env)
    try:
        yield worker
    finally:
        worker.stop()
        app.conf.task_default_queue = previous
        broker = redis.Redis.from_url(app.conf.broker_url)
        broker.delete(queue)
        broker.close()

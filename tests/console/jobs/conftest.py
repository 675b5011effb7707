"""Fixtures for the job tests: a real engine service, a real Celery worker process, real Redis, real databases.

How a worker in another process sees the test database
------------------------------------------------------
pytest-django builds a test database and points this process at it; a Celery worker is a separate process
that reads DATABASE_URL when it starts. So:

* On SQLite the test database must be a file: pytest-django's default is an in-memory database that no
  other process can open. This conftest names a file (in a fresh temporary folder) as the test database
  before any database is set up, which happens after every conftest has been imported. Only SQLite is
  touched; on PostgreSQL the test database (`test_<name>`) is a server database already.
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

import os
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

# The engine's test helper (LiveService) and ours, importable by name from the test modules.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from job_helpers import Worker, database_url, other_cut  # noqa: E402
from live_service import LiveService  # noqa: E402

from console.jobs import lifecycle  # noqa: E402
from console.jobs.roles import ensure_roles  # noqa: E402

_default = settings.DATABASES["default"]
if _default["ENGINE"].endswith("sqlite3") and not (_default.get("TEST") or {}).get("NAME"):
    _default.setdefault("TEST", {})["NAME"] = str(Path(tempfile.mkdtemp(prefix="seam-jobs-db-")) / "test.sqlite3")


# --- the engine --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory):
    from engine.demo import make_demo_checkpoint

    folder = tmp_path_factory.mktemp("jobs-demo")
    make_demo_checkpoint(folder, force=True)
    return folder


@pytest.fixture(scope="session")
def engine(demo_checkpoint):
    """One real engine service (three CPU ranks, the demo checkpoint) for all the job tests: starting one
    takes seconds, so the modules share it; each test plans against whatever layout it finds."""
    live = LiveService(demo_checkpoint)
    yield live
    live.stop()


@pytest.fixture
def live_engine(engine, settings):
    """The engine, with this process's console pointed at it."""
    settings.ENGINE_URL = engine.url
    return engine


# --- users and jobs ----------------------------------------------------------------------------

@pytest.fixture
def make_user(db):
    """make_user(*roles, name=None) -> a user in those role groups."""
    counter = iter(range(1, 10**6))

    def make(*roles: str, name: str | None = None):
        ensure_roles()
        user = get_user_model().objects.create_user(name or f"{'-'.join(roles) or 'nobody'}-{next(counter)}")
        user.groups.add(*Group.objects.filter(name__in=roles))
        return user

    return make


@pytest.fixture
def operator(make_user):
    return make_user("operator", name="olga")


@pytest.fixture
def reviewer(make_user):
    return make_user("reviewer", name="rita")


@pytest.fixture
def propose_cut(live_engine, operator):
    """propose_cut(user=operator, cut=None) -> a proposed job for a feasible cut change."""
    def propose(user=None, cut=None):
        return lifecycle.propose(user or operator, {"kind": "cut", "target": {"cut": cut or other_cut(live_engine)}})
    return propose


@pytest.fixture
def handoffs(monkeypatch):
    """Record the job ids handed to the worker (after commit) instead of sending them to a broker."""
    sent: list[int] = []
    monkeypatch.setattr(lifecycle, "hand_off", lambda job_id, request_id=None: sent.append(job_id))
    return sent


# --- the Celery worker -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def celery_worker(django_db_setup, django_db_blocker, engine):
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

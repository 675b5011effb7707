"""Fault tests' fixture: Celery workers a test starts (and may kill) on a queue of its own."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.faults import Workers
from tests.support.jobs import database_url


@pytest.fixture
def workers(django_db_setup, django_db_blocker, engine) -> Iterator[Workers]:
    """workers.start(**env) -> a real Celery worker on this test's own queue (the default queue while the test
    runs), reading the test database and, unless env says otherwise, talking to the shared test engine."""
    from console.celery import app

    queue = f"seam-test-faults-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        url = database_url()
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    pool = Workers(queue, {**os.environ, "DATABASE_URL": url, "SEAM_ENGINE_URL": engine.url, "PYTHONUNBUFFERED": "1"})
    try:
        yield pool
    finally:
        pool.stop_all()
        app.conf.task_default_queue = previous
        broker = redis.Redis.from_url(app.conf.broker_url)
        broker.delete(queue, f"{queue}.unacked")
        broker.close()

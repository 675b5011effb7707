"""Fault and hostile-input tests reuse the console's job and API fixtures (a real engine service, a real Celery
worker on the real Redis broker, users by role, one-line API calls): loaded from their conftests, not copied."""

from __future__ import annotations

import importlib.util
import os
import uuid
from pathlib import Path

import pytest
import redis

_spec = importlib.util.spec_from_file_location(
    "seam_api_conftest_for_faults", Path(__file__).resolve().parents[1] / "console" / "api" / "conftest.py")
_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_api)

demo_checkpoint, engine, live_engine = _api.demo_checkpoint, _api.engine, _api.live_engine
make_user, operator, reviewer, viewer, handoffs = _api.make_user, _api.operator, _api.reviewer, _api.viewer, \
    _api.handoffs
post, get, proposed = _api.post, _api.get, _api.proposed
celery_worker = _api._jobs.celery_worker


@pytest.fixture
def workers(django_db_setup, django_db_blocker, engine):
    """workers.start(**env) -> a real Celery worker on this test's own queue (the default queue while the test
    runs), reading the test database and, unless env says otherwise, talking to the shared test engine."""
    from fault_helpers import Workers
    from job_helpers import database_url

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

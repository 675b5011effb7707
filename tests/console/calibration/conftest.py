"""Calibration test fixtures: the job tests' engine, users and handoffs (loaded from their conftest), API and page
clients, and `seed(cut, decode_ms)`, which records a crafted engine measurement (calibration_helpers.py) as the
console would; `dead_engine` points the console at a port nothing listens on, so the running layout comes from the
measurements (or the rig) and no test depends on an engine that happens to be up.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.test import APIClient

_spec = importlib.util.spec_from_file_location(
    "seam_jobs_conftest_for_calibration", Path(__file__).resolve().parents[1] / "jobs" / "conftest.py")
_jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_jobs)

demo_checkpoint, engine, live_engine = _jobs.demo_checkpoint, _jobs.engine, _jobs.live_engine
make_user, operator, reviewer, handoffs = _jobs.make_user, _jobs.operator, _jobs.reviewer, _jobs.handoffs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_helpers import URL, measurement, state_of  # noqa: E402
from live_service import free_port  # noqa: E402  (put on the path by the jobs conftest)


@pytest.fixture
def seed(db):
    """seed(cut, decode_ms, **measurement kwargs) -> the MeasuredLayout row recorded from it (periodic)."""
    from console.calibration.recording import record

    def make(cut, decode_ms=None, **kwargs):
        row = record(state_of(measurement(cut, decode_ms, **kwargs)), "periodic", engine_url=URL)
        assert row is not None
        return row
    return make


@pytest.fixture
def dead_engine(settings):
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"
    return settings.ENGINE_URL


def _call(method, url, data=None, *, user=None, expect=200, **extra):
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    response = getattr(client, method)(url, data, **extra)
    assert response.status_code == expect, (response.status_code, getattr(response, "content", b"")[:2000])
    if response.get("Content-Type", "").startswith("application/json"):
        return response.json()
    return response


@pytest.fixture
def get():
    def call(url, data=None, *, user=None, expect=200, **extra):
        return _call("get", url, data, user=user, expect=expect, **extra)
    return call


@pytest.fixture
def viewer(make_user):
    return make_user("viewer", name="vera")


@pytest.fixture
def browse():
    """browse(user) -> a test client logged in as `user`."""
    def login(user) -> Client:
        client = Client()
        client.force_login(user)
        return client
    return login

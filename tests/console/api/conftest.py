"""API test fixtures: the job tests' engine, users and handoffs (loaded from their conftest), and a client helper.

`post(url, data, user=..., expect=status)` / `get(url, user=..., expect=status)` keep each API call one line:
they authenticate as `user` (None: anonymous), check the status and return the parsed JSON.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from rest_framework.test import APIClient

_spec = importlib.util.spec_from_file_location(
    "seam_jobs_conftest", Path(__file__).resolve().parents[1] / "jobs" / "conftest.py")
_jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_jobs)

demo_checkpoint, engine, live_engine = _jobs.demo_checkpoint, _jobs.engine, _jobs.live_engine
make_user, operator, reviewer, handoffs = _jobs.make_user, _jobs.operator, _jobs.reviewer, _jobs.handoffs
other_cut = _jobs.other_cut


def _call(method, url, data=None, *, user=None, expect=200, **extra):
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    response = getattr(client, method)(url, data, format="json", **extra) if method == "post" else \
        client.get(url, data, **extra)
    assert response.status_code == expect, (response.status_code, getattr(response, "content", b"")[:2000])
    if response.get("Content-Type", "").startswith("application/json"):
        return response.json()
    return response


@pytest.fixture
def post():
    def call(url, data=None, *, user=None, expect=200, **extra):
        return _call("post", url, data, user=user, expect=expect, **extra)
    return call


@pytest.fixture
def get():
    def call(url, data=None, *, user=None, expect=200, **extra):
        return _call("get", url, data, user=user, expect=expect, **extra)
    return call


@pytest.fixture
def viewer(make_user):
    return make_user("viewer", name="vera")


@pytest.fixture
def proposed(live_engine, operator, post):
    """proposed(user=operator) -> the JSON of a job proposed through the API for a feasible cut change."""
    def make(user=None):
        return post("/api/v1/jobs/", {"kind": "cut", "target": {"cut": other_cut(live_engine)}},
                    user=user or operator, expect=201)
    return make

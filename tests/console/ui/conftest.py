"""Page test fixtures: the job tests' engine, users and handoffs (loaded from their conftest), role users, and a
logged-in Django test client per user."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from django.test import Client

_spec = importlib.util.spec_from_file_location(
    "seam_jobs_conftest_for_ui", Path(__file__).resolve().parents[1] / "jobs" / "conftest.py")
_jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_jobs)

demo_checkpoint, engine, live_engine = _jobs.demo_checkpoint, _jobs.engine, _jobs.live_engine
make_user, operator, reviewer, handoffs = _jobs.make_user, _jobs.operator, _jobs.reviewer, _jobs.handoffs
propose_cut, celery_worker = _jobs.propose_cut, _jobs.celery_worker


@pytest.fixture
def viewer(make_user):
    return make_user("viewer", name="vera")


@pytest.fixture
def browse():
    """browse(user) -> a test client logged in as `user` (CSRF checks on, as in a browser)."""
    def login(user) -> Client:
        client = Client(enforce_csrf_checks=True)
        client.force_login(user)
        return client
    return login


@pytest.fixture
def post_form():
    """post_form(client, url, data) -> response: POST as the page's form does, with the CSRF token the pages
    hand out (every page's logout form carries one)."""
    def post(client: Client, url: str, data: dict | None = None, **extra):
        client.get("/jobs/")
        token = client.cookies["csrftoken"].value
        return client.post(url, {**(data or {}), "csrfmiddlewaretoken": token}, **extra)
    return post

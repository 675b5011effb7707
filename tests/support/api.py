"""Clients for the console: the API one call a line, and a logged-in page client.

`post(url, data, user=..., expect=status)` / `get(url, user=..., expect=status)` authenticate as `user` (None:
anonymous), check the status and return the parsed JSON. `browse(user)` is a Django test client logged in as `user`
with CSRF checks on, and `post_form(client, url, data)` posts as the page's form does.
"""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.support.jobs import other_cut


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
def proposed(live_engine, operator, post):
    """proposed(user=operator) -> the JSON of a job proposed through the API for a feasible cut change."""
    def make(user=None):
        return post("/api/v1/jobs/", {"kind": "cut", "target": {"cut": other_cut(live_engine)}},
                    user=user or operator, expect=201)
    return make


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

"""Brute force (issue 13, item 5): django-axes locks a username + address after SEAM_LOGIN_FAILURE_LIMIT failed
logins, on the login page and the token API alike, and while locked even the right password is refused; the token
endpoint is also rate-limited per address (ScopedRateThrottle).

Attempts are rows (axes' AccessAttempt) that roll back with each test; the throttle's history is in the default
cache, which each test here starts and ends empty."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from axes.models import AccessAttempt
from django.conf import settings
from django.test import AsyncClient
from rest_framework.throttling import ScopedRateThrottle

from console.accounts.models import ApiToken
from console.api.views import TokenView
from tests.support.users import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_throttle_history")]

TOKEN_URL = "/api/v1/auth/token/"


@pytest.fixture
def lockout_only(monkeypatch):
    """The token view without its rate limit, so what refuses the right password can only be the lockout."""
    monkeypatch.setattr(TokenView, "throttle_classes", [])


def _page_login(client, password: str, username: str = "vic"):
    return client.post("/login/", {"username": username, "password": password})


def _token_login(client, password: str, username: str = "vic"):
    return client.post(TOKEN_URL, {"username": username, "password": password})


def test_the_limit_and_cooloff_come_from_the_environment():
    env = {**os.environ, "SEAM_LOGIN_FAILURE_LIMIT": "3", "SEAM_LOGIN_COOLOFF_S": "60", "SEAM_TOKEN_RATE": "7/min"}
    code = ("from console import settings as s; "
            "print(s.AXES_FAILURE_LIMIT, int(s.AXES_COOLOFF_TIME.total_seconds()), s.REST_FRAMEWORK["
            "'DEFAULT_THROTTLE_RATES']['auth-token'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "60", "7/min"]


def test_thirty_wrong_passwords_on_the_login_page_lock_it_and_the_right_one_is_refused_too(client, vic):
    limit = settings.SEAM_LOGIN_FAILURE_LIMIT
    answers = [_page_login(client, f"wrong-{n}").status_code for n in range(30)]
    assert answers == [200] * (limit - 1) + [429] * (30 - limit + 1)

    locked = _page_login(client, PASSWORD)
    page = locked.content.decode()
    assert locked.status_code == 429 and 'data-testid="locked-out"' in page and "Traceback" not in page
    assert "even with the right password" in page
    assert client.get("/jobs/").status_code == 302  # not logged in


def test_the_login_page_locks_under_asgi_too(vic):
    """daphne serves the console through ASGI, where AxesMiddleware takes its async path."""
    client = AsyncClient()
    for n in range(settings.SEAM_LOGIN_FAILURE_LIMIT):
        async_to_sync(client.post)("/login/", {"username": "vic", "password": f"wrong-{n}"})
    locked = async_to_sync(client.post)("/login/", {"username": "vic", "password": PASSWORD})
    assert locked.status_code == 429 and 'data-testid="locked-out"' in locked.content.decode()


def test_thirty_wrong_passwords_on_the_token_api_lock_it_and_the_right_one_is_refused_too(client, vic, lockout_only):
    limit = settings.SEAM_LOGIN_FAILURE_LIMIT
    answers = [_token_login(client, f"wrong-{n}") for n in range(30)]
    assert [a.status_code for a in answers] == [400] * (limit - 1) + [429] * (30 - limit + 1)

    locked = _token_login(client, PASSWORD)
    assert locked.status_code == 429 and locked["Content-Type"] == "application/json"
    body = locked.json()
    assert body["code"] == "LockedOut" and "even with the right password" in body["detail"]
    assert locked["Retry-After"] == str(settings.SEAM_LOGIN_COOLOFF_S)
    assert not ApiToken.objects.filter(user=vic).exists()


def test_the_lock_is_per_username_and_address(client, vic, make_user, lockout_only):
    other = make_user("viewer", name="otto")
    other.set_password(PASSWORD)
    other.save()
    for n in range(settings.SEAM_LOGIN_FAILURE_LIMIT):
        _page_login(client, f"wrong-{n}")
    assert _page_login(client, PASSWORD).status_code == 429
    # The same username from another address, and another username from this one, still log in.
    assert client.post(TOKEN_URL, {"username": "vic", "password": PASSWORD}, REMOTE_ADDR="10.0.0.9").status_code == 200
    assert _page_login(client, PASSWORD, username="otto").status_code == 302


def test_the_lock_lifts_after_the_cooloff(client, vic, lockout_only):
    for n in range(settings.SEAM_LOGIN_FAILURE_LIMIT):
        _token_login(client, f"wrong-{n}")
    assert _token_login(client, PASSWORD).status_code == 429
    AccessAttempt.objects.update(attempt_time=dt.datetime.now(dt.UTC) - dt.timedelta(
        seconds=settings.SEAM_LOGIN_COOLOFF_S + 1))
    assert _token_login(client, PASSWORD).status_code == 200


@pytest.mark.parametrize("login, refused", [(_page_login, 200), (_token_login, 400)])
def test_a_successful_login_clears_the_failures(client, vic, lockout_only, login, refused):
    below = settings.SEAM_LOGIN_FAILURE_LIMIT - 1
    for n in range(below):
        assert login(client, f"wrong-{n}").status_code == refused
    assert login(client, PASSWORD).status_code in (200, 302)
    client.logout()
    for n in range(below):
        assert login(client, f"again-{n}").status_code == refused
    assert login(client, PASSWORD).status_code in (200, 302)


def test_the_token_endpoint_is_rate_limited_per_address(client, vic, monkeypatch):
    monkeypatch.setattr(ScopedRateThrottle, "THROTTLE_RATES", {"auth-token": "3/min"})
    assert [_token_login(client, PASSWORD).status_code for _ in range(3)] == [200] * 3
    throttled = _token_login(client, PASSWORD)  # the right password: only the rate limit refuses it
    assert throttled.status_code == 429 and "throttled" in throttled.json()["detail"]
    assert int(throttled["Retry-After"]) > 0

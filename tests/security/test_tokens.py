"""API tokens (issue 13, item 5): they expire (SEAM_TOKEN_TTL_S) and are deleted when seen expired, every login
at the token endpoint issues a new one in place of the last, a holder can revoke theirs, and every way of changing
a password drops them — but not Django re-hashing the same password at login. How they are stored (hashed):
test_token_storage.py."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.contrib.auth.forms import AdminPasswordChangeForm
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from console.accounts.models import ApiToken, prefix_of
from console.accounts.tokens import expires_at, issue_token
from console.audit.models import AuditEvent
from tests.support.users import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_throttle_history")]

TOKEN_URL, REVOKE_URL, READ_URL = "/api/v1/auth/token/", "/api/v1/auth/token/revoke/", "/api/v1/jobs/"


def _obtain(username: str = "vic", password: str = PASSWORD) -> dict:
    response = APIClient().post(TOKEN_URL, {"username": username, "password": password}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def _as(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def _stored(key: str):
    return ApiToken.objects.filter(prefix=prefix_of(key))


def _age(key: str, seconds: float) -> None:
    _stored(key).update(created=timezone.now() - dt.timedelta(seconds=seconds))


def _actions(subject: str = "user:vic") -> list[str]:
    return list(AuditEvent.objects.filter(subject=subject).order_by("seq").values_list("action", flat=True))


def test_the_token_answer_says_when_it_expires(vic, settings):
    settings.SEAM_TOKEN_TTL_S = 3600
    body = _obtain()
    token = ApiToken.objects.get(prefix=body["prefix"])
    assert dt.datetime.fromisoformat(body["expires_at"]) == token.created + dt.timedelta(seconds=3600)
    assert _actions() == ["auth.token_issued"]
    assert AuditEvent.objects.get(action="auth.token_issued").payload == {
        "prefix": body["prefix"], "replaced": None, "expires_at": expires_at(token).isoformat()}


def test_an_expired_token_is_refused_with_401_and_deleted(vic, settings):
    key = _obtain()["token"]
    assert _as(key).get(READ_URL).status_code == 200
    _age(key, settings.SEAM_TOKEN_TTL_S + 1)
    refused = _as(key).get(READ_URL)
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Token"
    assert refused.json()["detail"] == "token expired: POST /api/v1/auth/token/ for a new one"
    assert not _stored(key).exists()


def test_each_login_issues_a_new_token_and_the_previous_one_stops_working(vic, settings):
    """The secret is not stored, so it cannot be handed back: a second login replaces the first's live token."""
    first = _obtain()
    _age(first["token"], settings.SEAM_TOKEN_TTL_S - 60)
    second = _obtain()
    assert second["token"] != first["token"] and second["prefix"] != first["prefix"]
    assert _as(first["token"]).get(READ_URL).status_code == 401
    assert _as(second["token"]).get(READ_URL).status_code == 200
    assert list(ApiToken.objects.filter(user=vic).values_list("prefix", flat=True)) == [second["prefix"]]
    issued = AuditEvent.objects.filter(action="auth.token_issued").order_by("seq")
    assert [event.payload["replaced"] for event in issued] == [None, first["prefix"]]


def test_the_token_endpoint_rotates_an_expired_token(vic, settings):
    old = _obtain()["token"]
    _age(old, settings.SEAM_TOKEN_TTL_S + 1)
    new = _obtain()["token"]
    assert new != old and not _stored(old).exists()
    assert _as(new).get(READ_URL).status_code == 200 and _as(old).get(READ_URL).status_code == 401
    issued = AuditEvent.objects.filter(action="auth.token_issued").order_by("seq")
    assert [event.payload["replaced"] for event in issued] == [None, prefix_of(old)]


def test_revoking_ends_the_callers_token_at_once_and_is_audited(vic):
    key = _obtain()["token"]
    response = _as(key).post(REVOKE_URL)
    assert response.status_code == 204 and not _stored(key).exists()
    assert _as(key).get(READ_URL).status_code == 401
    event = AuditEvent.objects.get(action="auth.token_revoked")
    assert event.actor == vic and event.subject == "user:vic"
    assert event.payload == {"tokens": 1, "prefix": prefix_of(key), "reason": "revoked by its user"}
    assert _obtain()["token"] != key  # a new login gets a new one


def test_revoking_needs_a_login(vic):
    assert APIClient().post(REVOKE_URL).status_code == 401
    assert not AuditEvent.objects.filter(action="auth.token_revoked").exists()


def _set_password(user) -> None:
    user.set_password("another-long-password")
    user.save()


def _admin_form(user) -> None:
    form = AdminPasswordChangeForm(user, {"password1": "another-long-password", "password2": "another-long-password"})
    assert form.is_valid(), form.errors
    form.save()


def _changepassword(user, monkeypatch) -> None:
    monkeypatch.setattr("django.contrib.auth.management.commands.changepassword.getpass.getpass",
                        lambda prompt="": "another-long-password")
    call_command("changepassword", user.get_username(), stdout=io.StringIO())


@pytest.mark.parametrize("change", ["set_password", "admin form", "changepassword"])
def test_a_password_change_drops_the_users_token(vic, monkeypatch, change):
    key = _obtain()["token"]
    user = type(vic).objects.get(pk=vic.pk)
    {"set_password": _set_password, "admin form": _admin_form,
     "changepassword": lambda u: _changepassword(u, monkeypatch)}[change](user)
    assert not _stored(key).exists() and _as(key).get(READ_URL).status_code == 401
    event = AuditEvent.objects.get(action="auth.token_revoked")
    assert event.actor is None
    assert event.payload == {"tokens": 1, "prefix": prefix_of(key), "reason": "password changed"}


def test_saving_a_user_without_changing_the_password_keeps_the_token(vic):
    key = _obtain()["token"]
    vic.first_name = "Vic"
    vic.save()
    vic.set_password(PASSWORD)  # the same password, but set again: still a password change (a new salt, a new hash)
    vic.save(update_fields=["first_name"])  # ... that this save does not write
    assert _stored(key).exists()


def test_rehashing_the_same_password_at_login_keeps_the_token(vic, client):
    """Django re-hashes a password stored with outdated parameters when it checks it: not a password change."""
    vic.password = PBKDF2PasswordHasher().encode(PASSWORD, "seamsalt", iterations=1000)
    vic.save()
    key = issue_token(vic).secret
    # The page's login: the token endpoint's would re-hash too, but then replace the token anyway.
    assert client.post("/login/", {"username": "vic", "password": PASSWORD}).status_code == 302
    vic.refresh_from_db()
    assert f"${PBKDF2PasswordHasher.iterations}$" in vic.password
    assert _as(key).get(READ_URL).status_code == 200

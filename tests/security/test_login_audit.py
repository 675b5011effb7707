"""Failed logins and lockouts are in the audit trail (issue 13, item 5): who was tried (as typed), from where,
through which door — never the password; and a login refusal never turns into a traceback when the audit trail
cannot be written."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.core.cache import cache

from console.accounts import signals
from console.api.views import TokenView
from console.audit.models import AuditEvent
from console.audit.services import verify_chain
from tests.support.users import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_throttle_history(monkeypatch):
    cache.clear()
    monkeypatch.setattr(TokenView, "throttle_classes", [])
    yield
    cache.clear()


def _failures(action: str = "auth.login_failed") -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("seq"))


@pytest.mark.parametrize("url, channel, refused", [("/login/", "page", 200), ("/api/v1/auth/token/", "token-api", 400)])
def test_a_wrong_password_is_audited_with_address_and_channel_but_not_the_password(client, vic, url, channel, refused):
    secret = "hunter2-the-guess"
    assert client.post(url, {"username": "vic", "password": secret}, REMOTE_ADDR="192.0.2.7").status_code == refused
    [event] = _failures()
    assert event.actor is None and event.actor_name == "system" and event.subject == "user:vic"
    assert event.payload == {"channel": channel, "ip": "192.0.2.7", "path": url, "locked_out": False}
    assert secret not in json.dumps([event.payload, event.before, event.after, event.subject])
    assert verify_chain().first_broken is None  # every link holds (uncommitted, so never anchored: not "ok")


def test_an_unknown_username_is_audited_as_typed_printable_and_short(client):
    typed = "ro\tot\x1b" + "x" * 140
    assert client.post("/api/v1/auth/token/", {"username": typed, "password": "whatever"}).status_code == 400
    [event] = _failures()
    assert event.subject == "user:ro?ot?" + "x" * 94


def test_a_lockout_is_audited_once_and_each_refusal_while_locked_says_so(client, vic):
    limit = settings.SEAM_LOGIN_FAILURE_LIMIT
    for n in range(limit + 3):
        client.post("/api/v1/auth/token/", {"username": "vic", "password": f"wrong-{n}"})
    client.post("/api/v1/auth/token/", {"username": "vic", "password": PASSWORD})
    [locked] = _failures("auth.locked_out")
    assert locked.subject == "user:vic" and locked.payload["failures"] == limit
    assert locked.payload["channel"] == "token-api" and locked.payload["cooloff_s"] == settings.SEAM_LOGIN_COOLOFF_S
    flags = [event.payload["locked_out"] for event in _failures()]
    assert flags == [False] * (limit - 1) + [True] * 5  # the one that locked, three more, and the right password


@pytest.mark.parametrize("url, refused", [("/login/", 200), ("/api/v1/auth/token/", 400)])
def test_a_failed_audit_write_still_answers_the_refusal_without_a_traceback(client, vic, monkeypatch, caplog, url,
                                                                           refused):
    def broken(**kwargs):
        raise RuntimeError("audit database is gone")

    monkeypatch.setattr(signals, "record", broken)
    response = client.post(url, {"username": "vic", "password": "wrong"})  # the test client re-raises a 500
    assert response.status_code == refused and "Traceback" not in response.content.decode()
    assert "could not audit auth.login_failed for user:vic" in caplog.text

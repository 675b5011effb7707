"""API tokens are stored hashed (issue 30, item 2): another local account that reads the database file finds
prefixes and hashes, never a secret it could send. The secret is shown once, in the answer that issues it; the
prefix names the token afterwards (the audit trail, the admin's list). Plain keys that DRF's authtoken left in an
older database are hashed by a migration and keep working."""

from __future__ import annotations

import datetime as dt
import importlib

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.accounts.models import ApiToken
from console.accounts.tokens import issue_token
from console.audit.models import AuditEvent
from tests.support.users import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_throttle_history")]

TOKEN_URL, READ_URL = "/api/v1/auth/token/", "/api/v1/jobs/"


def _obtain() -> dict:
    response = APIClient().post(TOKEN_URL, {"username": "vic", "password": PASSWORD}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def _read_with(secret: str):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    return client.get(READ_URL)


def _database_text() -> str:
    """Every row of every table, as text: what someone who can read the database file can read."""
    rows = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            rows += [repr(row) for row in cursor.fetchall()]
    return "\n".join(rows)


def test_the_database_holds_no_secret_only_its_prefix(vic):
    """Pins the hashed storage (ApiToken keeps prefix + SHA-256, console.accounts.tokens.issue_token): with DRF's
    plain Token the secret is a column of authtoken_token and this fails."""
    body = _obtain()
    text = _database_text()
    assert body["token"] not in text
    assert body["prefix"] in text and body["token"].startswith(body["prefix"])
    assert _read_with(body["token"]).status_code == 200  # the secret shown once is the one that works


def test_a_wrong_secret_with_a_valid_prefix_is_refused(vic):
    """Pins the hash check in ExpiringTokenAuthentication: the prefix finds the row, only the whole secret
    passes. Without the check, anyone who read a prefix (the audit trail shows them) would be let in."""
    secret = _obtain()["token"]
    forged = secret[:8] + ("A" if secret[8] != "A" else "B") + secret[9:]
    for wrong in (forged, secret[:8], secret + "x"):
        refused = _read_with(wrong)
        assert refused.status_code == 401 and refused.json()["detail"] == "Invalid token.", wrong
    assert _read_with(secret).status_code == 200  # refusals leave the real token as it was


def test_the_audit_trail_names_tokens_by_prefix_never_by_secret(vic):
    body = _obtain()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {body['token']}")
    assert client.post("/api/v1/auth/token/revoke/").status_code == 204
    events = AuditEvent.objects.filter(action__in=["auth.token_issued", "auth.token_revoked"]).order_by("seq")
    assert [event.payload["prefix"] for event in events] == [body["prefix"]] * 2
    assert not any(body["token"] in repr(event.payload) for event in events)


@pytest.fixture
def admin_client(db) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password=PASSWORD))
    return client


def test_the_admin_lists_tokens_by_prefix(vic, admin_client):
    issued = issue_token(vic)
    page = admin_client.get("/admin/accounts/apitoken/").content.decode()
    assert issued.token.prefix in page and "vic" in page and issued.secret not in page
    assert admin_client.get("/admin/accounts/apitoken/add/").status_code == 403  # issued by the token API only


def test_deleting_a_token_in_the_admin_revokes_it_audited(vic, admin_client):
    """Pins ApiTokenAdmin.delete_model: the admin's delete goes through revoke_tokens, so it is recorded."""
    issued = issue_token(vic)
    response = admin_client.post(f"/admin/accounts/apitoken/{issued.token.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not ApiToken.objects.exists()
    assert _read_with(issued.secret).status_code == 401
    event = AuditEvent.objects.get(action="auth.token_revoked")
    assert event.actor.get_username() == "root" and event.subject == "user:vic"
    assert event.payload == {"tokens": 1, "prefix": issued.token.prefix, "reason": "revoked in the admin"}


def test_a_plain_drf_key_left_in_an_older_database_is_hashed_and_keeps_working(vic):
    """Pins migration accounts.0002: DRF's authtoken_token table (the plain keys) is read, each key stored hashed
    with its issue time, and the table dropped with its migration records."""
    migration = importlib.import_module("console.accounts.migrations.0002_hash_drf_tokens")
    key, issued_at = "0123456789abcdef0123456789abcdef01234567", timezone.now() - dt.timedelta(hours=1)
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:  # the table as DRF's migrations made it
        cursor.execute(f"CREATE TABLE {quote('authtoken_token')} ({quote('key')} varchar(40) NOT NULL PRIMARY KEY, "
                       f"{quote('created')} {connection.data_types['DateTimeField']} NOT NULL, "
                       f"{quote('user_id')} integer NOT NULL UNIQUE)")
        cursor.execute(f"INSERT INTO {quote('authtoken_token')} VALUES (%s, %s, %s)",
                       [key, connection.ops.adapt_datetimefield_value(issued_at), vic.pk])
    MigrationRecorder(connection).record_applied("authtoken", "0001_initial")

    assert migration.adopt_legacy_tokens(ApiToken, connection) == 1

    assert "authtoken_token" not in connection.introspection.table_names()
    assert not MigrationRecorder(connection).migration_qs.filter(app="authtoken").exists()
    token = ApiToken.objects.get(user=vic)
    assert token.prefix == key[:8] and token.digest != key
    assert token.created == issued_at  # so its expiry is unchanged
    assert key not in _database_text()
    assert _read_with(key).status_code == 200


def test_a_deactivated_users_token_is_refused(vic):
    """Pins the is_active check ExpiringTokenAuthentication keeps from DRF's: disabling an account ends its API
    access at once, without waiting for the token to expire."""
    secret = _obtain()["token"]
    type(vic).objects.filter(pk=vic.pk).update(is_active=False)
    refused = _read_with(secret)
    assert refused.status_code == 401 and refused.json()["detail"] == "User inactive or deleted."

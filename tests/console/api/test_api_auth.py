import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

PROTECTED_GETS = ["/api/v1/jobs/", "/api/v1/jobs/1/", "/api/v1/audit/", "/api/v1/audit/verify/",
                  "/api/v1/audit/export/", "/api/v1/frontier/", "/api/v1/telemetry/latest/"]
PROTECTED_POSTS = ["/api/v1/jobs/", "/api/v1/jobs/1/approve/", "/api/v1/jobs/1/reject/", "/api/v1/jobs/1/cancel/",
                   "/api/v1/auth/token/revoke/"]


@pytest.fixture(autouse=True)
def no_throttle_history():
    """The token endpoint's rate limit counts in the default cache, which outlives a test: start each one empty."""
    cache.clear()
    yield
    cache.clear()


def test_token_for_username_and_password(client):
    user = get_user_model().objects.create_user("tom", password="s3cret-pass")
    response = client.post("/api/v1/auth/token/", {"username": "tom", "password": "s3cret-pass"})
    assert response.status_code == 200
    body = response.json()
    assert user.api_token.prefix == body["prefix"] == body["token"][:8] and user.api_token.matches(body["token"])
    assert response.json()["expires_at"]  # tests/security/test_tokens.py checks its value


def test_token_refused_for_a_wrong_password(client):
    get_user_model().objects.create_user("tom", password="s3cret-pass")
    response = client.post("/api/v1/auth/token/", {"username": "tom", "password": "nope"})
    assert response.status_code == 400
    assert "credentials" in str(response.json()).lower()


def test_token_authenticates_requests(client, make_user):
    users = [make_user("viewer", name=name) for name in ("tina", "otto")]
    tokens = []
    for user in users:
        user.set_password("pw-123456")
        user.save()
        tokens.append(client.post("/api/v1/auth/token/", {"username": user.username, "password": "pw-123456"})
                      .json()["token"])
    for user, token in zip(users, tokens, strict=True):
        response = APIClient().get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Token {token}")
        assert response.status_code == 200
        assert response.wsgi_request.user == user  # the request ran as the token's own user, no one else


@pytest.mark.parametrize("url", PROTECTED_GETS)
def test_anonymous_reads_are_refused(url):
    response = APIClient().get(url)
    assert response.status_code in (401, 403)
    assert response.json()["detail"]


def test_an_anonymous_request_is_told_to_send_a_token():
    response = APIClient().get("/api/v1/jobs/")
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"


def test_an_unknown_token_is_refused():
    response = APIClient().get("/api/v1/jobs/", HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert response.status_code == 401 and "token" in response.json()["detail"].lower()


@pytest.mark.parametrize("url", PROTECTED_POSTS)
def test_anonymous_writes_are_refused(url):
    response = APIClient().post(url, {}, format="json")
    assert response.status_code in (401, 403)
    assert response.json()["detail"]


def test_a_user_without_a_role_cannot_read(get, make_user):
    body = get("/api/v1/jobs/", user=make_user(), expect=403)
    assert "role" in body["detail"]

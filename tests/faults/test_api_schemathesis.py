"""schemathesis against the console's own OpenAPI schema (served at /api/schema/, read with a login), every
operation, authenticated with a token of a user who is operator and reviewer, with the real test engine behind
ENGINE_URL: no 5xx, every response conforms to the schema (status codes, content types, bodies), a request the
schema allows is accepted and one it forbids is refused."""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient
from schemathesis.specs.openapi.checks import positive_data_acceptance

from console.accounts.models import ApiToken, prefix_of, token_digest
from console.wsgi import application

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


# The fuzzing user's token, stored (hashed) by the api_user fixture in each test's database: schemathesis asks for
# it when it collects the tests, before any fixture has run, so it cannot be one that issue_token draws.
TOKEN = "f" * 43


@pytest.fixture
def api_user(live_engine, make_user):
    user = make_user("viewer", "operator", "reviewer", name="fuzz")
    ApiToken.objects.create(user=user, prefix=prefix_of(TOKEN), digest=token_digest(TOKEN))
    return user


@pytest.fixture
def connection_kept():
    """schemathesis calls the WSGI app itself; like Django's test client, keep the request signals from closing
    the test's database connection (and its transaction) at the end of each request."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


def _served_schema() -> dict:
    """The schema /api/schema/ serves (the same generator and renderer), built without a request; the test
    below checks it is byte for byte what a logged-in client is served."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    return json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))


SERVED = _served_schema()
schema = schemathesis.openapi.from_dict(SERVED)
schema.app = application


@schema.auth()
class TokenAuth:
    """schemathesis sends the token as the API expects it; knowing it, it can also check that requests without
    it are refused (the ignored_auth check)."""

    def get(self, case, context) -> str:
        return TOKEN

    def set(self, case, data: str, context) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Token {data}"}


def test_the_fuzzed_schema_is_the_one_served(api_user):
    client = APIClient()
    client.force_authenticate(api_user)
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200 and response.json() == SERVED


# Operations whose refusals depend on more than the schema can say: a proposal's target must be a plan the engine can
# run (a cut summing to the model's layers) and its not_before in the future; a token request's credentials must
# match a user (DRF answers 400). Every other operation accepts whatever its schema allows (positive_data_acceptance,
# schemathesis' ST202): each limit the server enforces, the schema declares (console/api/query.py).
BEYOND_THE_SCHEMA = {"POST /api/v1/jobs/", "POST /api/v1/auth/token/"}


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_the_api_answers_every_request_as_its_schema_says(case, api_user, connection_kept):
    excluded = [positive_data_acceptance] if case.operation.label in BEYOND_THE_SCHEMA else []
    case.call_and_validate(excluded_checks=excluded)

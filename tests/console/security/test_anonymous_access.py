"""Every route the URL resolver knows, and the websocket, refuses an anonymous visitor.

The routes are enumerated from the resolver, so a page or endpoint added later is covered without editing this
file. Refused means: a redirect to a login page, 401/403, or 405 for a method the route does not take — never
content, and never a server error. Only the login pages themselves are public.
"""

from __future__ import annotations

import re

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve, reverse

from console.asgi import application
from console.live.consumers import CLOSE_UNAUTHENTICATED
from console.live.routing import websocket_urlpatterns
from tests.support.live import TIMEOUT_S, login_headers, run

pytestmark = pytest.mark.django_db

# Public by design: where one logs in (and out), and the API's equivalent (username + password -> token).
PUBLIC = {"login", "logout", "admin:login", "admin:logout", "api-token"}
_GROUP = re.compile(r"\(\?P<(\w+)>((?:[^()]|\([^()]*\))*)\)")


def _sample(regex: str) -> str:
    """A concrete path the regex matches: each named group filled with a value of its kind."""
    def fill(group: re.Match) -> str:
        name, body = group.groups()
        candidates = ["json", ".json"] if name == "format" else ["1", body.split("|")[0]]
        return next(value for value in candidates if re.fullmatch(body, value))
    path = _GROUP.sub(fill, regex)
    path = path.replace("^", "").replace("\\Z", "").replace("$", "").replace("\\.", ".").replace("/?", "/")
    return path


def _routes(patterns=None, prefix: str = "", namespace: str = "") -> list[tuple[str, str]]:
    """(name, path) for every route, nested includes and namespaces followed; CALLBACKS maps each path to the
    view it was made for."""
    found = []
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        regex = _sample(entry.pattern.regex.pattern)
        if isinstance(entry, URLResolver):
            space = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            found += _routes(entry.url_patterns, prefix + regex, space)
        elif isinstance(entry, URLPattern):
            path = "/" + prefix + regex
            CALLBACKS[path] = entry.callback
            found.append((f"{namespace}{entry.name or entry.lookup_str}", path))
    return found


CALLBACKS: dict = {}
ROUTES = sorted(set(_routes()))


def test_the_enumeration_finds_every_kind_of_route():
    paths = {path for _, path in ROUTES}
    assert {"/", "/jobs/", "/jobs/new/", "/jobs/1/", "/frontier/", "/audit/", "/api/v1/jobs/",
            "/api/v1/jobs/1/approve/", "/api/v1/audit/verify/", "/api/schema/", "/admin/"} <= paths
    for name, path in ROUTES:  # each sample path reaches the view it was made for
        assert resolve(path).func is CALLBACKS[path], (name, path, resolve(path))


def _refused(response, login_url: str) -> bool:
    if response.status_code in (301, 302):
        return response["Location"].startswith(login_url)
    return response.status_code in (401, 403, 405)


@pytest.mark.parametrize("name, path", [r for r in ROUTES if r[0] not in PUBLIC], ids=[p for n, p in ROUTES
                                                                                         if n not in PUBLIC])
@pytest.mark.parametrize("method", ["get", "post"])
def test_anonymous_is_refused(name, path, method):
    login_url = reverse("admin:login") if name.startswith("admin:") else reverse(settings.LOGIN_URL)
    response = getattr(Client(), method)(path)
    assert _refused(response, login_url), (method, path, response.status_code, response.content[:300])


def test_the_login_page_is_served_to_anyone_and_a_token_needs_a_password(django_user_model):
    assert Client().get(reverse("login")).status_code == 200
    django_user_model.objects.create_user("tom", password="s3cret-pass")
    refused = Client().post(reverse("api-token"), {"username": "tom", "password": "guess"})
    assert refused.status_code == 400 and "token" not in refused.json()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", websocket_urlpatterns, ids=lambda r: str(r.pattern))
def test_anonymous_websocket_is_closed_with_4401(live_settings, route):
    async def scenario():
        communicator = WebsocketCommunicator(application, "/" + _sample(route.pattern.regex.pattern),
                                             headers=login_headers(user=None))
        connected, _ = await communicator.connect(timeout=TIMEOUT_S)
        assert connected  # accepted so that the browser sees the code, then closed at once
        closed = await communicator.receive_output(timeout=TIMEOUT_S)
        assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}
    run(scenario)

"""/api/docs/: a real API reference (Redoc) inside the console's page, loading only the console's own files."""

import re

import pytest

pytestmark = pytest.mark.django_db


def urls(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]*)"', page)


def test_the_reference_reads_our_schema_and_loads_nothing_from_elsewhere(browse, viewer):
    client = browse(viewer)
    response = client.get("/api/docs/")
    page = response.content.decode()
    assert response.status_code == 200
    assert 'data-schema-url="/api/schema/?format=json"' in page
    assert "http://" not in page and "https://" not in page
    assert all(url.startswith("/") and not url.startswith("//") for url in urls(page)), urls(page)
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', page)
    assert scripts == ["/static/drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js", "/static/js/api_docs.js"]
    for url in scripts + ["/api/schema/?format=json"]:  # every one of them served by the console itself
        assert client.get(url).status_code == 200, url
    assert client.get("/api/schema/?format=json").json()["info"]["title"] == "Seam console API"


def test_the_reference_is_a_console_page_linked_from_the_nav(browse, operator):
    page = browse(operator).get("/").content.decode()
    assert '<a href="/api/docs/">API docs</a>' in page
    docs = browse(operator).get("/api/docs/").content.decode()
    assert 'class="topnav"' in docs and 'data-testid="nav-user"' in docs and "/static/css/seam.css" in docs


def test_the_reference_needs_a_login(client):
    response = client.get("/api/docs/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")

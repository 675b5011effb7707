import re

import pytest
import yaml
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_schema_validates_without_warnings(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    paths = yaml.safe_load(out.read_text())["paths"]
    assert {"/api/v1/jobs/{id}/approve/", "/api/v1/audit/export/", "/api/v1/frontier/"} <= set(paths)


def test_schema_view(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("reader"))
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200 and response.json()["openapi"].startswith("3")


def test_docs_page_is_local(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("reader"))
    page = client.get("/api/docs/").content.decode()
    # "cdn" in a URL, not anywhere: the page's random CSRF token once held those three letters.
    assert "/api/schema/" in page and not re.search(r"//[\w.-]*cdn", page, re.IGNORECASE)
    # Redoc and its start-up script are the console's own static files (tests/console/ui/test_ui_api_docs.py).
    assert all(url.startswith("/") for url in re.findall(r'(?:src|href)="([^"]*)"', page))

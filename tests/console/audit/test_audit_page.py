"""The audit page's Verify shows the chain's verdict and, next to it, whether the trail is anchored."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client

from console.jobs.roles import VIEWER, ensure_roles

pytestmark = pytest.mark.django_db


@pytest.fixture
def page():
    """The audit page after Verify, as a viewer sees it: {testid: (class, text)} for the two verdicts."""
    ensure_roles()
    viewer = get_user_model().objects.create_user("vera")
    viewer.groups.add(Group.objects.get(name=VIEWER))
    client = Client()
    client.force_login(viewer)

    def verify() -> dict[str, tuple[str, str]]:
        html = client.get("/audit/?verify=1").content.decode()
        found = re.findall(r'<p class="([^"]*)" data-testid="(verify-result|verify-anchor)"[^>]*>([^<]+)<', html)
        return {testid: (css, text) for css, testid, text in found}
    return verify


def test_an_anchored_trail_says_so(make_events, page):
    make_events(3)
    assert page() == {"verify-result": ("notice", "ok: 3 events"), "verify-anchor": ("notice", "anchored at event #3")}


def test_a_trail_without_its_anchor_file_is_flagged(make_events, anchor_file, page):
    make_events(3)
    anchor_file.unlink()
    shown = page()
    assert shown["verify-result"][0] == "notice error"
    assert shown["verify-result"][1].startswith("broken after 3 good events: the chain holds keyed events but there is "
                                                "no anchor file at ")
    css, text = shown["verify-anchor"]
    assert css == "notice warn" and text.startswith("NOT anchored (missing): there is no anchor file at ")


def test_a_truncated_trail_is_an_error_naming_the_anchored_event(make_events, page):
    make_events(3)
    with connection.cursor() as cursor:  # the newest event deleted below the ORM
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_auditevent_append_only")
        cursor.execute("DELETE FROM audit_auditevent WHERE seq = 3")
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_auditevent_append_only")
    css, text = page()["verify-result"]
    assert css == "notice error"
    assert text.startswith("broken at event #3 after 2 good events: the anchor file names event #3 but the chain "
                           "ends at #2")

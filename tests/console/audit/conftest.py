"""Fixtures for the audit tests.

Every test anchors into a file of its own (tests/conftest.py sets SEAM_AUDIT_ANCHOR_PATH per test), so an
anchor written by one test never meets another test's database.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from console.audit.services import record


@pytest.fixture
def make_events(django_capture_on_commit_callbacks):
    """make_events(n, actor=None) -> n recorded events; event i has subject "job:i" and payload {"n": i}.

    The on-commit callbacks run as they would after a real commit (a plain django_db test never commits),
    so the events are anchored as in production.
    """
    def make(n: int, actor=None, action: str = "job.propose"):
        with django_capture_on_commit_callbacks(execute=True):
            return [record(actor=actor, action=action, subject=f"job:{i}", payload={"n": i},
                           before={"status": "draft"}, after={"status": "proposed"}) for i in range(1, n + 1)]
    return make


@pytest.fixture
def anchor_file() -> Path:
    """This test's anchor file (it need not exist yet)."""
    return Path(settings.SEAM_AUDIT_ANCHOR_PATH)

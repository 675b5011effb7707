"""Fixtures for the audit tests."""

from __future__ import annotations

import pytest

from console.audit.services import record


@pytest.fixture
def make_events():
    """make_events(n, actor=None) -> n recorded events; event i has subject "job:i" and payload {"n": i}."""
    def make(n: int, actor=None, action: str = "job.propose"):
        return [record(actor=actor, action=action, subject=f"job:{i}", payload={"n": i},
                       before={"status": "draft"}, after={"status": "proposed"}) for i in range(1, n + 1)]
    return make

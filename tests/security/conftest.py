"""tests/security: the control plane as an attacker meets it (issue 13), one test file per concern. The users,
clients, engine and websocket fixtures are tests/support's; this file keeps what only these tests use."""

from __future__ import annotations

import pytest
from django.core.cache import cache


@pytest.fixture
def no_throttle_history():
    """The token endpoint's rate-limit history lives in the default cache: start and end the test with it empty."""
    cache.clear()
    yield
    cache.clear()

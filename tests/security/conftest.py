"""tests/security: the control plane as an attacker meets it (issue 13), one test file per concern.

The console's fixtures are tests/console/security's (users by role, one-line API calls, the shared test engine,
the live tests' websocket settings); they are loaded from there, not copied.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from django.core.cache import cache
from login_users import PASSWORD

_spec = importlib.util.spec_from_file_location(
    "seam_console_security_conftest", Path(__file__).resolve().parents[1] / "console" / "security" / "conftest.py")
_console = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_console)

live_settings = _console.live_settings
demo_checkpoint, engine, live_engine = _console.demo_checkpoint, _console.engine, _console.live_engine
make_user, operator, reviewer, viewer, handoffs = _console.make_user, _console.operator, _console.reviewer, \
    _console.viewer, _console.handoffs
post, get, proposed = _console.post, _console.get, _console.proposed
celery_worker = _console._api._jobs.celery_worker  # the jobs conftest's real Celery worker, as tests/faults takes it


# --- a user who logs in, for the login, lockout and token tests -------------------------------------------------
@pytest.fixture
def vic(make_user):
    """A viewer with a known password (login_users.PASSWORD)."""
    user = make_user("viewer", name="vic")
    user.set_password(PASSWORD)
    user.save()
    return user


@pytest.fixture
def no_throttle_history():
    """The token endpoint's rate-limit history lives in the default cache: start and end the test with it empty."""
    cache.clear()
    yield
    cache.clear()


# --- the real engine's HTTP app in-process, for tests that must see inside a request -------------------------------
@pytest.fixture(scope="session")
def engine_driver(demo_checkpoint):
    """The real driver (one CPU rank, the demo checkpoint) for tests that build the HTTP app in-process
    (engine.service.build_app): they can watch its tokenizer, which an engine in another process would hide."""
    from engine.control.driver import PipelineDriver
    from solvers.rig import load_rig

    driver = PipelineDriver(demo_checkpoint, load_rig("cpu-single"))
    yield driver
    driver.shutdown()

"""The whole suite's setup: the credentials every process it starts shares, a session var folder, and the fixture
plugins of tests/support/ (pytest honours `pytest_plugins` only here, in the root conftest)."""

import atexit
import os
import shutil
import tempfile
import uuid

import pytest

from contracts.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV

# In dependency order (api imports jobs, browser imports stack): a plugin imported before it is registered misses
# pytest's assertion rewriting.
pytest_plugins = [
    "tests.support.engine",
    "tests.support.users",
    "tests.support.jobs",
    "tests.support.api",
    "tests.support.metrics",
    "tests.support.live",
    "tests.support.stack",
    "tests.support.browser",
    "tests.support.webhooks",
]

# The engine services, Celery workers and console stacks the tests start are children of this process: they read
# the control token and approval key from here, so console and engine agree on them (launch/run.py generates
# them for `make run`).
TEST_CONTROL_TOKEN = os.environ.setdefault(CONTROL_TOKEN_ENV, "seam-test-control-token")
TEST_APPROVAL_KEY = os.environ.setdefault(APPROVAL_KEY_ENV, "seam-test-approval-key")

# Audit anchors (console/audit/anchor.py) name a database's newest events, so one must never outlive its database.
# Children this session starts without a var folder of their own (Celery workers on the test database) anchor
# into a session folder, not the checkout's var/, which belongs to `make run`; stacks that get their own
# SEAM_VAR_DIR (tests/e2e) keep theirs.
if "SEAM_VAR_DIR" not in os.environ:
    os.environ["SEAM_VAR_DIR"] = tempfile.mkdtemp(prefix="seam-test-var-")
    atexit.register(shutil.rmtree, os.environ["SEAM_VAR_DIR"], ignore_errors=True)


# Engines started without --state-dir (`engine serve` in a test, a worker's engine) keep their spent-job ledgers
# (engine/control/job_ledger.py) in a session folder, never in the user's ~/.local/state where a later run would find
# them.
if "SEAM_ENGINE_STATE_DIR" not in os.environ:
    os.environ["SEAM_ENGINE_STATE_DIR"] = tempfile.mkdtemp(prefix="seam-test-engine-state-")
    atexit.register(shutil.rmtree, os.environ["SEAM_ENGINE_STATE_DIR"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _audit_anchor_per_test(settings, tmp_path_factory):
    """Each test anchors its audit events in a file of its own: an anchor left by an earlier test, whose events the
    test database has since dropped, would read as a truncated trail."""
    folder = tmp_path_factory.getbasetemp() / "audit-anchors"
    folder.mkdir(exist_ok=True)
    settings.SEAM_AUDIT_ANCHOR_PATH = folder / f"{uuid.uuid4().hex}.jsonl"


@pytest.fixture(autouse=True, scope="session")
def _engine_credentials_in_settings():
    """pytest-django imports console.settings before this module sets the credentials above, so this process's
    console (the worker code tests run in-process) gets them here, as the children get them from the environment."""
    from django.conf import settings

    settings.SEAM_ENGINE_TOKEN, settings.SEAM_APPROVAL_KEY = TEST_CONTROL_TOKEN, TEST_APPROVAL_KEY

"""Shared fixtures for the whole suite."""

import os

from solvers.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV

# The engine services, Celery workers and console stacks the tests start are children of this process: they read
# the control token and approval key from here, so console and engine agree on them (console/run.py generates
# them for `make run`).
TEST_CONTROL_TOKEN = os.environ.setdefault(CONTROL_TOKEN_ENV, "seam-test-control-token")
TEST_APPROVAL_KEY = os.environ.setdefault(APPROVAL_KEY_ENV, "seam-test-approval-key")

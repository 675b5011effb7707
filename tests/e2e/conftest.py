"""Browser tests against the real stack: one `python -m launch` and one Chromium per test module.

Module scope, not session: Playwright keeps an event loop running while it is started, which the rest of the
suite's Django tests must never see, and the stack should not keep eating CPU after the browser tests end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Our helpers, importable by their unique names from these modules and from tests/faults.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_browser import chromium  # noqa: E402
from e2e_stack import running_stack  # noqa: E402


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("e2e-stack")) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched

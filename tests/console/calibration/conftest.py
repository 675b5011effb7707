"""Calibration test fixtures: the job tests' engine, users and handoffs (loaded from their conftest), API and page
clients, and `seed(cut, decode_ms)`, which records a crafted engine measurement (calibration_helpers.py) as the
console would; `dead_engine` points the console at a port nothing listens on, so the running layout comes from the
measurements (or the rig) and no test depends on an engine that happens to be up.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def _load(name: str, folder: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / folder / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The API tests' fixtures (which load the job tests' engine, users and handoffs) and the page tests' client.
_api = _load("seam_api_conftest_for_calibration", "api")
demo_checkpoint, engine, live_engine = _api.demo_checkpoint, _api.engine, _api.live_engine
make_user, operator, reviewer, viewer, handoffs = _api.make_user, _api.operator, _api.reviewer, _api.viewer, \
    _api.handoffs
get = _api.get
browse = _load("seam_ui_conftest_for_calibration", "ui").browse

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_helpers import URL, measurement, state_of  # noqa: E402
from live_service import free_port  # noqa: E402  (put on the path by the jobs conftest)


@pytest.fixture
def seed(db):
    """seed(cut, decode_ms, **measurement kwargs) -> the MeasuredLayout row recorded from it (periodic)."""
    from console.calibration.recording import record
    from contracts.control import EngineState

    def make(cut, decode_ms=None, **kwargs):
        row = record(EngineState.from_dict(state_of(measurement(cut, decode_ms, **kwargs))), "periodic", engine_url=URL)
        assert row is not None
        return row
    return make


@pytest.fixture
def dead_engine(settings):
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"
    return settings.ENGINE_URL

"""Calibration test fixtures: `seed(cut, decode_ms)` records a crafted engine measurement (tests.support.calibration)
as the console would; `dead_engine` points the console at a port nothing listens on, so the running layout comes from
the measurements (or the rig) and no test depends on an engine that happens to be up."""

from __future__ import annotations

import pytest

from tests.support.calibration import URL, measurement, state_of
from tests.support.live_service import free_port


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

"""Calibration test fixtures: `seed(cut, decode_ms)` records a crafted engine measurement (tests.support.calibration)
as the console would; `dead_engine` points the console at a port nothing listens on, so the running layout comes from
the measurements (or the rig) and no test depends on an engine that happens to be up."""

from __future__ import annotations

import pytest

from tests.support.calibration import record_measurement
from tests.support.live_service import free_port


@pytest.fixture
def seed(db):
    """seed(cut, decode_ms, **measurement kwargs) -> the MeasuredLayout row recorded from it (periodic)."""
    return record_measurement


@pytest.fixture
def dead_engine(settings):
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"
    return settings.ENGINE_URL

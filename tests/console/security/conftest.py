"""Security tests reuse the API fixtures (users by role, one-line API calls, the shared test engine) and the live
tests' websocket helpers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "live"))

from live_helpers import live_settings  # noqa: E402, F401

_spec = importlib.util.spec_from_file_location(
    "seam_api_conftest_for_security", Path(__file__).resolve().parents[1] / "api" / "conftest.py")
_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_api)

demo_checkpoint, engine, live_engine = _api.demo_checkpoint, _api.engine, _api.live_engine
make_user, operator, reviewer, viewer, handoffs = _api.make_user, _api.operator, _api.reviewer, _api.viewer, \
    _api.handoffs
post, get, proposed = _api.post, _api.get, _api.proposed

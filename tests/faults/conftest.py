"""Fault and hostile-input tests reuse the console's job and API fixtures (a real engine service, a real Celery
worker on the real Redis broker, users by role, one-line API calls): loaded from their conftests, not copied."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "seam_api_conftest_for_faults", Path(__file__).resolve().parents[1] / "console" / "api" / "conftest.py")
_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_api)

demo_checkpoint, engine, live_engine = _api.demo_checkpoint, _api.engine, _api.live_engine
make_user, operator, reviewer, viewer, handoffs = _api.make_user, _api.operator, _api.reviewer, _api.viewer, \
    _api.handoffs
post, get, proposed = _api.post, _api.get, _api.proposed
celery_worker = _api._jobs.celery_worker

"""The suite's one fixture home: pytest plugins that tests/conftest.py loads once (`pytest_plugins`), and the helper
modules the tests import as `tests.support.<module>`.

Plugins (fixtures):  engine (the demo engine service the run shares), users (console users by role), api (API and
page clients), jobs (job helpers, handoffs, a real Celery worker), live (Redis channel layer and websockets),
stack (`python -m launch`, what `make run` runs), browser (Chromium under Playwright).
Helpers (no fixtures): live_service (an `engine serve` process and its clients), engine_checkpoints, interpret,
moe_layers (engine and kernel tests; no Django, so the GPU machine's runs import them too), calibration, faults,
pages, stack_calibration, solver_factories, held_tokenizer.

A fixture that belongs with none of these (one directory's own: audit events, calibration seeds, fault workers)
stays in that directory's conftest.py.
"""

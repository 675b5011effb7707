# Two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The browser tests drive Debian's Chromium (Playwright's own browser downloads do not work here).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium fonts-liberation

.PHONY: run test e2e screenshots lint bench bench-console clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Seam on one machine: Redis (REDIS_URL, else a private redis-server), the engine with the demo checkpoint
# on the demo rig (or the one SEAM_ENGINE_URL names), the telemetry bridge, a Celery worker, Celery beat and the
# console; Ctrl-C stops all of it (docs/architecture.md §2). LADDER='7,5,4;8,4,4' arms a layout ladder on the demo
# engine; demo traffic is on with the demo engine, TRAFFIC=0 turns it off, TRAFFIC=1 turns it on for any engine.
RUN_FLAGS = $(if $(LADDER),--ladder='$(LADDER)') \
	$(if $(filter 0 no off false,$(TRAFFIC)),--no-demo-traffic,$(if $(TRAFFIC),--demo-traffic))
run: $(STAMP)
	$(PY) -m launch $(RUN_FLAGS)

$(CHROMIUM):
	$(APT_INSTALL) || ($(SUDO) apt-get update && $(APT_INSTALL))

test: $(STAMP) $(CHROMIUM)
	$(PY) -m ruff check .
	$(PY) -m pytest

# The real-browser tests alone (Playwright + Chromium against the stack `make run` starts).
e2e: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest tests/e2e tests/faults/test_redis_restart.py

# docs/img/{dashboard,frontier,job}.png from the real pages, after a reconfiguration driven in the browser.
screenshots: $(STAMP) $(CHROMIUM)
	$(PY) -m tests.e2e.screenshots docs/img

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) benchmarks/frontier.py

# The console under load (needs Redis at 127.0.0.1:6379; uses its database 14): docs/benchmarks.md, "Console load".
bench-console: $(STAMP)
	$(PY) benchmarks/console_load.py

clean:
	rm -rf $(VENV) *.egg-info

# Two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Seam on one machine: Redis (REDIS_URL, else a private redis-server), the engine with the demo checkpoint
# on the demo rig, the telemetry bridge, a Celery worker and the console; Ctrl-C stops all of it.
run: $(STAMP)
	$(PY) -m console.run

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) benchmarks/frontier.py

clean:
	rm -rf $(VENV) *.egg-info

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

DEMO := var/demo-checkpoint

# For now Seam is its planner and a one-rank engine: prepare the console's database, show the demo
# rig's frontier, write the demo checkpoint once and generate from it.
run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) -m solvers rig cpu-demo
	$(PY) -m solvers frontier --rig cpu-demo --model demo-hybrid-16
	test -f $(DEMO)/config.json || $(PY) -m engine make-demo-checkpoint $(DEMO)
	$(PY) -m engine generate --checkpoint $(DEMO) --prompt "The operator" --max-tokens 16 --greedy

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) benchmarks/frontier.py

clean:
	rm -rf $(VENV) *.egg-info

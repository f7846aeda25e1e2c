# Quickstart: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

ENV ?= doom_basic
EXPERIMENT ?= doom_basic
ARGS ?=

.PHONY: venv train test test-fast test-learning test-extras lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

train: $(STAMP)
	$(PY) train.py --env $(ENV) --experiment $(EXPERIMENT) $(ARGS)

# Everything but the learning and extras tiers, on TEST_WORKERS pytest workers (pytest-xdist; about 6
# minutes on 2 cores with 2 workers: the real-process tests wait on timeouts and heartbeats
# as much as they compute). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not learning and not extras" $(ARGS)

# The learning tier: agents on tiny envs that must reach a stated score (about 2 minutes on
# 2 cores). .ci/run runs it after `make test`.
test-learning: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) -m learning $(ARGS)

# The optional integrations end to end (W&B in offline mode, the Hugging Face Hub through a
# local cache, the built wheel installed and run outside the clone): about 3 minutes on 2
# cores. Their fast tests stay in make test and make test-fast. .ci/run runs it too.
test-extras: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) -m extras $(ARGS)

# Unit and in-process tests only: no process started, no training run (under 90 s on 2 cores).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check fastrl envs tests perf train.py enjoy.py

clean:
	rm -rf $(VENV)

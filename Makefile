# Quickstart: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

ENV ?= doom_basic
EXPERIMENT ?= doom_basic
ARGS ?=

.PHONY: venv train test lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

train: $(STAMP)
	$(PY) train.py --env $(ENV) --experiment $(EXPERIMENT) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check fastrl envs tests perf train.py enjoy.py

clean:
	rm -rf $(VENV)

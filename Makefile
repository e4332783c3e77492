# gemini-opstate — the two commands a newcomer runs: `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEPS := pyproject.toml layers/opstate/requirements.txt functions/reconcile/requirements.txt
PIP_FLAGS := --disable-pip-version-check --no-input --quiet

.PHONY: help run test lint typecheck pytest venv bench bench-quick clean

help:
	@echo "make run    - set up .venv if needed, then serve the app on http://127.0.0.1:3000"
	@echo "make test   - set up .venv if needed, then ruff, mypy and the whole pytest suite"
	@echo "make bench  - benchmarks (not part of make test); make bench-quick for a short run"

# The environment: recreated when missing or built by another python, refreshed when the
# dependency files change.
$(STAMP): $(DEPS)
	@if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then \
		rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); \
	fi
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -c layers/opstate/requirements.txt \
		-c functions/reconcile/requirements.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/opstate serve

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy
	@for f in functions/*/app.py; do $(VENV)/bin/mypy --strict --follow-imports=silent "$$f" || exit 1; done

pytest: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

bench: $(STAMP)
	$(PY) benchmarks/run.py

bench-quick: $(STAMP)
	$(PY) benchmarks/run.py --quick

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .aws-sam

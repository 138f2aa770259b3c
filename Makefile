# The two commands a newcomer needs:
#   make demo   set up, then run the whole pipeline on the embedded default
#   make test   set up, then lint, type-check and run every test
# Nothing needs to be installed first but Python 3.11 (no Docker, no services).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,local]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/billing-ledger demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

bench: setup
	$(BIN)/billing-ledger bench ingest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

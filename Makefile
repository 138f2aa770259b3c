# The two commands a newcomer needs:
#   make demo   set up, then run the whole pipeline on the embedded default
#   make test   set up, then lint, type-check, run every test and build the docs
#   make docs   regenerate the reference pages from the code, build the site into site/
#   make mutate mutation testing of domain/ and the money path (charging, Stripe client,
#               webhook handler) against the unit and fast tests (not in test)
# Nothing needs to be installed first but Python 3.11 (no Docker, no services); `make
# test` installs from Debian, when missing, promtool and chromium for the alerting rules'
# and the docs site's tests (infra/debian-packages.sh).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint docs bench mutate clean

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
	bash infra/debian-packages.sh
	$(BIN)/pytest -q
	$(MAKE) docs

# The reference pages are generated from the code (settings, parsers, migrated schema),
# then the site is built with --strict: a broken link or a page missing fails.
docs: setup
	$(BIN)/python -m tools.docs_reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# From scratch each time (mutmut keeps results between runs, which a changed test does not
# reset); 2 workers: the machine is shared. tools/mutation_report.py judges the results.
# mutmut's own output (a progress line redrawn thousands of times) goes to mutants.log,
# whose end is shown when the run fails (a failing clean run says which test failed).
MUTATE_CHILDREN ?= 2

mutate: setup
	rm -rf mutants
	$(BIN)/mutmut run --max-children $(MUTATE_CHILDREN) > mutants.log 2>&1 \
		|| { tail -n 40 mutants.log; exit 1; }
	$(BIN)/python -m tools.mutation_report

bench: setup
	$(BIN)/billing-ledger bench ingest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants site

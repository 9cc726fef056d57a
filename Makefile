# Two entry points for a fresh machine (see README.md):
#   make demo  - create .venv, install, run the main job on the embedded SQLite default
#   make test  - create .venv, install, run lint, types and the whole test suite
# Both create the virtual environment and install themselves when needed.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint campaign bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" sh examples/demo.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Three workers (the suite waits on fsync and subprocesses as much as on the 2 cores);
# a test module, and so a test-owned cluster, stays on one worker.
test: lint
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --durations=20

campaign: $(STAMP)
	$(BIN)/python -m pytest -q -s -m campaign tests

# Every benchmark at reduced size, one table of their SUMMARY lines (bench/all.py).
bench: $(STAMP)
	$(BIN)/python -m bench.all --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache demo-work

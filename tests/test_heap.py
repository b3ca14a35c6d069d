"""Heap tuning for simulator processes (radixsched.sim.heap)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from radixsched.sim.heap import tune_heap


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="mallopt tuning applies to glibc only",
)
def test_tune_heap_takes_effect_on_glibc() -> None:
    # In a child: the setting is process-wide and must not leak into the test session.
    code = "from radixsched.sim.heap import tune_heap; print(tune_heap(), tune_heap())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]  # and idempotent


def test_tune_heap_is_a_no_op_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert tune_heap() is False


def test_paused_gc_pauses_and_restores_even_on_error() -> None:
    import gc

    from radixsched.sim.heap import paused_gc

    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()  # a caller's own pause stays
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_frozen_heap_freezes_then_thaws_but_keeps_a_callers_freeze() -> None:
    import gc

    from radixsched.sim.heap import frozen_heap

    assert gc.get_freeze_count() == 0
    with frozen_heap(None):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        with frozen_heap(None):
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_simulation_leaves_the_collector_as_it_found_it() -> None:
    import gc
    from pathlib import Path

    from radixsched.config import SchedulerConfig
    from radixsched.sim.simulate import simulate
    from radixsched.sim.workloads.load import load_workload

    sample = Path(__file__).resolve().parent / "data" / "mooncake_sample.jsonl"
    w = load_workload(f"mooncake:{sample}", num_requests=20)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    simulate(w, SchedulerConfig(schedule_policy="lpm"), optimal_hit_rate=0.0)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_garbage_is_not_frozen_with_the_heap() -> None:
    # A cycle already unreachable when a run starts is collected before the heap is frozen:
    # frozen, it would outlive the run and then wait in the oldest generation for a full pass
    # (a process simulating again and again grew by gigabytes).
    import gc
    import weakref

    from radixsched.sim.heap import frozen_heap

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.disable()  # only the block may collect it
    try:
        with frozen_heap(None):
            assert gone() is None
    finally:
        gc.enable()


def test_a_small_run_leaves_the_collector_alone() -> None:
    import gc

    from radixsched.sim.heap import FREEZE_MIN_REQUESTS, frozen_heap

    with frozen_heap(FREEZE_MIN_REQUESTS - 1):
        assert gc.get_freeze_count() == 0
    with frozen_heap(FREEZE_MIN_REQUESTS):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0

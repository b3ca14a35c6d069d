"""Which core runs: the accelerated core over the native parts when the extension is built and
on; the reference core, with one notice, when ``RADIXSCHED_NATIVE=0``, when the extension is
missing, and for a policy or an eviction strategy registered from outside the package."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from fakes import FakeRunner
from radixsched import native
from radixsched.cache import RadixCache, TokenAllocator
from radixsched.cache.evict import EVICTION_STRATEGIES
from radixsched.config import SchedulerConfig
from radixsched.native import radix as native_radix
from radixsched.native.build import NativeScheduler, build_scheduler, built_in
from radixsched.native.radix import NativeRadixCache
from radixsched.policies import POLICIES, Policy, register
from radixsched.scheduler import Scheduler


@pytest.fixture
def fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_said", set())


def test_off_switch_selects_the_reference_core_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_notices: None
) -> None:
    monkeypatch.setenv(native.ENV, "0")
    for _ in range(2):
        sched = build_scheduler(SchedulerConfig(), FakeRunner(256), kv_slots=256)
        assert type(sched) is Scheduler and isinstance(sched.cache, RadixCache)
    err = capsys.readouterr().err
    assert err.count("RADIXSCHED_NATIVE=0") == 1 and len(err.splitlines()) == 1
    assert "reference core" in err


def test_a_missing_extension_selects_the_reference_core(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_notices: None
) -> None:
    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setenv(native.LIB_ENV, "/nonexistent/_core.so")
    monkeypatch.setattr(native, "_loaded", [])
    for _ in range(2):
        sched = build_scheduler(SchedulerConfig(), FakeRunner(256), kv_slots=256)
        assert type(sched) is Scheduler and isinstance(sched.cache, RadixCache)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "native core not available" in err


def test_threads_asking_together_load_the_extension_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # (Prompts are built in threads, each of which may be the first to ask for the core.)
    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setattr(native, "_loaded", [])
    loads: list[int] = []
    start = threading.Barrier(4)

    def slow_load() -> None:
        loads.append(1)
        time.sleep(0.05)  # long enough for every other thread to ask meanwhile

    monkeypatch.setattr(native, "_load", slow_load)
    threads = [threading.Thread(target=lambda: (start.wait(), native.core())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == [1] and native._loaded == [None]


@pytest.mark.skipif(native.core() is None, reason="the native core is not built, or is off")
def test_an_eviction_strategy_from_outside_runs_on_the_reference_core(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_notices: None
) -> None:
    monkeypatch.setitem(EVICTION_STRATEGIES, "outside-evict", EVICTION_STRATEGIES["lru"])
    config = SchedulerConfig(radix_eviction_policy="outside-evict")
    for _ in range(2):
        assert type(build_scheduler(config, FakeRunner(256), kv_slots=256)) is Scheduler
    assert capsys.readouterr().err.count("'outside-evict' is not built in") == 1


@pytest.mark.skipif(native.core() is None, reason="the native core is not built, or is off")
def test_built_extension_selects_the_native_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.ENV, raising=False)
    cache = native_radix.make_cache(
        SchedulerConfig(radix_eviction_policy="slru"), TokenAllocator(64)
    )
    assert isinstance(cache, NativeRadixCache) and cache.eviction_policy == "slru"
    sched = build_scheduler(SchedulerConfig(), FakeRunner(256), kv_slots=256)
    assert isinstance(sched, NativeScheduler) and isinstance(sched.cache, NativeRadixCache)


def _outside_key(req: Any, rnd: Any) -> tuple[int]:
    return (0,)


def test_a_policy_from_outside_runs_on_the_reference_core(
    capsys: pytest.CaptureFixture[str], fresh_notices: None
) -> None:
    assert all(built_in(name) for name in POLICIES)
    register(Policy("outside-test-policy", "a test's policy", key=_outside_key))
    try:
        assert not built_in("outside-test-policy")
        config = SchedulerConfig(schedule_policy="outside-test-policy")
        for _ in range(2):
            sched = build_scheduler(config, FakeRunner(256), kv_slots=256)
            assert type(sched) is Scheduler and not isinstance(sched, NativeScheduler)
        err = capsys.readouterr().err
        assert err.count("outside-test-policy") == 1
        if native.core() is not None:
            fast = build_scheduler(SchedulerConfig(), FakeRunner(256), kv_slots=256)
            assert isinstance(fast, NativeScheduler)
    finally:
        del POLICIES.by_name["outside-test-policy"]

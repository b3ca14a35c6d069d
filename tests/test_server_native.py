"""The server's engine builds its scheduler with ``radixsched.native.build.build_scheduler``: the native
core when the extension is on, the reference with ``RADIXSCHED_NATIVE=0``. Over the loop's
thread both serve the same tokens and cached-token counts to requests sharing a prefix, free an
aborted request's KV, report the same gauges and flush the cache the same way.

``sim/preflight.py`` builds the reference ``Scheduler`` only to run a flag combination's checks
early; the last test pins why that is enough: the accelerated core refuses exactly what the
reference refuses, with the same message.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from fakes import FakeRunner
from radixsched import native
from radixsched.config import SchedulerConfig
from radixsched.native.build import NativeScheduler, build_scheduler
from radixsched.native.radix import NativeRadixCache
from radixsched.policies import POLICIES
from radixsched.request import FinishReason, Req, SamplingParams
from radixsched.scheduler import Scheduler
from radixsched.server.build import engine_for_runner
from radixsched.server.loop import EngineLoop, RequestHandle, TokenDelta
from radixsched.server.metrics import PREFIX, parse_counter

needs_native = pytest.mark.skipif(
    native.core() is None, reason="the native core is not built, or is off"
)

SYSTEM = np.arange(1, 41)  # 40 shared tokens: two and a half 16-token pages


def build(page: int) -> EngineLoop:
    runner = FakeRunner(1024, decode_s=0.0)
    config = SchedulerConfig(schedule_policy="lpm", page_size=page)
    return engine_for_runner(runner, config, kv_slots=1000, context_len=1000)


@needs_native
def test_the_servers_scheduler_is_the_native_one() -> None:
    sched = build(1).scheduler
    assert isinstance(sched, NativeScheduler) and isinstance(sched.cache, NativeRadixCache)
    assert type(sched.allocator).__module__ == "radixsched._native._core"


def test_the_off_switch_gives_the_server_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENV, "0")
    assert type(build(1).scheduler) is Scheduler


def test_a_split_role_is_refused_on_either_core() -> None:
    config = SchedulerConfig(disaggregation_mode="prefill")
    with pytest.raises(ValueError, match="needs its own role"):
        engine_for_runner(FakeRunner(256), config, kv_slots=200, context_len=200)


async def finish(handle: RequestHandle) -> tuple[list[int], TokenDelta]:
    """The request's streamed tokens, to the delta that finishes it."""
    assert (await handle.admission()).accepted
    return await finish_rest(handle)


def req(rid: str, tail: list[int], n: int = 5, **kw: Any) -> Req:
    return Req(rid, np.concatenate([SYSTEM, tail]), SamplingParams(max_new_tokens=n, **kw))


def kv_state(s: Scheduler) -> tuple[int, int, int]:
    """(locked tokens, free + evictable slots, capacity)."""
    return (
        s.cache.protected_size(),
        s.allocator.available_size() + s.cache.evictable_size(),
        s.capacity,
    )


def gauges(engine: EngineLoop) -> Any:
    def read(s: Scheduler) -> dict[str, float]:
        assert engine.metrics is not None
        engine.metrics.sync(s)
        text = engine.metrics.render().decode()
        names = ("radix_cache_tokens", "kv_usage", "num_running_requests")
        return {n: parse_counter(text, f"{PREFIX}_{n}") for n in names} | {
            "cache": s.cache.total_size()
        }

    return engine.acall(read)


async def serve(engine: EngineLoop) -> dict[str, Any]:
    """Two requests sharing the system prompt, one after the other; a long one aborted after
    its first tokens; the gauges; a flush; the first prompt again, now uncached."""
    got: dict[str, Any] = {}
    for rid, tail in (("a", [50, 51, 52]), ("b", [60, 61])):
        toks, last = await finish(engine.submit(req(rid, tail)))
        assert last.finish is not None
        got[rid] = (toks, last.finish.cached_tokens, last.finish.reason)
    long = engine.submit(req("long", [70], n=3000, ignore_eos=True))
    assert (await long.admission()).accepted
    assert (await long.next_delta()).token_ids
    engine.abort("long")
    _, last = await finish_rest(long)
    assert last.finish is not None and last.finish.reason is FinishReason.ABORT
    assert last.finish.status_code == 499
    locked, free, capacity = await engine.acall(kv_state)
    assert locked == 0 and free == capacity  # the aborted request's KV is cached, unlocked
    got["gauges"] = g = await gauges(engine)
    assert g["radix_cache_tokens"] == g["cache"] > 0 and g["kv_usage"] == 0.0
    got["flushed"] = await engine.flush_cache()
    assert got["flushed"] == g["cache"]
    assert await engine.acall(lambda s: (s.cache.total_size(), s.allocator.available_size())) == (
        0,
        capacity,
    )
    toks, last = await finish(engine.submit(req("a-again", [50, 51, 52])))
    assert last.finish is not None
    got["a-again"] = (toks, last.finish.cached_tokens)
    return got


async def finish_rest(handle: RequestHandle) -> tuple[list[int], TokenDelta]:
    """The rest of an admitted request's stream."""
    tokens: list[int] = []
    while True:
        delta = await handle.next_delta()
        tokens += delta.token_ids
        if delta.finish is not None:
            return tokens, delta


def run_server(page: int) -> tuple[type, dict[str, Any]]:
    engine = build(page)
    engine.start()
    try:
        got = asyncio.run(serve(engine))
    finally:
        engine.stop()
    engine.scheduler.check_integrity()
    return type(engine.scheduler), got


@needs_native
@pytest.mark.parametrize("page", [1, 16])
def test_serving_is_the_same_on_both_cores(page: int, monkeypatch: pytest.MonkeyPatch) -> None:
    kind, fast = run_server(page)
    assert kind is NativeScheduler
    monkeypatch.setenv(native.ENV, "0")
    kind, ref = run_server(page)
    assert kind is Scheduler
    # How many tokens the aborted request decoded before its abort reached the loop's thread
    # is timing, not the core: the cache it leaves (and the flush) is compared by its bounds.
    for got in (fast, ref):
        gauges, flushed = got.pop("gauges"), got.pop("flushed")
        assert flushed == gauges["cache"] >= SYSTEM.size // page * page
    assert fast == ref
    cached = SYSTEM.size // page * page
    assert fast["a"][1] == 0 and fast["b"][1] == cached
    assert fast["a-again"] == (fast["a"][0], 0)  # the flush emptied the cache


CONFIGS: list[dict[str, Any]] = [
    {},
    {"disable_radix_cache": True},
    {"enable_priority_scheduling": True},
    {"enable_priority_scheduling": True, "disable_radix_cache": True},
    {"enable_mixed_chunk": True, "page_size": 4},
]


@needs_native
@pytest.mark.parametrize("extra", CONFIGS, ids=lambda c: ",".join(c) or "default")
def test_the_native_core_refuses_what_the_reference_refuses(extra: dict[str, Any]) -> None:
    for name in [*POLICIES, "no-such-policy"]:
        config = dataclasses.replace(SchedulerConfig(**extra), schedule_policy=name)
        errors = []
        for accelerate in (True, False):
            try:
                build_scheduler(config, FakeRunner(300), accelerate=accelerate, kv_slots=256)
                errors.append(None)
            except ValueError as e:
                errors.append(str(e))
        assert errors[0] == errors[1], name
        assert name in POLICIES or errors[0] is not None  # an unknown policy is refused

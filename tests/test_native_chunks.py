"""The chunked request's continuation in C++ (``_core.plan_chunk``, ``PrefillRun.chunks``,
``_native/chunks.hpp``): the plan is the Python adder's (``PrefillAdder`` + ``add_chunked_req``
+ ``ChunkPlan.is_middle``) value for value, and a ``NativeScheduler`` whose middle chunks run in
one native call is, step by step, where the reference ``Scheduler`` is after as many forward
passes: several middle chunks in one call, the horizon stopping them, a last chunk ending
them, a continuation stalled for memory, pages of 1, 4 and 16, and configurations the native
call must leave to Python."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import continued_chunk
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.build import build_scheduler
from radixsched.native.scheduler import NativeScheduler
from radixsched.request import Req, SamplingParams
from radixsched.scheduler import Scheduler, StepOutcome
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.runner import CostModelRunner

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


# ---- the plan: the Python adder's, value for value ----------------------------------------------
def _python_plan(
    page: int,
    max_prefill: int,
    chunk: int,
    running: tuple[int, int],
    ratio: float,
    room: tuple[int, int],
    prefix: int,
    fill: int,
) -> tuple[int, int]:
    plan, req = continued_chunk(page, max_prefill, chunk, running, ratio, room, prefix, fill)
    return (1, req.extend_end - prefix) if plan.is_middle else (0, 0)


@settings(max_examples=2000, deadline=None)
@given(
    page=st.sampled_from([1, 4, 16]),
    max_prefill=st.integers(1, 300),
    pages=st.integers(1, 50),
    running=st.tuples(st.integers(0, 400), st.integers(0, 400)),
    ratio=st.sampled_from([0.0, 0.1, 0.7, 1.0, 0.333]),
    room=st.tuples(st.integers(0, 500), st.integers(0, 100)),
    prefix=st.integers(0, 300),
    extra=st.integers(0, 400),
)
def test_the_plan_is_the_python_adders(
    page: int,
    max_prefill: int,
    pages: int,
    running: tuple[int, int],
    ratio: float,
    room: tuple[int, int],
    prefix: int,
    extra: int,
) -> None:
    chunk = pages * page  # the config's: whole pages
    want = _python_plan(page, max_prefill, chunk, running, ratio, room, prefix, prefix + extra)
    lib: Any = core()
    kind, n = lib.plan_chunk(
        page, max_prefill, chunk, *running, ratio, sum(room), prefix, prefix + extra
    )
    assert (kind, n if kind == 1 else 0) == want
    if kind == 1:  # NativeScheduler._native_chunks skips the call below this: it is sound
        assert extra > min(chunk, max_prefill) - page


@pytest.mark.parametrize(
    ("args", "want"),
    [
        # chunk 64, room 1000, nothing running: a middle chunk spending the chunk budget
        ((1, 16384, 64, 0, 0, 0.5, 1000, 0, 500), (1, 64)),
        # the last chunk
        ((1, 16384, 64, 0, 0, 0.5, 1000, 0, 64), (0, 0)),
        # budget left for the queue (the chunk cut by memory: CONTINUE)
        ((1, 16384, 64, 0, 0, 0.5, 40, 0, 500), (0, 40)),
        # no room for a page: a stall
        ((16, 16384, 64, 0, 0, 0.5, 15, 0, 500), (0, 0)),
        # a prefix off the pages: the chunk ends on a page boundary
        ((4, 16384, 16, 0, 0, 0.5, 1000, 6, 500), (1, 14)),
        # the decode reservations above the room: the chunk budget, and the round is out of
        # memory (NO_TOKEN), not a middle chunk
        ((1, 16384, 64, 2000, 0, 0.5, 100, 0, 500), (0, 64)),
        # the prefill budget spent first (OTHER): a middle chunk
        ((1, 50, 64, 0, 0, 0.5, 1000, 0, 500), (1, 64)),
        # a reservation math.floor refuses: Python plans it (and raises)
        ((1, 16384, 64, 0, 1, float("nan"), 100, 0, 500), (2, 0)),
    ],
)
def test_plan_cases(args: tuple[Any, ...], want: tuple[int, int]) -> None:
    lib: Any = core()
    assert lib.plan_chunk(*args) == want


# ---- step by step against the reference scheduler ----------------------------------------------
def _reqs(lengths: list[int], new: list[int], seed: int) -> list[Req]:
    rng = np.random.default_rng(seed)
    return [
        Req(
            f"r{i}",
            rng.integers(0, 1000, n).astype(np.int32),
            SamplingParams(max_new_tokens=m),
            extra_key=None,
            tenant=f"t{i % 2}",
        )
        for i, (n, m) in enumerate(zip(lengths, new, strict=True))
    ]


def _passes(s: Scheduler) -> int:
    return s.stats.prefill_steps + s.stats.decode_steps


def _state(s: Scheduler, reqs: list[Req]) -> Any:
    """Everything but slot numbers (after a decode jump the free list's order differs)."""
    if isinstance(s, NativeScheduler):
        s.sync_running()
    per = [
        (
            r.rid,
            r.prefix_len,
            r.extend_end,
            r.kv_len,
            r.cache_protected_len,
            list(r.output_ids),
            list(r.times.token_times),
            r.times.first_token,
            r.computed_prefill_tokens,
            r.finish,
        )
        for r in reqs
    ]
    chunked = s.chunked_req.rid if s.chunked_req is not None else None
    sizes = (s.allocator.available_size(), s.cache.evictable_size(), s.cache.protected_size())
    batch = ([r.rid for r in s.running], [r.rid for r in s.waiting], s.batch_is_full)
    stats = dataclasses.asdict(s.stats)
    return per, chunked, sizes, batch, stats, s.processed_tokens, s.clock.now(), s.ratio.current


def _align_checkpoint(fast: Scheduler, ref: Scheduler) -> None:
    """A fused run that ends on a continuation that is not a middle chunk has checkpointed the
    last chunk it ran; the reference does so first thing in its next step (``prefill_round``),
    before anything else moves: done here, the states compare."""
    f, r = fast.chunked_req, ref.chunked_req
    if f is not None and r is not None and f.extend_end == f.prefix_len < r.prefix_len:
        pytest.fail("the native core's chunked request is behind the reference's")
    if (
        f is not None
        and r is not None
        and f.extend_end == f.prefix_len
        and r.extend_end > r.prefix_len
    ):
        ref.kv.checkpoint(r, r.extend_end)


class _Spy:
    """The fast scheduler's ``PrefillRun``, its ``chunks`` calls logged: (done, chunks run,
    stopped by the horizon: the next continuation not yet planned)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.log = inner, []

    def run(self, *args: Any) -> Any:
        return self.inner.run(*args)

    def __getattr__(self, name: str) -> Any:  # the rest (the fused prefill step) unlogged
        return getattr(self.inner, name)

    def chunks(self, kv: Any, req: Req, *args: Any) -> Any:
        res = self.inner.chunks(kv, req, *args)
        self.log.append((res[0], res[3], req.extend_end > req.prefix_len))
        return res


class Lockstep:
    """Both cores from the same requests; each fast step is matched by as many reference steps
    as it ran forward passes, then the states compare. Counts what the native core did."""

    def __init__(self, cfg: SchedulerConfig, kv_slots: int, reqs: Any, horizon: Any) -> None:
        def make(accelerate: bool) -> tuple[Scheduler, list[Req]]:
            runner = CostModelRunner(load_cost_model(model="llama-3.1-8b"), seed=7)
            s = build_scheduler(cfg, runner, accelerate=accelerate, kv_slots=kv_slots)
            rs = reqs()
            for k, r in enumerate(rs):
                s.add_request(r, now=0.001 * k)
            return s, rs

        (self.fast, self.fast_reqs), (self.ref, self.ref_reqs) = make(True), make(False)
        assert isinstance(self.fast, NativeScheduler) and not isinstance(self.ref, NativeScheduler)
        self.horizon = horizon  # (now) -> the step's horizon
        spy = _Spy(self.fast.prefill_run)
        self.fast.prefill_run = spy
        self.native: list[tuple[bool, int, bool]] = spy.log  # (done, chunks, horizon-stopped)
        self.outs: list[StepOutcome | None] = []
        self.chunking: list[bool] = []  # a chunked request before each step

    def run(self, steps: int = 400) -> Lockstep:
        for _ in range(steps):
            if self.fast.is_idle and self.ref.is_idle:
                break
            h = self.horizon(self.fast.clock.now())
            self.chunking.append(self.fast.chunked_req is not None)
            out = self.fast.step(h)
            self.outs.append(out)
            self.fast.check_integrity()
            n = max(1, out.num_steps) if out is not None else 1
            for _ in range(n):
                self.ref.step(h)
            assert _passes(self.ref) == _passes(self.fast)
            _align_checkpoint(self.fast, self.ref)
            assert _state(self.fast, self.fast_reqs) == _state(self.ref, self.ref_reqs)
        return self

    def fused(self) -> list[int]:
        """Chunks run by each native call that ran some."""
        return [k for _, k, _ in self.native if k > 0]


def _config(page: int, **kw: Any) -> SchedulerConfig:
    return SchedulerConfig(
        schedule_policy=kw.pop("policy", "fcfs"),
        chunked_prefill_size=16 * page,
        max_prefill_tokens=kw.pop("max_prefill_tokens", 16 * page),
        page_size=page,
        **kw,
    )


def _far(now: float) -> float:
    return now + 100.0


@pytest.mark.parametrize("page", [1, 4, 16])
def test_several_middle_chunks_in_one_call_then_a_last_one(page: int) -> None:
    """A prompt of many chunks alone: one native call runs its middle chunks, the last
    chunk's continuation ends the call (its extend_end back at prefix_len), then Python."""
    n = 16 * page * 9 + 5 * page + 3  # eight middle chunks after the first, a short last one
    run = Lockstep(_config(page), 8192 * page, lambda: _reqs([n, 30], [4, 3], 1), _far).run()
    assert max(run.fused()) >= 6
    ended = [(done, k) for done, k, stopped in run.native if k > 0 and not stopped]
    assert (True, max(run.fused())) in ended  # ended by a continuation that is not a middle one


@pytest.mark.parametrize("page", [1, 4, 16])
def test_the_horizon_stops_the_call(page: int) -> None:
    """A horizon a little past now: each call runs a chunk or two and stops with the next
    continuation unplanned (extend_end ahead of prefix_len, checkpointed next step)."""
    n = 16 * page * 12
    run = Lockstep(
        _config(page), 8192 * page, lambda: _reqs([n, 40, 50], [3, 5, 2], 2), lambda t: t + 0.03
    ).run()
    stopped = [k for done, k, s in run.native if done and s]
    assert stopped and max(stopped) >= 2  # several chunks, then the horizon
    assert sum(run.fused()) >= 8


@pytest.mark.parametrize("page", [1, 16])
def test_no_horizon_runs_one_chunk(page: int) -> None:
    run = Lockstep(
        _config(page), 8192 * page, lambda: _reqs([16 * page * 6], [2], 3), lambda t: None
    ).run()
    assert run.fused() and set(run.fused()) == {1}


@pytest.mark.parametrize("page", [4, 16])
def test_a_continuation_without_room_for_a_page_stalls(page: int) -> None:
    """Decoding requests hold nearly all memory: the continuation gets less than a page, the
    native call hands it to Python untouched (which stalls it), until memory frees up."""
    slots = 64 * page
    long = 44 * page
    run = Lockstep(
        _config(page),
        slots,
        lambda: _reqs([12 * page, 12 * page, long], [8 * page, 6 * page, 2], 4),
        _far,
    ).run()
    stalls = [
        c
        for o, c in zip(run.outs, run.chunking, strict=True)
        if c and (o is None or o.mode == "decode")
    ]
    assert run.fused() and len(stalls) >= 2  # steps with a chunked request and no prefill
    assert any(not done and k == 0 for done, k, _ in run.native)  # the stall: Python's


@pytest.mark.parametrize(
    "kw",
    [
        {"policy": "shortest-prefill-first"},  # a chunk limit: no fused chunks
        {"compat": "sglang"},  # SGLang's order of operations: no fused chunks
        {"enable_mixed_chunk": True},  # decode tokens in prefill batches: no fused chunks
    ],
)
def test_where_the_native_call_must_not_run(kw: dict[str, Any]) -> None:
    run = Lockstep(_config(4, **kw), 8192, lambda: _reqs([16 * 4 * 8, 40], [3, 3], 5), _far).run()
    assert run.native == []
    assert run.fast.stats.prefill_steps >= 9


def test_a_charging_policys_chunks_run_natively() -> None:
    """fair's middle chunks run in the native call too (its tenant charged after it), in
    lockstep with the reference."""
    cfg = _config(4, policy="fair")
    run = Lockstep(cfg, 8192, lambda: _reqs([16 * 4 * 8, 40], [3, 3], 5), _far).run()
    assert any(k > 0 for _, k, _ in run.native)


class _HandsBack(_Spy):
    """A native run that stops inside the run after its first chunk (as one that meets a chunk
    it cannot run does: past its horizon check, that chunk checkpointed by the next plan) and
    hands the rest to Python."""

    def chunks(self, kv: Any, req: Req, *args: Any) -> Any:
        sched, horizon = args[1], args[2]
        done, d, tokens, k = self.inner.chunks(kv, req, args[0], sched, None, *args[3:])
        if k == 0 or not (
            horizon is not None and sched.clock.now() < horizon and sched.chunked_req
        ):
            return done, d, tokens, k
        self.log.append((False, k, True))
        return False, d, tokens, k


@pytest.mark.parametrize("page", [1, 16])
def test_python_goes_on_where_a_native_run_stopped(page: int) -> None:
    """After a native run that stopped inside the run, Python runs the rest of the run of
    middle chunks (and ends it at a continuation that is not one) within the same step: the
    schedule stays the reference's."""
    n = 16 * page * 9 + 5 * page + 3
    run = Lockstep(_config(page), 8192 * page, lambda: _reqs([n, 30], [4, 3], 1), _far)
    run.fast.prefill_run = _HandsBack(run.fast.prefill_run.inner)
    run.native = run.fast.prefill_run.log
    run.run()
    handed = [k for done, k, _ in run.native if not done]
    assert handed  # the hand-back happened ...
    assert max(out.num_steps for out in run.outs if out is not None) >= 6  # ... and Python went on

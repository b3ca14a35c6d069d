"""The accelerators (``radixsched.native``) against the reference core, bit for bit.

Every golden case (``tests/golden.py``: every policy x both compat modes x page sizes 1 and 16
over distinct first blocks, one shared first block, multi-turn, tree-of-thought, few-shot,
bursts and random lengths, with chunking, retraction, priorities, mixed chunks, host tier,
several replicas and dp-attention lockstep) runs here on the reference core
(``accelerate=False``): it must give what the accelerated core gave when the case was
recorded, and ``tests/test_golden.py`` checks the accelerated core against the same record.
More shapes run both cores side by side, with integrity checks after every step of the
accelerated run, and each accelerator is shown to fire (a test that cannot fail proves
nothing).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import golden
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native import scheduler as fast_scheduler
from radixsched.native.matching import NativeMatcher
from radixsched.native.orders import Engine
from radixsched.native.queue import NativeWaitingQueue
from radixsched.request import Req, SamplingParams
from radixsched.sim.deploy import replicas
from radixsched.sim.deploy.run import SimRun
from radixsched.sim.settings.engine_modes import scheduler_defaults
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload
from simcases import random_lengths

RECORDED: dict[str, Any] = json.loads(golden.GOLDEN.read_text())
CASES = {c.name: c for c in golden.cases()}
NO_NATIVE = "the accelerated core runs over the native core, which is not built or is off"


def _run(w: Workload, accelerate: bool, sched: dict[str, Any], sim: dict[str, Any]) -> SimRun:
    if accelerate and core() is None:  # build_scheduler would give the reference: no comparison
        pytest.skip(NO_NATIVE)
    # Integrity checks walk the whole pool: after every step of the small pools only.
    small = sim.get("max_total_tokens", 1 << 30) <= 12_000
    return simulate(
        w,
        SchedulerConfig(**sched),
        SimConfig(**sim),
        accelerate=accelerate,
        check_integrity=accelerate and small,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_core_gives_the_recorded_schedule(name: str) -> None:
    case = CASES[name]
    run = simulate(
        golden._load(case.workload),
        SchedulerConfig(**case.sched),
        SimConfig(**case.sim),
        accelerate=False,
    )
    got, want = golden.observe(run), RECORDED[name]
    assert got["finished"] == want["finished"]
    assert golden.same_as_recorded(got, want)
    assert got["replicas"] == want["replicas"]
    assert got["lockstep"] == want["lockstep"]
    assert got["trace"] == want["trace"], "per-request tokens or times differ"


# ---- more shapes, both cores side by side ------------------------------------------------------

AGENTIC = (
    "multi-turn:conversations=4,turns=8,first_len=1500,turn_len=200,output_len=64,think_time_s=0.05"
)


def _with_stops(w: Workload, every: int = 1) -> Workload:
    """Every ``every``-th request may stop early (stop id 7); every third one's scripted output
    reaches it after a few tokens, so requests end mid-way through what a jump would cover."""
    reqs = []
    for i, r in enumerate(w.requests):
        if i % every:
            reqs.append(r)
            continue
        n = r.sampling.max_new_tokens
        out = np.arange(100, 100 + n, dtype=np.int32)
        if i % 3 == 0:
            out[(i % (n - 6)) + 5] = 7
        sampling = dataclasses.replace(r.sampling, stop_token_ids=(7,))
        reqs.append(dataclasses.replace(r, sampling=sampling, scripted_output=out))
    return dataclasses.replace(w, requests=reqs)


def _mixed_sizes() -> Workload:
    """Long and short prompts in a tight pool: a long head waits for room while short arrivals
    could be admitted past it (the policies that do not serve in arrival order)."""
    rng = np.random.default_rng(3)
    reqs = []
    t = 0.0
    for i in range(60):
        t += float(rng.exponential(1 / 30))
        n = 2500 if i % 4 == 0 else int(rng.integers(20, 200))
        prompt = rng.integers(0, 32_000, n).astype(np.int32)
        r = Req(f"m{i}", prompt, SamplingParams(max_new_tokens=int(rng.integers(20, 300))))
        r.arrival_time = r.times.arrival = t
        reqs.append(r)
    return Workload("mixed-sizes", {}, reqs, has_timestamps=True, arrivals="poisson 30/s")


def _short_behind_long() -> Workload:
    """Long and one-to-three-token outputs in a tight pool: a replica's short request may wait
    behind its long ones, and finishes soonest once admitted."""
    rng = np.random.default_rng(5)
    reqs = []
    for i in range(48):
        prompt = rng.integers(0, 3, int(rng.integers(100, 700))).astype(np.int32)
        n = int(rng.integers(1, 4)) if i % 3 == 2 else int(rng.integers(150, 260))
        reqs.append(Req(f"s{i}", prompt, SamplingParams(max_new_tokens=n)))
    return Workload("short-behind-long", {}, reqs, has_timestamps=True, arrivals="all at 0")


def _tenants(w: Workload, n: int) -> Workload:
    reqs = [dataclasses.replace(r, tenant=f"t{i % n}") for i, r in enumerate(w.requests)]
    return dataclasses.replace(w, requests=reqs)


SIDE_BY_SIDE: dict[str, tuple[Callable[[], Workload], dict[str, Any], dict[str, Any]]] = {
    # Deep shared prefixes (agents): every turn extends the last, under retraction.
    "agentic": (lambda: load_workload(AGENTIC, request_rate=40.0), {}, {"max_total_tokens": 9000}),
    "agentic-p16-chunked": (
        lambda: load_workload(AGENTIC, request_rate=40.0),
        {"page_size": 16, "chunked_prefill_size": 256},
        {"max_total_tokens": 9000},
    ),
    # Hits in whole 16-token blocks over 4-token pages: every admission cuts its match.
    "agentic-p4-blocks16": (
        lambda: load_workload(AGENTIC, request_rate=40.0),
        {"page_size": 4, "cache_block_size": 16, "chunked_prefill_size": 256},
        {"max_total_tokens": 9000},
    ),
    # Requests that stop early on a stop id: no decode jump may run past one.
    "stop-tokens": (
        lambda: _with_stops(
            load_workload(
                "shared-prefix:groups=4,prompts=6,system_len=256,question_len=32,output_len=48",
                request_rate=30.0,
            )
        ),
        {},
        {"max_total_tokens": 6000},
    ),
    # Long outputs in a tight pool, with the admission budget's per-request clip below them.
    "long-outputs-tight": (
        lambda: load_workload(
            "shared-prefix:groups=4,prompts=8,system_len=512,question_len=64,output_len=400",
            request_rate=20.0,
        ),
        {"clip_max_new_tokens": 64},  # the budget counts at most 64 tokens of each request
        {"max_total_tokens": 8000},
    ),
    "mixed-sizes-tight": (_mixed_sizes, {}, {"max_total_tokens": 6000}),
    # One shared first block for every request, the whole sample.
    "shared-block-all": (
        lambda: load_workload(f"mooncake:{golden._shared_block_trace(200)}", num_requests=120),
        {"chunked_prefill_size": 2048},
        {"max_total_tokens": 120_000},
    ),
    "3-tenants": (
        lambda: _tenants(golden._load("shared-block"), 3),
        {"chunked_prefill_size": 2048},
        {"max_total_tokens": 50_000},
    ),
    # dp-attention lockstep with the prefill delayer and prompts longer than the chunk.
    "lockstep-chunked-delayer": (
        lambda: load_workload(
            "shared-prefix:groups=4,prompts=4,system_len=2048,question_len=128,output_len=32",
            request_rate=8.0,
        ),
        {"chunked_prefill_size": 512},
        {
            "dp": 2,
            "enable_dp_attention": True,
            "enable_prefill_delayer": True,
            "max_total_tokens": 12_000,
        },
    ),
    # Replicas whose batches are full behind a waiting request: a decode jump must still stop
    # at the next arrival, where the router reads every replica's load.
    "replicas-full-batch": (
        lambda: random_lengths(0, 15),
        {"chunked_prefill_size": None},
        {"max_total_tokens": 1500, "dp": 2, "router": "cache-aware"},
    ),
    # Closed-loop clients over two replicas: a request finishing on one sends the next, which
    # may go to the other; no jump may run past the soonest such arrival.
    "replicas-closed-loop": (
        lambda: random_lengths(2, 12),
        {"chunked_prefill_size": None},
        {"max_total_tokens": 1500, "dp": 2, "router": "round-robin", "max_concurrency": 3},
    ),
    # The same over three replicas with a client latency and long outputs: a replica jumps
    # until the soonest another could finish a request (its tokens to go, each step at least
    # the cost model's floor) plus the latency, not a step or two.
    "replicas-closed-loop-lookahead": (
        lambda: load_workload(
            "shared-prefix:groups=4,prompts=8,system_len=256,question_len=48,output_len=120",
            request_rate=50.0,
        ),
        {},
        {
            "max_total_tokens": 4000,
            "dp": 3,
            "router": "cache-aware",
            "max_concurrency": 7,
            "request_latency_ms": 3.0,
        },
    ),
    # Closed loop where a replica's waiting request would finish before its running ones.
    "replicas-closed-loop-short-waiting": (
        _short_behind_long,
        {},
        {"max_total_tokens": 2500, "dp": 2, "router": "round-robin", "max_concurrency": 8},
    ),
    # Closed loop where the requests a stop id may end early go to one replica (round robin,
    # even ones): the other, which jumps, may look no further ahead than that one's next step.
    "replicas-closed-loop-stops": (
        lambda: _with_stops(
            load_workload(
                "shared-prefix:groups=4,prompts=6,system_len=256,question_len=32,output_len=48",
                request_rate=30.0,
            ),
            every=2,
        ),
        {},
        {"max_total_tokens": 6000, "dp": 2, "router": "round-robin", "max_concurrency": 2},
    ),
    # A MoE model: no native decode step (``DecodeCost`` is the dense roofline's), so the jump
    # times its steps through the runner's ``decode_durations``.
    "moe-runner-timed": (
        lambda: load_workload(
            "shared-prefix:groups=4,prompts=6,system_len=256,question_len=32,output_len=160",
            request_rate=30.0,
        ),
        {},
        {"max_total_tokens": 6000, "model": "mixtral-8x7b", "tp": 2},
    ),
    # Per-entry scheduler time, a prefill efficiency knee and tensor parallelism: every term
    # of the native decode step that depends on the batch size.
    "dense-tp2-batch-terms": (
        lambda: load_workload(
            "shared-prefix:groups=4,prompts=6,system_len=256,question_len=32,output_len=160",
            request_rate=30.0,
        ),
        {},
        {
            "max_total_tokens": 6000,
            "tp": 2,
            "sched_per_req_ms": 0.013,
            "sched_step_ms": 0.4,
            "prefill_eff_tokens": 37.5,
        },
    ),
}
# ``--engine-mode vllm``'s scheduler settings (mixed steps, admission on the prompt alone,
# newest-first recompute preemption), in pools tight enough to preempt.
_VLLM = scheduler_defaults("vllm", set(), "A100")  # 256 running requests at most
SIDE_BY_SIDE["vllm-mode-preempt"] = (
    lambda: load_workload(
        "shared-prefix:groups=4,prompts=8,system_len=512,question_len=64,output_len=400",
        request_rate=200.0,
    ),
    {**_VLLM, "chunked_prefill_size": 1024, "max_prefill_tokens": 1024, "clip_max_new_tokens": 16},
    {"max_total_tokens": 5000, "engine_mode": "vllm"},
)
SIDE_BY_SIDE["vllm-mode-agentic"] = (
    lambda: load_workload(AGENTIC, request_rate=40.0),
    {**_VLLM, "chunked_prefill_size": 512, "max_prefill_tokens": 512},
    {"max_total_tokens": 9000, "engine_mode": "vllm"},
)
SIDE_POLICIES = ("fcfs", "lpm", "dfs-weight", "hrrn", "shortest-prefill-first", "fair", "random")


@pytest.mark.parametrize("policy", SIDE_POLICIES)
@pytest.mark.parametrize("shape", sorted(SIDE_BY_SIDE))
def test_accelerated_equals_reference(shape: str, policy: str) -> None:
    build, sched, sim = SIDE_BY_SIDE[shape]
    w = build()
    sched = {"schedule_policy": policy, **sched}
    fast, ref = _run(w, True, sched, sim), _run(w, False, sched, sim)
    a, b = golden.observe(fast), golden.observe(ref)
    assert a["finished"] == b["finished"] == len(w.requests)
    assert golden.comparable(a) == golden.comparable(b)
    assert a["replicas"] == b["replicas"] and a["lockstep"] == b["lockstep"]
    assert a["trace"] == b["trace"]


def test_vllm_mode_preempts_the_newest_request_in_both_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The vllm shapes do preempt (a shape that never does would prove nothing), and in both
    cores each step's first victim is the request that joined the running batch last."""
    from radixsched.scheduler import Scheduler

    checked: list[bool] = []
    orig = Scheduler._make_room_for_decode

    def spy(self: Any) -> list[Req]:
        reqs = self.batch.reqs
        newest = reqs[-1] if reqs and self.chunked_req is None else None
        out: list[Req] = orig(self)
        if out and newest is not None:
            checked.append(out[0] is newest)
        return out

    monkeypatch.setattr(Scheduler, "_make_room_for_decode", spy)
    build, sched, sim = SIDE_BY_SIDE["vllm-mode-preempt"]
    w = build()
    for accelerate in (True, False):
        checked.clear()
        _run(w, accelerate, {"schedule_policy": "fcfs", **sched}, sim)
        assert checked and all(checked), (accelerate, checked)


def test_lockstep_with_chunks_longer_prompts_and_the_delayer_completes() -> None:
    """The crash of release 0.1.0 (middle-chunk fusion skipped the delayer's collective)."""
    build, sched, sim = SIDE_BY_SIDE["lockstep-chunked-delayer"]
    w = build()
    assert min(r.prompt_len for r in w.requests) > sched["chunked_prefill_size"]
    run = _run(w, True, sched, sim)
    assert run.result.num_completed == 16
    assert run.lockstep is not None and run.lockstep.prefill_passes > 0


def test_the_router_sees_the_same_loads_from_both_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode jump ran past the next arrival when a request waited behind a full batch: the
    router then read a replica whose running requests had already finished."""
    seen: list[Any] = []

    def spy(rep: Any) -> Any:
        seen.append(load(rep))
        return seen[-1]

    load = replicas.replica_load
    monkeypatch.setattr(replicas, "replica_load", spy)
    build, sched, sim = SIDE_BY_SIDE["replicas-full-batch"]
    w = build()
    loads = []
    for accelerate in (True, False):
        seen.clear()
        _run(w, accelerate, {"schedule_policy": "fcfs", **sched}, sim)
        loads.append(list(seen))
    assert len(loads[0]) == 2 * len(w.requests)
    assert loads[0] == loads[1]


# ---- each accelerator fires ----------------------------------------------------------------------


@contextmanager
def _count(cls: Any, name: str) -> Iterator[list[Any]]:
    calls: list[Any] = []
    orig = getattr(cls, name)

    def counting(self: Any, *a: Any, **kw: Any) -> Any:
        out = orig(self, *a, **kw)
        calls.append(out)
        return out

    setattr(cls, name, counting)
    try:
        yield calls
    finally:
        setattr(cls, name, orig)


def _shared_block(policy: str, **sched: Any) -> SimRun:
    w = golden._load("shared-block")
    return _run(
        w,
        True,
        {"schedule_policy": policy, "chunked_prefill_size": 2048, **sched},
        {"max_total_tokens": 50_000},
    )


def test_matcher_rematches_only_what_moved_under_a_shared_system_prompt() -> None:
    """Every request shares its first block: a round re-matches a few requests, not all (the
    native round's sync adds those whose match moved to the ``moved`` it is handed)."""
    moved: list[int] = []
    orig = NativeMatcher.round

    def counting(self: NativeMatcher, queue: Any, added: Any, now: Any, *a: Any, **kw: Any) -> Any:
        out = orig(self, queue, added, now, *a, **kw)
        moved.append(len(now))
        return out

    with _count(NativeWaitingQueue, "begin_round") as rounds:
        NativeMatcher.round = counting  # type: ignore[method-assign]
        try:
            run = _shared_block("lpm")
        finally:
            NativeMatcher.round = orig  # type: ignore[method-assign]
    waiting = run.result.peak_queue_len
    assert len(rounds) > 20 and waiting > 10 and len(moved) == len(rounds)
    assert sum(moved) < 0.2 * len(rounds) * waiting


@pytest.mark.parametrize("policy", ["lpm", "hrrn", "dfs-weight", "fair", "shortest-prefill-first"])
def test_kept_orders_advance_rather_than_rebuild(policy: str) -> None:
    engine_cls = {
        "lpm": "KeyedEngine",
        "shortest-prefill-first": "KeyedEngine",
        "hrrn": "HrrnEngine",
        "dfs-weight": "DfsWeightEngine",
        "fair": "FairEngine",
    }[policy]
    from radixsched.native import orders

    cls = getattr(orders, engine_cls)
    assert issubclass(cls, Engine)
    with (
        _count(cls, "advance") as adv,
        _count(cls, "rebuild") as reb,
        _count(NativeMatcher, "round") as rounds,
    ):
        _shared_block(policy)
    native = [done for _, _, done in rounds if done]  # lpm's order advanced in the native round
    assert len(adv) + len(native) > 3 * len(reb) > 0


def test_decode_jumps_and_fused_chunks_fire() -> None:
    sched = fast_scheduler.NativeScheduler
    with _count(sched, "_jump") as multi, _count(sched, "_native_chunks") as fused:
        run = _shared_block("lpm")
    assert any(out is not None and out.num_steps > 1 for out in multi), "no decode jump"
    chunks = [done for done in fused if done]  # native calls that ran middle chunks
    assert len(chunks) > 0, "no fused middle chunk"
    assert run.result.num_completed > 0.9 * run.result.num_requests


@pytest.mark.parametrize("shape", ["vllm-mode-agentic", "agentic-p4-blocks16"])
def test_block_hits_are_cut_in_the_block_shapes(shape: str) -> None:
    """The block shapes do cut matches (a shape whose hits all fell on block edges would prove
    nothing): every hit is whole blocks, and fewer tokens hit than with token-granular hits."""
    build, sched, sim = SIDE_BY_SIDE[shape]
    w = build()
    blocks = _run(w, False, {"schedule_policy": "fcfs", **sched}, sim)
    tokens = _run(w, False, {"schedule_policy": "fcfs", **sched, "cache_block_size": 1}, sim)
    block = sched["cache_block_size"]
    assert all(r.cached_tokens % block == 0 for r in blocks.requests)
    hits = sum(r.cached_tokens for r in blocks.requests)
    assert 0 < hits < sum(r.cached_tokens for r in tokens.requests)

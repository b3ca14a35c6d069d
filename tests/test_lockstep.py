"""Lockstep data-parallel attention (``sim.lockstep``) and the prefill delayer in the simulator."""

from __future__ import annotations

import bisect
import dataclasses
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixsched.clock import VirtualClock
from radixsched.cluster.delayer import DelayReason, PrefillDelayer
from radixsched.config import SchedulerConfig
from radixsched.request import FinishReason, Req, SamplingParams
from radixsched.results.series import TimeSeries
from radixsched.scheduler import Scheduler
from radixsched.sim.cost.build import build_cost_model
from radixsched.sim.deploy.lockstep import (
    LockstepGates,
    LockstepStats,
    _GateRecorder,
    delayer_config,
    lockstep_gates,
    run_lockstep,
)
from radixsched.sim.deploy.replicas import _build_replica
from radixsched.sim.deploy.run import SimRun
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.simulate import simulate
from radixsched.sim.workloads.load import Workload, load_workload

# Small enough for check_integrity on every pass; busy enough that ranks prefill at
# different times when nothing aligns them.
SMALL = "shared-prefix:groups=4,prompts=6,system_len=512,question_len=64,output_len=12"
# The delayer comparison: four busy ranks fed round-robin.
BUSY = "shared-prefix:groups=16,prompts=8,system_len=1024,question_len=256,output_len=64"


@cache
def _workload(spec: str, rate: float) -> Workload:
    return load_workload(spec, request_rate=rate, seed=0)


def _lockstep(
    spec: str = SMALL,
    rate: float = 40.0,
    *,
    compat: str = "radixsched",
    check: bool = False,
    **sim: Any,
) -> SimRun:
    base: dict[str, Any] = {
        "dp": 3,
        "router": "round-robin",
        "max_total_tokens": 8000,
        "enable_dp_attention": True,
    }
    base.update(sim)
    return simulate(
        _workload(spec, rate),
        SchedulerConfig(compat=compat),  # type: ignore[arg-type]
        SimConfig(**base),
        check_integrity=check,
    )


def _stats(run: SimRun) -> LockstepStats:
    assert run.lockstep is not None
    return run.lockstep


def _fingerprint(run: SimRun) -> list[tuple[str, list[int], list[float], int]]:
    return [
        (r.rid, list(r.output_ids), list(r.times.token_times), run.replica_of[r.rid])
        for r in run.requests
    ]


def _json_without_wall(run: SimRun) -> dict[str, Any]:
    data = run.result.to_json()
    for k in ("wall_s", "requests_per_wall_s"):
        data.pop(k, None)
    return data


# ---- completion, invariants, determinism --------------------------------------------------


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
@pytest.mark.parametrize("delayer", [True, False])
def test_lockstep_completes_with_integrity_and_is_deterministic(compat: str, delayer: bool) -> None:
    a = _lockstep(compat=compat, check=True, enable_prefill_delayer=delayer)
    b = _lockstep(compat=compat, check=False, enable_prefill_delayer=delayer)
    assert all(r.finish is not None and r.finish.reason is FinishReason.LENGTH for r in a.requests)
    assert all(r.output_len == r.sampling.max_new_tokens for r in a.requests)
    assert sum(s.num_requests for s in a.replicas) == len(a.requests)
    assert _fingerprint(a) == _fingerprint(b)
    assert _json_without_wall(a) == _json_without_wall(b)
    st_ = _stats(a)
    assert a.result.to_json()["lockstep"] == st_.to_json()
    if delayer:
        # One negotiated verdict per pass.
        assert sum(st_.verdicts.values()) == st_.passes
    else:
        assert not st_.verdicts and st_.delayed_passes == 0


def test_tokens_leave_at_the_pass_end_and_accounting_adds_up() -> None:
    run = _lockstep(enable_prefill_delayer=True)
    st_ = _stats(run)
    ends = set(st_.log.end)
    for r in run.requests:
        assert set(r.times.token_times) <= ends
        assert r.times.first_token in ends and r.times.finish in ends
    starts, stops = np.array(st_.log.start), np.array(st_.log.end)
    assert len(starts) == st_.passes
    assert np.all(stops >= starts) and np.all(starts[1:] >= stops[:-1])
    assert st_.pass_s == pytest.approx(float(np.sum(stops - starts)))
    assert 0.0 < st_.busy_rank_s <= 3 * st_.pass_s + 1e-9
    assert 0.0 < st_.utilisation <= 1.0
    assert st_.prefill_rank_passes >= st_.prefill_passes > 0
    assert 1.0 <= st_.mean_prefill_ranks <= 3.0


def test_dp1_attention_uses_the_event_loop() -> None:
    run = _lockstep(dp=1)
    assert run.lockstep is None
    assert all(r.finished for r in run.requests)


# ---- the collective with idle ranks --------------------------------------------------------


def _single_request() -> Workload:
    req = Req(
        rid="only",
        prompt_ids=np.arange(1, 65, dtype=np.int32),
        sampling=SamplingParams(max_new_tokens=4, ignore_eos=True),
        arrival_time=0.0,
    )
    return Workload("single", {}, [req], has_timestamps=True)


@pytest.mark.parametrize(
    ("compat", "expected"),
    [
        # SGLang: "mixed" (1 of 4 ranks prefillable) delays until the pass cap.
        ("sglang", {"delay": 4, "wait_timeout": 1, "none": 3}),
        # radixsched: "mixed" only delays under the slot/queue conditions (none hold here).
        ("radixsched", {"no_wait": 1, "none": 3}),
    ],
)
def test_idle_ranks_join_every_negotiation(compat: str, expected: dict[str, int]) -> None:
    run = simulate(
        _single_request(),
        SchedulerConfig(compat=compat),  # type: ignore[arg-type]
        SimConfig(
            dp=4,
            router="round-robin",
            max_total_tokens=4000,
            enable_dp_attention=True,
            prefill_delayer_max_delay_passes=5,
        ),
        check_integrity=True,
    )
    st_ = _stats(run)
    assert dict(st_.verdicts) == expected
    assert run.requests[0].output_len == 4
    assert st_.delay_streaks == ([4] if compat == "sglang" else [])
    # Delayed passes ran no batch anywhere and took no time.
    assert st_.empty_passes == expected.get("delay", 0)


# ---- the delayer raises utilisation without exceeding its maximum delay --------------------


@pytest.mark.parametrize(
    ("compat", "sim"),
    [
        ("sglang", {"prefill_delayer_max_delay_passes": 16}),
        (
            "radixsched",
            {
                "prefill_delayer_queue_min_ratio": 0.3,
                "prefill_delayer_max_delay_passes": 16,
                "prefill_delayer_max_delay_ms": 50.0,
            },
        ),
    ],
)
def test_delayer_raises_utilisation_within_the_max_delay(compat: str, sim: dict[str, Any]) -> None:
    common: dict[str, Any] = {"dp": 4, "max_total_tokens": 40000}
    off = _stats(_lockstep(BUSY, compat=compat, enable_prefill_delayer=False, **common))
    run = _lockstep(BUSY, compat=compat, enable_prefill_delayer=True, **common, **sim)
    on = _stats(run)
    assert all(r.finished for r in run.requests)
    # Prefills line up (fewer passes with a prefill, more ranks in each) and less rank time
    # is spent waiting for a peer's prefill.
    assert on.utilisation > off.utilisation + 0.03
    assert on.prefill_passes < off.prefill_passes
    assert on.mean_prefill_ranks > off.mean_prefill_ranks
    assert on.stalled_rank_s < off.stalled_rank_s
    assert on.delayed_passes > 0
    # No request's prefill is vetoed for more consecutive passes than the cap allows ...
    cap_passes = sim["prefill_delayer_max_delay_passes"] - 1
    assert 0 < on.max_delay_streak <= cap_passes
    worst = max(max_request_delay(on, r) for r in run.requests)
    assert 0 < worst[0] <= cap_passes
    # ... nor, with a wall-clock cap, for longer than the cap plus the pass that crossed it.
    cap_ms = sim.get("prefill_delayer_max_delay_ms")
    if cap_ms is not None:
        longest_pass = max(e - s for s, e in zip(on.log.start, on.log.end, strict=True))
        assert worst[1] <= cap_ms / 1000.0 + longest_pass
        assert max(on.delay_streak_s) <= cap_ms / 1000.0 + longest_pass


def max_request_delay(stats: LockstepStats, req: Req) -> tuple[int, float]:
    """The longest run of consecutive vetoed passes that started while ``req`` waited for
    its first prefill (arrival <= pass start < first scheduled), as (passes, seconds from
    the first vetoed pass's start to the run's last pass end)."""
    first = req.times.first_scheduled
    if first is None or req.times.arrival is None:
        return 0, 0.0
    log = stats.log
    best, best_s = 0, 0.0
    run, run_start = 0, 0.0
    lo = bisect.bisect_left(log.start, req.times.arrival)
    for j in range(lo, len(log.start)):
        s = log.start[j]
        if s >= first:
            break
        if log.delayed[j]:
            if run == 0:
                run_start = s
            run += 1
            if run > best or (run == best and log.end[j] - run_start > best_s):
                best, best_s = run, log.end[j] - run_start
        else:
            run = 0
    return best, best_s


def test_max_request_delay_counts_runs_while_waiting() -> None:
    stats = LockstepStats(dp=2)
    for s, e, d in [(0, 1, 1), (1, 2, 1), (2, 3, 0), (3, 4, 1), (4, 5, 1), (5, 6, 1), (6, 7, 1)]:
        stats.log.start.append(s)
        stats.log.end.append(e)
        stats.log.delayed.append(d)
    req = Req(
        rid="r",
        prompt_ids=np.arange(4, dtype=np.int32),
        sampling=SamplingParams(max_new_tokens=1),
    )
    assert max_request_delay(stats, req) == (0, 0.0)  # never scheduled
    req.times.arrival = 0.5
    req.times.first_scheduled = 6.0
    # Passes starting in [0.5, 6.0): 1..5; runs: [1] and [3, 4, 5].
    assert max_request_delay(stats, req) == (3, 3.0)
    req.times.arrival = 0.0
    req.times.first_scheduled = 3.0
    assert max_request_delay(stats, req) == (2, 2.0)


# ---- configuration and guards ---------------------------------------------------------------


def test_delayer_config_follows_sim_and_scheduler_settings() -> None:
    sim = SimConfig(
        prefill_delayer_max_delay_passes=7,
        prefill_delayer_max_delay_ms=12.5,
        prefill_delayer_token_usage_low_watermark=0.25,
        prefill_delayer_queue_min_ratio=0.4,
    )
    cfg = delayer_config(sim, SchedulerConfig(compat="sglang", prefill_max_requests=9))
    assert (cfg.max_delay_passes, cfg.max_delay_ms) == (7, 12.5)
    assert (cfg.token_usage_low_watermark, cfg.queue_min_ratio) == (0.25, 0.4)
    assert cfg.prefill_max_requests == 9
    assert cfg.compat == "sglang"
    assert delayer_config(SimConfig(), SchedulerConfig()).compat == "radixsched"


def _replicas(n: int, *, lockstep: bool = True) -> tuple[list[Any], LockstepGates]:
    sim = SimConfig(dp=n, max_total_tokens=4000, enable_dp_attention=True)
    cost = build_cost_model(sim)
    clocks = [VirtualClock() for _ in range(n)]
    gates = lockstep_gates(sim, SchedulerConfig(), clocks, 8)
    reps = [
        _build_replica(
            i,
            SchedulerConfig(),
            sim,
            cost,
            4000,
            clock=clocks[i],
            gate_factory=gates.recorders[i],
            single_step=lockstep,
        )
        for i in range(n)
    ]
    return reps, gates


def test_replica_ids_must_be_the_ranks() -> None:
    reps, gates = _replicas(2)
    reps.reverse()
    with pytest.raises(ValueError, match=r"0\.\.dp-1"):
        run_lockstep(reps, gates, [], None, SimConfig(dp=2), TimeSeries(), None, False)
    gates.pool.close()  # type: ignore[union-attr]


def test_lockstep_ranks_are_built_single_step_with_their_gates() -> None:
    reps, gates = _replicas(2)
    stats = run_lockstep(
        reps,
        gates,
        [],
        None,
        SimConfig(dp=2, enable_dp_attention=True),
        TimeSeries(),
        None,
        False,
    )
    assert stats.passes == 0 and stats.utilisation == 0.0 and stats.mean_prefill_ranks == 0.0
    for rep in reps:
        assert rep.sched.runner.supports_multi_step is False
        assert isinstance(rep.sched.gate_factory, _GateRecorder)
    with pytest.raises(ValueError, match="one pass at a time"):
        reps, gates = _replicas(2, lockstep=False)
        try:
            run_lockstep(reps, gates, [], None, SimConfig(dp=2), TimeSeries(), None, False)
        finally:
            gates.pool.close()  # type: ignore[union-attr]


def test_gate_recorder_requires_a_finalized_negotiation() -> None:
    reps, gates = _replicas(1)
    gates.pool.close()  # type: ignore[union-attr]
    sched: Scheduler = reps[0].sched
    rec = _GateRecorder(
        PrefillDelayer(
            delayer_config(SimConfig(), SchedulerConfig()),
            max_running_requests=4,
            clock=reps[0].clock.now,
        )
    )
    with pytest.raises(RuntimeError, match="without negotiating"):
        rec.take_verdict()
    gate = rec(sched)
    with pytest.raises(RuntimeError, match="without negotiating"):
        rec.take_verdict()  # built but not finalized
    gate = rec(sched)
    gate.finalize(0)
    assert rec.take_verdict().reason is DelayReason.NONE


# ---- property: random arrivals ---------------------------------------------------------------


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    seed=st.integers(0, 10_000),
    rate=st.sampled_from([10.0, 50.0, 200.0]),
    dp=st.integers(2, 4),
    compat=st.sampled_from(["radixsched", "sglang"]),
    cap=st.integers(1, 6),
    ratio=st.sampled_from([None, 0.3]),
)
def test_random_arrivals_finish_within_the_pass_cap(
    seed: int, rate: float, dp: int, compat: str, cap: int, ratio: float | None
) -> None:
    wl = load_workload(
        "shared-prefix:groups=3,prompts=4,system_len=256,question_len=32,output_len=6",
        request_rate=rate,
        seed=seed,
    )
    run = simulate(
        wl,
        SchedulerConfig(compat=compat),  # type: ignore[arg-type]
        dataclasses.replace(
            SimConfig(),
            dp=dp,
            router="random",
            max_total_tokens=3000,
            enable_dp_attention=True,
            prefill_delayer_max_delay_passes=cap,
            prefill_delayer_queue_min_ratio=ratio,
        ),
        check_integrity=True,
    )
    st_ = _stats(run)
    assert all(r.finished and r.output_len == 6 for r in run.requests)
    assert st_.max_delay_streak <= cap - 1
    assert sum(st_.verdicts.values()) == st_.passes

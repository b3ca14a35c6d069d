"""End-to-end multi-replica simulation: routers over ``--dp N`` replicas and the host KV tier."""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from typing import Any

import numpy as np
import pytest

from radixsched.cluster.routers import ROUTERS
from radixsched.config import SchedulerConfig
from radixsched.request import Req, SamplingParams
from radixsched.sim.deploy.run import Lazily, SimRun
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload

# 32 system prompts of 2k tokens, 8 questions each, at 50 req/s. The cluster's KV (8 x 20k
# tokens) holds every system prompt only if each replica keeps its own groups.
SHARED = "shared-prefix:groups=32,prompts=8,system_len=2048,question_len=128,output_len=32"
# HiCache: one replica whose 12k-token KV holds ~5 of 24 system prompts.
PRESSURE = "shared-prefix:groups=24,prompts=8,system_len=2048,question_len=64,output_len=16"


@cache
def _workload(spec: str, rate: float) -> Workload:
    return load_workload(spec, request_rate=rate, seed=0)


def _run(spec: str, rate: float, **sim: Any) -> SimRun:
    return simulate(_workload(spec, rate), SchedulerConfig(), SimConfig(**sim))


# ---- replicas and routers --------------------------------------------------------------------


def test_per_replica_summaries_add_up() -> None:
    run = _run(SHARED, 50.0, dp=4, max_total_tokens=20000)
    n = len(run.requests)
    assert [s.replica for s in run.replicas] == [0, 1, 2, 3]
    assert sum(s.num_requests for s in run.replicas) == n
    assert sorted(run.replica_of) == sorted(r.rid for r in run.requests)
    for s in run.replicas:
        assert s.num_requests == sum(1 for v in run.replica_of.values() if v == s.replica)
        assert 0.0 <= s.hit_rate <= 1.0 and s.host_hit_rate == 0.0
        assert s.busy_s > 0.0 and s.prompt_tokens > 0
    # The cluster hit rate is the prompt-token-weighted mean of the replicas'.
    weighted = sum(s.hit_rate * s.prompt_tokens for s in run.replicas)
    assert run.result.hit_rate == pytest.approx(
        weighted / sum(s.prompt_tokens for s in run.replicas)
    )
    data = run.result.to_json()
    assert data["dp"] == 4
    assert data["replicas"] == [s.to_json() for s in run.replicas]
    assert all(r.finished for r in run.requests)


def test_dp1_has_no_per_replica_section() -> None:
    run = _run(SHARED, 50.0, dp=1, max_total_tokens=20000)
    assert "replicas" not in run.result.to_json()
    assert len(run.replicas) == 1 and set(run.replica_of.values()) == {0}


def test_replica_of_is_made_when_first_read() -> None:
    made: list[int] = []
    lazy = Lazily(lambda: made.append(1) or {"a": 0, "b": 1})
    assert not made
    assert lazy["b"] == 1 and list(lazy) == ["a", "b"] and len(lazy) == 2 and made == [1]
    assert lazy == {"a": 0, "b": 1}


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_every_router_completes_deterministically(router: str) -> None:
    a = _run(SHARED, 50.0, dp=4, router=router, max_total_tokens=20000)
    b = _run(SHARED, 50.0, dp=4, router=router, max_total_tokens=20000)
    assert all(r.finished for r in a.requests)
    assert a.replica_of == b.replica_of
    assert a.result.hit_rate == b.result.hit_rate


def test_cache_aware_routing_beats_round_robin_on_shared_prefixes() -> None:
    # Round-robin spreads every group over all 8 replicas, so each replica would have to
    # hold all 32 system prompts (64k tokens) in 20k: the hit rate collapses to ~20%.
    # Cache-aware keeps each group on one replica: ~80% (the optimum is ~85%).
    rr = _run(SHARED, 50.0, dp=8, router="round-robin", max_total_tokens=20000).result
    ca = _run(SHARED, 50.0, dp=8, router="cache-aware", max_total_tokens=20000).result
    assert rr.hit_rate < 0.35
    assert ca.hit_rate > 0.7
    assert ca.hit_rate > rr.hit_rate + 0.4
    assert ca.optimal_hit_rate >= ca.hit_rate
    # Recomputed prefill is what a lost prefix costs.
    assert ca.hit_rate - rr.hit_rate == pytest.approx(
        (ca.cached_tokens - rr.cached_tokens) / ca.prompt_tokens
    )


def _keyed_workload() -> Workload:
    rng = np.random.default_rng(7)
    reqs = []
    for i in range(48):
        reqs.append(
            Req(
                rid=f"k{i}",
                prompt_ids=rng.integers(1, 30000, size=200, dtype=np.int32),
                sampling=SamplingParams(max_new_tokens=4, ignore_eos=True),
                routing_key=f"tenant-{i % 6}",
                arrival_time=i * 0.01,
            )
        )
    return Workload("keyed", {}, reqs, has_timestamps=True)


def test_consistent_hash_keeps_a_routing_key_on_one_replica() -> None:
    run = simulate(
        _keyed_workload(),
        SchedulerConfig(),
        SimConfig(dp=4, router="consistent-hash", max_total_tokens=20000),
    )
    by_key: dict[str, set[int]] = defaultdict(set)
    for r in run.requests:
        assert r.routing_key is not None
        by_key[r.routing_key].add(run.replica_of[r.rid])
    assert len(by_key) == 6
    assert all(len(v) == 1 for v in by_key.values())
    assert len(set().union(*by_key.values())) > 1  # keys do spread over replicas


def test_consistent_hash_without_key_groups_by_prefix() -> None:
    run = _run(SHARED, 50.0, dp=8, router="consistent-hash", max_total_tokens=20000)
    by_prefix: dict[bytes, set[int]] = defaultdict(set)
    for r in run.requests:
        by_prefix[r.prompt_ids[:256].tobytes()].add(run.replica_of[r.rid])
    assert len(by_prefix) == 32
    assert all(len(v) == 1 for v in by_prefix.values())
    assert run.result.hit_rate > 0.7


# ---- host KV tier ----------------------------------------------------------------------------


@cache
def _hicache(size_gb: float | None, dp: int = 1) -> SimRun:
    sim: dict[str, Any] = {"dp": dp, "max_total_tokens": 12000}
    if size_gb is not None:
        sim.update(enable_hierarchical_cache=True, hicache_size=size_gb)
    return _run(PRESSURE, 20.0, **sim)


def test_hicache_raises_hit_rate_and_lowers_ttft_under_cache_pressure() -> None:
    off = _hicache(None).result
    # llama-3.1-8b: 128 KiB of KV a token, so 4 GiB hold 32k tokens (16 system prompts).
    on = _hicache(4.0).result
    assert off.host_hit_rate == 0.0 and off.device_hit_rate == off.hit_rate
    assert on.host_hit_rate > 0.2
    assert on.device_hit_rate + on.host_hit_rate == pytest.approx(on.hit_rate)
    assert on.hit_rate > off.hit_rate + 0.2
    assert on.ttft_s.mean < 0.5 * off.ttft_s.mean
    assert on.ttft_s.p99 < off.ttft_s.p99
    assert on.hit_rate <= on.optimal_hit_rate


def test_hicache_hit_rate_grows_with_host_size() -> None:
    rates = [_hicache(gb).result for gb in (0.0, 0.25, 1.0, 4.0)]
    off = _hicache(None).result
    # A zero-sized tier keeps nothing: exactly the run without one.
    assert rates[0].hit_rate == off.hit_rate and rates[0].host_hit_rate == 0.0
    hits = [r.hit_rate for r in rates]
    hosts = [r.host_hit_rate for r in rates]
    assert hits == sorted(hits) and hits[-1] > hits[0]
    assert hosts == sorted(hosts) and hosts[-1] > hosts[1] > 0.0


def test_hicache_per_replica_split() -> None:
    run = _hicache(2.0, dp=2)
    assert all(r.finished for r in run.requests)
    assert any(s.host_hit_rate > 0.0 for s in run.replicas)
    host_tokens = sum(s.host_hit_rate * s.prompt_tokens for s in run.replicas)
    assert run.result.host_hit_rate == pytest.approx(
        host_tokens / sum(s.prompt_tokens for s in run.replicas)
    )


def test_host_tier_pages_are_whole_device_pages() -> None:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica

    sim = SimConfig(max_total_tokens=4000, enable_hierarchical_cache=True, hicache_page_size=40)
    rep = _build_replica(0, SchedulerConfig(page_size=16), sim, build_cost_model(sim), 4000)
    assert rep.sched.host_tier.page_size == 48
    bad = SimConfig(max_total_tokens=4000, enable_hierarchical_cache=True, hicache_page_size=0)
    with pytest.raises(ValueError, match="hicache-page-size"):
        _build_replica(0, SchedulerConfig(), bad, build_cost_model(bad), 4000)


# ---- closed-loop lookahead -------------------------------------------------------------------


def _replica(accelerate: bool, **sched: Any) -> Any:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica

    sim = SimConfig(max_total_tokens=50_000)
    cost = build_cost_model(sim)
    return _build_replica(0, SchedulerConfig(**sched), sim, cost, 50_000, accelerate=accelerate)


def _req(rid: str, out: int, stops: tuple[int, ...] = ()) -> Req:
    sampling = SamplingParams(max_new_tokens=out, ignore_eos=True, stop_token_ids=stops)
    return Req(rid, np.arange(64, dtype=np.int32) + len(rid), sampling)


@pytest.mark.parametrize("accelerate", [True, False])
def test_earliest_finish_is_the_fewest_tokens_to_go_times_the_step_floor(
    accelerate: bool,
) -> None:
    from radixsched.native import core
    from radixsched.sim.deploy.replicas import earliest_finish

    if accelerate and core() is None:
        pytest.skip("the accelerated core runs over the native core, which is not built or is off")
    rep = _replica(accelerate)
    floor = rep.min_step_s
    assert floor > 0.001  # the default overhead, plus reading the weights
    assert earliest_finish(rep) == floor  # nothing runs: no finish before a step ends
    for rid, out in (("a", 40), ("b", 30)):
        rep.sched.add_request(_req(rid, out), now=0.0)
    assert earliest_finish(rep) == 30 * floor  # waiting: a prefill, then 29 decode steps
    while rep.sched.waiting:
        rep.sched.step()
    # A decode jump of about ten steps: the accelerated core defers the requests' tokens.
    rep.sched.step(horizon=rep.clock.now() + 10 * floor)
    now, done = rep.clock.now(), len(rep.sched.running[0].output_ids)
    rep.sched.sync_running()
    to_go = min(r.remaining_new_tokens for r in rep.sched.running)
    assert to_go < 30 - done or not accelerate  # the request's own fields were behind
    assert earliest_finish(rep) == now + to_go * floor
    rep.sched.add_request(_req("c", 200), now=now)
    assert earliest_finish(rep) == now + to_go * floor  # a waiting request with more to go
    rep.sched.add_request(_req("d", 2), now=now)
    assert earliest_finish(rep) == now + 2 * floor  # ... and one with less
    rep.sched.add_request(_req("e", 100, stops=(5,)), now=now)
    assert earliest_finish(rep) == now + floor  # a stop id may end it at its first token
    rep.min_step_s = 0.0
    assert earliest_finish(rep) == now  # no floor known


def test_replicas_without_a_known_step_floor_do_not_look_ahead() -> None:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica

    sim = SimConfig(max_total_tokens=50_000, enable_hierarchical_cache=True, hicache_size=1.0)
    host = _build_replica(0, SchedulerConfig(), sim, build_cost_model(sim), 50_000)
    assert host.min_step_s == 0.0  # its loads hold device KV the lookahead does not count

    def recorder(cost: Any, seed: int, clock: Any) -> Any:
        from radixsched.sim.cost.runner import CostModelRunner

        return CostModelRunner(cost, seed=seed)

    plain = SimConfig(max_total_tokens=50_000)
    custom = _build_replica(
        0, SchedulerConfig(), plain, build_cost_model(plain), 50_000, runner_factory=recorder
    )
    assert custom.min_step_s == 0.0  # a runner of its own may time steps its own way
    assert _replica(True).min_step_s > 0.0

"""Waiting-queue policies: hand-made queues with the expected order written out."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixsched.cache import CacheKey, NoReuseCache, RadixCache
from radixsched.cache.base import BasePrefixCache
from radixsched.config import SchedulerConfig
from radixsched.policy import (
    POLICIES,
    SGLANG_PREFIX_MATCH_CAP,
    WAITING_PREFIX_REFRESH_INTERVAL,
    WAITING_PREFIX_REFRESH_SPAN,
    PriorityResult,
    SchedulePolicy,
    policy_names,
    prefill_work,
    validate_priority,
)
from radixsched.request import Req, SamplingParams

# ---- helpers ------------------------------------------------------------------------------


def mk(
    rid: str,
    tokens: Sequence[int],
    *,
    t: float = 0.0,
    max_new: int = 16,
    priority: int | None = None,
    routing_key: str | None = None,
    tenant: str | None = None,
    output: Sequence[int] = (),
    extra_key: str | None = None,
    processed: int = 0,
) -> Req:
    r = Req(
        rid,
        np.asarray(tokens, dtype=np.int32),
        sampling=SamplingParams(max_new_tokens=max_new),
        priority=priority,
        routing_key=routing_key,
        tenant=tenant,
        extra_key=extra_key,
        arrival_time=t,
    )
    r.output_ids = list(output)
    r.queue_entry_processed_tokens = processed
    return r


def cache_with(*seqs: Sequence[int], extra_key: str | None = None) -> RadixCache:
    cache = RadixCache(None, page_size=1)
    ns = None if extra_key is None else (extra_key, None)
    for s in seqs:
        arr = np.asarray(s, dtype=np.int32)
        cache.insert(CacheKey(arr, ns), np.arange(1, len(arr) + 1, dtype=np.int64))
    return cache


def make_policy(name: str, cache: BasePrefixCache | None = None, **cfg: object) -> SchedulePolicy:
    config = SchedulerConfig(schedule_policy=name, **cfg)  # type: ignore[arg-type]
    return SchedulePolicy(config, cache if cache is not None else cache_with())


def rids(queue: Sequence[Req]) -> list[str]:
    return [r.rid for r in queue]


def run(policy: SchedulePolicy, queue: list[Req], **kw: object) -> PriorityResult:
    return policy.calc_priority(queue, **kw)  # type: ignore[arg-type]


PREFIX = list(range(1000, 1100))  # a 100-token cached prefix
NO_DEDUP = {"in_batch_prefix_check_threshold": -1}


# ---- registry and validation ------------------------------------------------------------


def test_registry_names() -> None:
    assert policy_names() == [
        "fcfs",
        "lof",
        "random",
        "routing-key",
        "lpm",
        "dfs-weight",
        "hrrn",
        "shortest-prefill-first",
        "fair",
    ]
    assert "priority" not in POLICIES
    cache_aware = {n for n, s in POLICIES.items() if s.cache_aware}
    assert cache_aware == {"lpm", "dfs-weight", "hrrn", "shortest-prefill-first"}


@pytest.mark.parametrize("name", ["nope", "priority", "LPM"])
def test_unknown_policy_lists_valid_names(name: str) -> None:
    with pytest.raises(ValueError, match="valid policies: ") as exc:
        make_policy(name)
    for valid in POLICIES:
        assert valid in str(exc.value)


def test_priority_is_not_a_policy_message() -> None:
    with pytest.raises(ValueError, match="enable-priority-scheduling"):
        make_policy("priority")


@pytest.mark.parametrize("name", ["lpm", "hrrn", "dfs-weight"])
def test_cache_aware_without_cache_falls_back_with_warning(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = RadixCache(None, disable=True)
    with caplog.at_level(logging.WARNING, logger="radixsched.policy"):
        pol = make_policy(name, cache)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert name in warnings[0].getMessage() and "fcfs" in warnings[0].getMessage()
    assert pol.policy_name == "fcfs" and pol.requested_policy_name == name
    assert not pol.is_cache_aware
    q = [mk("b", [1, 2], t=2.0), mk("a", [3, 4], t=1.0)]
    res = run(pol, q)
    assert res.active_policy == "fcfs" and rids(q) == ["a", "b"]
    assert not res.prefix_matched and q[0].num_matched_prefix_tokens == 0


def test_cache_aware_with_no_reuse_cache_keeps_policy(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        pol = make_policy("lpm", NoReuseCache())
    assert pol.policy_name == "lpm" and not caplog.records


def test_spf_without_cache_raises_requires_prefix_caching() -> None:
    with pytest.raises(ValueError, match="requires prefix caching"):
        make_policy("shortest-prefill-first", RadixCache(None, disable=True))
    # compat mode gives the same, correct message (SGLang masks it, spec 8 item 5)
    with pytest.raises(ValueError, match="requires prefix caching"):
        make_policy("shortest-prefill-first", RadixCache(None, disable=True), compat="sglang")


@pytest.mark.parametrize("name", ["random", "routing-key", "lpm", "dfs-weight", "hrrn", "fair"])
def test_priority_scheduling_requires_fcfs_or_lof(name: str) -> None:
    with pytest.raises(ValueError, match="fcfs, lof"):
        make_policy(name, enable_priority_scheduling=True)


def test_priority_scheduling_allowed_for_fcfs_and_lof() -> None:
    for name in ("fcfs", "lof"):
        assert make_policy(name, enable_priority_scheduling=True).policy_name == name


def test_validate_priority() -> None:
    off = SchedulerConfig()
    strict = SchedulerConfig(abort_on_priority_when_disabled=True)
    on = SchedulerConfig(enable_priority_scheduling=True, abort_on_priority_when_disabled=True)
    assert validate_priority(mk("a", [1]), strict) is None
    assert validate_priority(mk("a", [1], priority=3), off) is None
    msg = validate_priority(mk("a", [1], priority=3), strict)
    assert msg is not None and "without a priority" in msg
    assert validate_priority(mk("a", [1], priority=3), on) is None
    too_big = validate_priority(mk("a", [1], priority=2**63), on)
    assert too_big is not None and "64-bit" in too_big
    assert validate_priority(mk("a", [1], priority=-(2**63)), on) is None


# ---- fcfs / lof / random / routing-key ------------------------------------------------------


def test_fcfs_radixsched_sorts_by_queue_entry_then_arrival() -> None:
    q = [mk("c", [1], t=3.0), mk("a", [2], t=1.0), mk("b2", [3], t=2.0), mk("b1", [4], t=2.0)]
    q[3].queue_entry_time = 1.5  # kept seniority (e.g. a retracted request)
    res = run(make_policy("fcfs"), q)
    assert res == PriorityResult("fcfs", frozenset(), frozenset(), True)
    assert rids(q) == ["a", "b1", "b2", "c"]


def test_fcfs_tie_on_entry_time_breaks_by_arrival_then_list_order() -> None:
    q = [mk("x", [1], t=5.0), mk("y", [2], t=4.0), mk("z", [3], t=4.0)]
    for r in q:
        r.queue_entry_time = 10.0
    run(make_policy("fcfs"), q)
    assert rids(q) == ["y", "z", "x"]


def test_fcfs_compat_keeps_list_order() -> None:
    q = [mk("c", [1], t=3.0), mk("a", [2], t=1.0), mk("b", [3], t=2.0)]
    run(make_policy("fcfs", compat="sglang"), q)
    assert rids(q) == ["c", "a", "b"]


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_fcfs_priority_high_values_first(compat: str) -> None:
    q = [
        mk("none", [1], t=0.0),
        mk("p1", [1], t=1.0, priority=1),
        mk("p5_late", [1], t=3.0, priority=5),
        mk("p5_early", [1], t=2.0, priority=5),
        mk("neg", [1], t=0.5, priority=-7),
    ]
    run(make_policy("fcfs", enable_priority_scheduling=True, compat=compat), q)
    assert rids(q) == ["p5_early", "p5_late", "p1", "neg", "none"]
    assert q[-1].priority is None  # never mutated


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_fcfs_priority_low_values_first(compat: str) -> None:
    q = [
        mk("none", [1], t=0.0),
        mk("p1", [1], t=1.0, priority=1),
        mk("p5", [1], t=2.0, priority=5),
        mk("neg", [1], t=3.0, priority=-7),
    ]
    pol = make_policy(
        "fcfs",
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=True,
        compat=compat,
    )
    run(pol, q)
    assert rids(q) == ["neg", "p1", "p5", "none"]


def test_none_priority_sorts_after_explicit_extremes() -> None:
    for low_first, extreme in ((False, -(2**63)), (True, 2**63 - 1)):
        q = [mk("none", [1], t=0.0), mk("extreme", [1], t=1.0, priority=extreme)]
        pol = make_policy(
            "fcfs", enable_priority_scheduling=True, schedule_low_priority_values_first=low_first
        )
        run(pol, q)
        assert rids(q) == ["extreme", "none"]


def test_default_priority_value_applies_to_missing_priorities() -> None:
    q = [mk("p1", [1], t=0.0, priority=1), mk("none", [1], t=1.0), mk("p9", [1], t=2.0, priority=9)]
    pol = make_policy("fcfs", enable_priority_scheduling=True, default_priority_value=5)
    run(pol, q)
    assert rids(q) == ["p9", "none", "p1"]
    assert q[1].priority is None


def test_fcfs_priority_off_ignores_priority() -> None:
    q = [mk("a", [1], t=0.0, priority=1), mk("b", [1], t=1.0, priority=9)]
    run(make_policy("fcfs"), q)
    assert rids(q) == ["a", "b"]


def test_lof_radixsched_ties_by_arrival() -> None:
    q = [
        mk("s", [1], t=0.0, max_new=4),
        mk("l_late", [1], t=2.0, max_new=64),
        mk("l_early", [1], t=1.0, max_new=64),
        mk("m", [1], t=3.0, max_new=16),
    ]
    run(make_policy("lof"), q)
    assert rids(q) == ["l_early", "l_late", "m", "s"]


def test_lof_compat_ties_keep_list_order() -> None:
    q = [
        mk("s", [1], t=0.0, max_new=4),
        mk("l_late", [1], t=2.0, max_new=64),
        mk("l_early", [1], t=1.0, max_new=64),
    ]
    run(make_policy("lof", compat="sglang"), q)
    assert rids(q) == ["l_late", "l_early", "s"]


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_lof_with_priority(compat: str) -> None:
    q = [
        mk("p0_long", [1], t=0.0, max_new=100, priority=0),
        mk("p2_short", [1], t=1.0, max_new=1, priority=2),
        mk("p2_long", [1], t=2.0, max_new=50, priority=2),
        mk("none_long", [1], t=3.0, max_new=1000),
    ]
    run(make_policy("lof", enable_priority_scheduling=True, compat=compat), q)
    assert rids(q) == ["p2_long", "p2_short", "p0_long", "none_long"]


def test_random_is_seeded_and_uses_its_own_rng() -> None:
    base = [mk(f"r{i}", [i + 1], t=float(i)) for i in range(20)]
    q1, q2, q3 = list(base), list(base), list(base)
    run(make_policy("random", seed=7), q1)
    import random as stdlib_random

    stdlib_random.seed(123)  # the global generator must not matter
    run(make_policy("random", seed=7), q2)
    run(make_policy("random", seed=8), q3)
    assert rids(q1) == rids(q2)
    assert rids(q1) != rids(q3)
    assert sorted(rids(q1)) == sorted(rids(base))


def _routing_queue() -> list[Req]:
    return [
        mk("none", [1], t=0.0),
        mk("zz", [1], t=1.0, routing_key="zz"),
        mk("b1", [1], t=2.0, routing_key="b"),
        mk("aa", [1], t=3.0, routing_key="aa"),
        mk("c", [1], t=4.0, routing_key="c"),
        mk("b2", [1], t=5.0, routing_key="b"),
        mk("empty", [1], t=6.0, routing_key=""),
        mk("a", [1], t=7.0, routing_key="a"),
    ]


def _running() -> list[Req]:
    keys = ["b", "b", "a", "c", "", None]
    return [mk(f"run{i}", [1], routing_key=k) for i, k in enumerate(keys)]


def test_routing_key_radixsched_nonmatching_keep_arrival() -> None:
    q = _routing_queue()
    run(make_policy("routing-key"), q, running_batch=_running())
    # b (count 2) first, then a and c (count 1, by key), then non-matching by arrival
    assert rids(q) == ["b1", "b2", "a", "c", "none", "zz", "aa", "empty"]


def test_routing_key_compat_nonmatching_by_key_string() -> None:
    q = _routing_queue()
    run(make_policy("routing-key", compat="sglang"), q, running_batch=_running())
    # non-matching: "" (none, empty) first in list order, then "aa", "zz"
    assert rids(q) == ["b1", "b2", "a", "c", "none", "empty", "aa", "zz"]


@pytest.mark.parametrize("running", [None, [], [mk("run", [1], routing_key="")]])
def test_routing_key_without_running_keys_does_not_sort(running: list[Req] | None) -> None:
    q = _routing_queue()
    before = rids(q)
    run(make_policy("routing-key"), q, running_batch=running)
    assert rids(q) == before


# ---- matching -----------------------------------------------------------------------------


def test_length_matching_sets_capped_count_only() -> None:
    cache = cache_with(PREFIX)
    full = mk("full", PREFIX)  # whole prompt cached: the match is capped at len - 1
    part = mk("part", [*PREFIX[:40], 1, 2])
    ns = mk("ns", PREFIX, extra_key="lora")  # another namespace shares nothing
    retracted = mk("retr", PREFIX[:60], output=PREFIX[60:80])
    q = [full, part, ns, retracted]
    for r in q:
        r.last_node = "sentinel"
    run(make_policy("lpm", cache, **NO_DEDUP), q)
    assert [r.num_matched_prefix_tokens for r in (full, part, ns, retracted)] == [99, 40, 0, 79]
    assert all(r.last_node == "sentinel" for r in q)  # match_len leaves nodes alone
    assert rids(q) == ["full", "retr", "part", "ns"]


def test_node_matching_sets_last_node_for_dfs_and_compat() -> None:
    for name, compat in (("dfs-weight", "radixsched"), ("lpm", "sglang"), ("hrrn", "sglang")):
        cache = cache_with(PREFIX)
        r = mk("r", [*PREFIX[:40], 1, 2])
        run(make_policy(name, cache, compat=compat), [r])
        assert r.prefix_len == 40 and r.num_matched_prefix_tokens == 40
        assert r.last_node is not None and len(r.last_node) == 40  # the split upper node
        assert r.host_hit_len == 0


def test_cache_agnostic_policies_record_match_len() -> None:
    cache = cache_with(PREFIX)
    for name in ("fcfs", "lof", "random", "routing-key", "fair"):
        r = mk("r", [*PREFIX[:30], 5])
        res = run(make_policy(name, cache), [r])
        assert r.num_matched_prefix_tokens == 30 and r.last_node is None
        assert res.prefix_matched and res.active_policy == name


# ---- lpm --------------------------------------------------------------------------------------


def _lpm_queue() -> list[Req]:
    return [
        mk("m10", [*PREFIX[:10], 1], t=0.0),
        mk("m50_late", [*PREFIX[:50], 2], t=3.0),
        mk("m0", [7, 7, 7], t=1.0),
        mk("m50_early", [*PREFIX[:50], 3], t=2.0),
        mk("m80", [*PREFIX[:80], 4], t=4.0),
    ]


def test_lpm_radixsched_order_and_arrival_ties() -> None:
    q = _lpm_queue()
    res = run(make_policy("lpm", cache_with(PREFIX)), q)
    assert rids(q) == ["m80", "m50_early", "m50_late", "m10", "m0"]
    assert res.active_policy == "lpm" and not res.deferred


def test_lpm_compat_ties_keep_list_order() -> None:
    q = _lpm_queue()
    run(make_policy("lpm", cache_with(PREFIX), compat="sglang"), q)
    assert rids(q) == ["m80", "m50_late", "m50_early", "m10", "m0"]


def test_lpm_starvation_bound_in_seconds() -> None:
    def queue() -> list[Req]:
        return [
            mk("fresh_hit", [*PREFIX[:90], 1], t=9.0),
            mk("old_miss2", [5, 5], t=1.0),
            mk("old_miss1", [6, 6], t=0.5),
        ]

    pol = make_policy("lpm", cache_with(PREFIX), lpm_max_wait_s=5.0)
    q = queue()
    run(pol, q, now=4.0)  # nobody waited > 5 s: pure lpm (misses by arrival)
    assert rids(q) == ["fresh_hit", "old_miss1", "old_miss2"]
    q = queue()
    run(pol, q, now=6.2)  # old_miss1 waited 5.7 s, old_miss2 5.2 s: both overdue, by arrival
    assert rids(q) == ["old_miss1", "old_miss2", "fresh_hit"]
    q = queue()
    run(pol, q, now=6.0)  # only old_miss1 is overdue (5.5 > 5; 5.0 is not > 5)
    assert rids(q) == ["old_miss1", "fresh_hit", "old_miss2"]


def test_lpm_starvation_bound_in_tokens() -> None:
    q = [
        mk("hit", [*PREFIX[:90], 1], t=2.0, processed=900),
        mk("miss", [5, 5], t=1.0, processed=100),
    ]
    pol = make_policy("lpm", cache_with(PREFIX), lpm_max_wait_tokens=500)
    run(pol, q, processed_tokens=600)  # miss waited 500 tokens: not more than the bound
    assert rids(q) == ["hit", "miss"]
    run(pol, q, processed_tokens=601)
    assert rids(q) == ["miss", "hit"]


def test_starvation_bound_only_for_lpm() -> None:
    q = [mk("hit", [*PREFIX[:90], 1], t=9.0), mk("miss", [5, 5], t=0.0)]
    pol = make_policy("shortest-prefill-first", cache_with(PREFIX), lpm_max_wait_s=1.0)
    run(pol, q, now=100.0)
    assert rids(q) == ["hit", "miss"]


# ---- the queue-length cap ------------------------------------------------------------------


def _cap_queue(n: int) -> list[Req]:
    # Reverse-arrival list order; match length grows with the index.
    q = [mk(f"r{i:03d}", [*PREFIX[: i % 90], 9000 + i], t=float(n - i)) for i in range(n)]
    return q


@pytest.mark.parametrize("name", ["lpm", "hrrn"])
def test_compat_cap_is_128_strictly_greater(name: str) -> None:
    pol = make_policy(name, cache_with(PREFIX), compat="sglang", **NO_DEDUP)
    assert pol.prefix_match_cap == SGLANG_PREFIX_MATCH_CAP == 128
    q = _cap_queue(128)
    res = run(pol, q, processed_tokens=10_000)
    assert res.active_policy == name
    assert rids(q)[0] == "r089"  # the longest match (89) leads
    q = _cap_queue(129)
    before = rids(q)
    res = run(pol, q, processed_tokens=10_000)
    assert res.active_policy == "fcfs"
    assert rids(q) == before  # compat fallback: the list order is left alone
    assert pol.active_policy_name == "fcfs"


@pytest.mark.parametrize("name", ["lpm", "hrrn"])
def test_radixsched_has_no_cap_by_default(name: str) -> None:
    pol = make_policy(name, cache_with(PREFIX), **NO_DEDUP)
    assert pol.prefix_match_cap is None
    q = _cap_queue(300)
    res = run(pol, q, processed_tokens=10_000)
    assert res.active_policy == name
    assert q[0].num_matched_prefix_tokens == 89


def test_max_prefix_match_queue_radixsched_falls_back_to_arrival() -> None:
    pol = make_policy("lpm", cache_with(PREFIX), max_prefix_match_queue=4, **NO_DEDUP)
    q = _cap_queue(4)
    assert run(pol, q).active_policy == "lpm"
    assert rids(q) == ["r003", "r002", "r001", "r000"]  # by match length
    q = _cap_queue(5)
    assert run(pol, q).active_policy == "fcfs"
    assert rids(q) == ["r004", "r003", "r002", "r001", "r000"]  # by arrival (t = 5 - i)
    assert q[0].num_matched_prefix_tokens == 4  # still recorded for the load snapshot


def test_max_prefix_match_queue_compat_overrides_128() -> None:
    pol = make_policy("lpm", cache_with(PREFIX), max_prefix_match_queue=4, compat="sglang")
    q = _cap_queue(5)
    q.reverse()
    before = rids(q)
    assert run(pol, q).active_policy == "fcfs"
    assert rids(q) == before


@pytest.mark.parametrize("name", ["dfs-weight", "shortest-prefill-first"])
def test_dfs_and_spf_are_never_capped(name: str) -> None:
    pol = make_policy(name, cache_with(PREFIX), compat="sglang", max_prefix_match_queue=2)
    q = _cap_queue(5)
    assert run(pol, q).active_policy == name


# ---- hrrn -------------------------------------------------------------------------------------


def test_hrrn_radixsched_ratio_then_arrival() -> None:
    # uncached = fill - match; waited = processed_tokens - entry snapshot (1000 here).
    q = [
        mk("b_fresh", [1] * 10, t=2.0, processed=1000),  # ratio 0
        mk("a_fresh", [2] * 10, t=1.0, processed=1000),  # ratio 0, earlier
        mk("slow", [3] * 100, t=0.0, processed=0),  # 1000 / 100 = 10
        mk("fast", [4] * 10, t=0.5, processed=500),  # 500 / 10 = 50
        mk("hit", [*PREFIX[:90], 5], t=0.7, processed=800),  # 200 / 1 = 200
    ]
    run(make_policy("hrrn", cache_with(PREFIX), **NO_DEDUP), q, processed_tokens=1000)
    assert rids(q) == ["hit", "fast", "slow", "a_fresh", "b_fresh"]


def test_hrrn_compat_ties_by_rid() -> None:
    q = [
        mk("b_fresh", [1] * 10, t=1.0, processed=1000),
        mk("a_fresh", [2] * 10, t=2.0, processed=1000),
        mk("slow", [3] * 100, t=0.0, processed=0),
    ]
    run(make_policy("hrrn", cache_with(PREFIX), compat="sglang", **NO_DEDUP), q, processed_tokens=1000)
    assert rids(q) == ["slow", "a_fresh", "b_fresh"]


def test_hrrn_uncached_counts_output_only_in_radixsched() -> None:
    # A retracted request: its prompt is fully cached, its output is not.
    def queue() -> list[Req]:
        return [
            mk("waiting", [3] * 10, t=0.0, processed=0),  # 1000 / 10 = 100
            mk("replay", PREFIX[:50], t=1.0, output=[8] * 30, processed=900),
        ]

    cache = cache_with(PREFIX[:50])
    q = queue()
    run(make_policy("hrrn", cache, **NO_DEDUP), q, processed_tokens=1000)
    # radixsched: replay uncached = 80 - 50 = 30, ratio 100/30 = 3.3
    assert rids(q) == ["waiting", "replay"]
    q = queue()
    run(make_policy("hrrn", cache, compat="sglang", **NO_DEDUP), q, processed_tokens=1000)
    # compat: prompt 50 - match 50 = 0 uncached: "drain immediately"
    assert rids(q) == ["replay", "waiting"]


def test_hrrn_without_clock_orders_by_arrival() -> None:
    q = [mk("z", [1] * 5, t=1.0), mk("a", [2] * 5, t=2.0)]
    run(make_policy("hrrn", cache_with()), q)
    assert rids(q) == ["z", "a"]


# ---- shortest-prefill-first ------------------------------------------------------------------


def test_spf_order_work_includes_output() -> None:
    q = [
        mk("long", [3] * 200, t=0.0),  # 200
        mk("hit", [*PREFIX[:90], 5, 6], t=1.0),  # 92 - 90 = 2
        mk("retracted", [4] * 5, t=2.0, output=[9] * 20),  # 25
        mk("short_late", [5] * 10, t=4.0),  # 10
        mk("short_early", [6] * 10, t=3.0),  # 10
    ]
    run(make_policy("shortest-prefill-first", cache_with(PREFIX), **NO_DEDUP), q)
    assert rids(q) == ["hit", "short_early", "short_late", "retracted", "long"]
    assert [prefill_work(r) for r in q] == [2, 10, 10, 25, 200]


def test_spf_work_is_at_least_one() -> None:
    r = mk("r", PREFIX)
    run(make_policy("shortest-prefill-first", cache_with(PREFIX)), [r])
    assert r.num_matched_prefix_tokens == 99 and prefill_work(r) == 1


# ---- dfs-weight -------------------------------------------------------------------------------


def _dfs_cache_and_queue() -> tuple[RadixCache, list[Req]]:
    # Spec 3.9 worked example: root -> [1] -> {[10], [11]}, root -> [2, 20].
    cache = cache_with([1, 10], [1, 11], [2, 20])
    q = [
        mk("leaf_2_20", [2, 20], t=0.0),
        mk("leaf_11", [1, 11], t=1.0),
        mk("leaf_10a", [1, 10], t=2.0),
        mk("leaf_10b", [1, 10], t=3.0),
        mk("node_1", [1], t=4.0),
    ]
    return cache, q


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_dfs_weight_worked_example(compat: str) -> None:
    cache, q = _dfs_cache_and_queue()
    res = run(make_policy("dfs-weight", cache, compat=compat), q)
    # handles [2_20, 11, 10, 10, node1] -> permutation [2, 3, 1, 4, 0]
    assert rids(q) == ["leaf_10a", "leaf_10b", "leaf_11", "node_1", "leaf_2_20"]
    assert res.active_policy == "dfs-weight"


def test_dfs_weight_ties_keep_creation_order() -> None:
    cache, q = _dfs_cache_and_queue()
    q = [q[0], q[1]]
    run(make_policy("dfs-weight", cache), q)
    assert rids(q) == ["leaf_11", "leaf_2_20"]


# ---- in-batch dedup ---------------------------------------------------------------------------

SHARED = list(range(5000, 5040))  # 40 uncached tokens several requests share


def _dedup_queue() -> list[Req]:
    return [
        mk("first_long", [*SHARED, *range(100)], t=1.0),  # work 140, first in list
        mk("old_mid", [*SHARED, *range(20)], t=0.0),  # work 60, oldest
        mk("short_late", [*SHARED, 1, 2], t=3.0),  # work 42: cheapest
        mk("short_early", [*SHARED, 3, 4], t=2.0),  # work 42: cheapest, older
        mk("other", list(range(7000, 7050)), t=0.5),  # no shared prefix
        mk("short_total", SHARED[:20], t=0.1),  # shorter than the threshold: never a duplicate
        mk("cached", [*PREFIX[:60], *SHARED], t=0.2),  # match 60 > 32: not checked
    ]


def test_dedup_radixsched_cheapest_then_oldest_represents_and_others_deferred() -> None:
    q = _dedup_queue()
    res = run(make_policy("lpm", cache_with(PREFIX)), q)
    dups = {"first_long", "old_mid", "short_late"}
    assert res.deprioritized == dups and res.deferred == dups
    # lpm: cached (60) first, then matches 0 by arrival, duplicates last (by arrival)
    assert rids(q) == [
        "cached",
        "short_total",
        "other",
        "short_early",
        "old_mid",
        "first_long",
        "short_late",
    ]


def test_dedup_compat_first_in_list_wins_and_is_not_binding() -> None:
    q = _dedup_queue()
    res = run(make_policy("lpm", cache_with(PREFIX), compat="sglang"), q)
    dups = {"old_mid", "short_late", "short_early"}
    assert res.deprioritized == dups and res.deferred == frozenset()
    assert rids(q) == [
        "cached",
        "first_long",
        "other",
        "short_total",
        "old_mid",
        "short_late",
        "short_early",
    ]


def test_dedup_thresholds() -> None:
    # deprioritize threshold 41: 40 shared tokens are no longer enough
    res = run(
        make_policy("lpm", cache_with(PREFIX), in_batch_prefix_deprioritize_threshold=41),
        _dedup_queue(),
    )
    assert not res.deprioritized
    # check threshold -1 disables the check
    res = run(make_policy("lpm", cache_with(PREFIX), **NO_DEDUP), _dedup_queue())
    assert not res.deprioritized
    # check threshold 60 includes the "cached" request (match 60): it shares no first-32 tokens
    q = [mk("cached", [*PREFIX[:60], *SHARED], t=0.0), mk("c2", [*PREFIX[:60], 1], t=1.0)]
    res = run(make_policy("lpm", cache_with(PREFIX), in_batch_prefix_check_threshold=60), q)
    assert res.deferred == {"cached"}  # c2 has 1 uncached token vs 40: c2 represents

"""Waiting-queue policies: hand-made queues with the expected order written out."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixsched.cache import CacheKey, NoReuseCache, RadixCache, TokenAllocator
from radixsched.cache.base import BasePrefixCache, PrefixHolder
from radixsched.config import SchedulerConfig
from radixsched.policy import (
    POLICIES,
    SGLANG_PREFIX_MATCH_CAP,
    WAITING_PREFIX_REFRESH_INTERVAL,
    WAITING_PREFIX_REFRESH_SPAN,
    PriorityResult,
    SchedulePolicy,
    VirtualTokenCounter,
    policy_names,
    prefill_work,
    validate_priority,
)
from radixsched.queue_order import HrrnRound, LazyShuffle
from radixsched.request import Req, SamplingParams
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads import load_workload

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
    next_slot = 1
    for s in seqs:
        arr = np.asarray(s, dtype=np.int32)
        # Unique slots per insert: the cache keeps only the not-yet-cached tail.
        cache.insert(CacheKey(arr, ns), np.arange(next_slot, next_slot + len(arr), dtype=np.int64))
        next_slot += len(arr)
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
    assert res == PriorityResult("fcfs", frozenset(), frozenset(), False)
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


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 40), seed=st.integers(0, 2**32), reads=st.lists(st.integers(0, 45)))
def test_lazy_shuffle_draws_the_prefix_of_the_full_shuffle(
    n: int, seed: int, reads: list[int]
) -> None:
    """Reading positions in any increasing pattern gives the same first positions as the full
    shuffle from the same generator state, and the list stays a permutation."""
    items = list(range(n))
    full = list(items)
    LazyShuffle(random.Random(seed), full).draw(n)
    lazy = list(items)
    shuffle = LazyShuffle(random.Random(seed), lazy)
    end = 0
    for r in sorted(reads):
        shuffle.draw(r)
        end = max(end, min(r, n))
        assert shuffle.done == end
    assert lazy[:end] == full[:end]
    assert sorted(lazy) == items


def test_lazy_shuffle_is_uniform() -> None:
    """Every ordered pair (first, second) of a 4-list is equally likely (a chi-square bound
    far above what a correct shuffle reaches and far below a biased one's)."""
    rng = random.Random(3)
    counts: Counter[tuple[int, int]] = Counter()
    trials = 24_000
    for _ in range(trials):
        q = [0, 1, 2, 3]
        LazyShuffle(rng, q).draw(2)
        counts[(q[0], q[1])] += 1
    assert len(counts) == 12
    expected = trials / 12
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 40.0  # 11 degrees of freedom: p < 1e-4 beyond 36


def test_random_lazy_round_orders_only_what_is_read() -> None:
    """calc_priority(lazy=True) leaves the queue alone and hands back the draw; drawing the
    whole queue gives exactly the eager round's order. A round that refreshes the waiting
    prefixes draws the head it touches first."""
    base = [mk(f"r{i}", [i + 1], t=float(i)) for i in range(30)]
    eager, lazy = list(base), list(base)
    quiet = {"enable_waiting_prefix_refresh": False}
    make_policy("random", seed=5, **quiet).calc_priority(eager, [], 0, 0.0)
    res = make_policy("random", seed=5, **quiet).calc_priority(lazy, [], 0, 0.0, lazy=True)
    assert isinstance(res.lazy, LazyShuffle) and res.lazy.done == 0
    assert rids(lazy) == rids(base)
    assert rids(res.lazy.head(len(lazy))) == rids(eager)
    assert rids(lazy) == rids(eager)
    refreshed = list(base)
    res = make_policy("random", seed=5).calc_priority(refreshed, [], 0, 0.0, lazy=True)
    assert isinstance(res.lazy, LazyShuffle)
    assert res.lazy.done == len(base)  # a refresh round: the head it touches is drawn
    assert rids(refreshed) == rids(eager)
    # compat keeps SGLang's eager shuffle even when the caller could read lazily
    compat = list(base)
    assert (
        make_policy("random", seed=5, compat="sglang")
        .calc_priority(compat, [], 0, 0.0, lazy=True)
        .lazy
        is None
    )
    assert rids(compat) != rids(base)


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


def test_cache_agnostic_policies_keep_the_entry_snapshot() -> None:
    """Cache-agnostic policies never re-match per round (SGLang never does either): the
    matched length the scheduler recorded at queue entry (the router's load snapshot) stays,
    and fair (cache-aware within a tenant's turn) refreshes it."""
    cache = cache_with(PREFIX)
    for name in ("fcfs", "lof", "random", "routing-key"):
        r = mk("r", [*PREFIX[:30], 5])
        r.num_matched_prefix_tokens = 7  # as recorded at entry
        res = run(make_policy(name, cache), [r])
        assert r.num_matched_prefix_tokens == 7 and r.last_node is None
        assert not res.prefix_matched and res.active_policy == name
    r = mk("r", [*PREFIX[:30], 5])
    res = run(make_policy("fair", cache), [r])
    assert r.num_matched_prefix_tokens == 30 and res.prefix_matched


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
    q = _cap_queue(128)[::-1]
    res = run(pol, q, processed_tokens=10_000)
    assert res.active_policy == name
    # lpm: the longest match (89) leads; hrrn: every ratio ties (1 uncached token), rid order
    assert rids(q)[0] == ("r089" if name == "lpm" else "r000")
    q = _cap_queue(129)[::-1]
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
    assert max(r.num_matched_prefix_tokens for r in q) == 89
    if name == "lpm":
        assert q[0].num_matched_prefix_tokens == 89


def test_max_prefix_match_queue_radixsched_falls_back_to_arrival() -> None:
    pol = make_policy("lpm", cache_with(PREFIX), max_prefix_match_queue=4, **NO_DEDUP)
    q = _cap_queue(4)
    assert run(pol, q).active_policy == "lpm"
    assert rids(q) == ["r003", "r002", "r001", "r000"]  # by match length
    q = _cap_queue(5)
    assert run(pol, q).active_policy == "fcfs"
    assert rids(q) == ["r004", "r003", "r002", "r001", "r000"]  # by arrival (t = 5 - i)
    # Above the cap nothing is matched: the entry-time load snapshot is left as it was.
    assert q[0].num_matched_prefix_tokens == 0


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


@settings(max_examples=120, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from([-3.0, -2.5, -1.0, 0.0, float("inf"), float("-inf")]),
            st.integers(0, 2),
            st.integers(0, 2),
        ),
        max_size=60,
    ),
    reads=st.integers(0, 70),
    data=st.data(),
)
def test_hrrn_round_hands_out_the_total_order(
    rows: list[tuple[float, int, int]], reads: int, data: st.DataObject
) -> None:
    """``HrrnRound`` (the lazy hrrn round): reading positions one by one, past its first
    selections and through heavy ties, gives the sort by (ratio, entry, arrival, rid); ``head``
    agrees, and every position is handed out once."""
    rid_order = data.draw(st.permutations(range(len(rows))))
    reqs = [mk(f"q{rid_order[i]:02d}", [1], t=0.0) for i in range(len(rows))]
    ratio = np.array([r[0] for r in rows], dtype=np.float64)
    entry = np.array([r[1] for r in rows], dtype=np.float64)
    arrival = np.array([r[2] for r in rows], dtype=np.float64)
    want = sorted(range(len(rows)), key=lambda i: (*rows[i], reqs[i].rid))
    rnd = HrrnRound(reqs, ratio, entry, arrival)
    got = []
    for i in range(min(reads, len(rows) + 1)):
        pos = rnd.position(i)
        if pos is None:
            assert i == len(rows)
            break
        got.append(pos)
    assert got == want[: len(got)]
    assert [r.rid for r in rnd.head(len(rows))] == [reqs[i].rid for i in want]


def test_hrrn_compat_ties_by_rid() -> None:
    q = [
        mk("b_fresh", [1] * 10, t=1.0, processed=1000),
        mk("a_fresh", [2] * 10, t=2.0, processed=1000),
        mk("slow", [3] * 100, t=0.0, processed=0),
    ]
    run(
        make_policy("hrrn", cache_with(PREFIX), compat="sglang", **NO_DEDUP),
        q,
        processed_tokens=1000,
    )
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
    # deprioritize threshold 41: the short ones (40 shared) no longer count; first_long and
    # old_mid still share 60 tokens, and old_mid is cheaper
    res = run(
        make_policy("lpm", cache_with(PREFIX), in_batch_prefix_deprioritize_threshold=41),
        _dedup_queue(),
    )
    assert res.deferred == {"first_long"}
    res = run(
        make_policy("lpm", cache_with(PREFIX), in_batch_prefix_deprioritize_threshold=61),
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


def test_dedup_compat_zero_threshold_deprioritizes_every_candidate() -> None:
    q = [mk("a", [1, 2], t=0.0), mk("b", [3, 4], t=1.0)]
    pol = make_policy("lpm", compat="sglang", in_batch_prefix_deprioritize_threshold=0)
    assert run(pol, q).deprioritized == {"a", "b"}
    # radixsched: everything shares >= 0 tokens, so one representative per namespace
    q = [mk("a", [1, 2], t=0.0), mk("b", [3], t=1.0), mk("c", [5], t=2.0, extra_key="k")]
    res = run(make_policy("lpm", in_batch_prefix_deprioritize_threshold=0), q)
    assert res.deferred == {"a"}


def test_dedup_respects_namespaces() -> None:
    q = [mk("a", [*SHARED, 1], t=0.0), mk("b", [*SHARED, 2], t=1.0, extra_key="lora-1")]
    assert not run(make_policy("lpm"), q).deprioritized


def test_dedup_overdue_request_represents_its_group() -> None:
    q = [mk("cheap", [*SHARED, 1], t=9.0), mk("old_big", [*SHARED, *range(200)], t=0.0)]
    pol = make_policy("lpm", lpm_max_wait_s=5.0)
    res = run(pol, q, now=10.0)
    assert res.deferred == {"cheap"} and rids(q) == ["old_big", "cheap"]
    q = [mk("cheap", [*SHARED, 1], t=9.0), mk("old_big", [*SHARED, *range(200)], t=8.0)]
    res = run(pol, q, now=10.0)
    assert res.deferred == {"old_big"} and rids(q) == ["cheap", "old_big"]


@pytest.mark.parametrize("name", ["hrrn", "shortest-prefill-first"])
def test_dedup_moves_duplicates_last_for_hrrn_and_spf(name: str) -> None:
    q = [
        mk("dup", [*SHARED, 1, 2, 3], t=0.0, processed=0),  # would lead on its own
        mk("rep", [*SHARED, 1], t=5.0, processed=0),
        mk("other", list(range(7000, 7100)), t=6.0, processed=0),
    ]
    res = run(make_policy(name), q, processed_tokens=1000)
    assert res.deferred == {"dup"} and rids(q)[-1] == "dup"
    q = [q[2], q[0], q[1]]
    res = run(make_policy(name, compat="sglang"), q, processed_tokens=1000)
    assert res.deprioritized == {"rep"} and not res.deferred and rids(q)[-1] == "rep"


def test_dfs_weight_dedup_radixsched_only() -> None:
    q = [
        mk("dup", [*SHARED, 1, 2], t=0.0),
        mk("rep", [*SHARED, 1], t=1.0),
        mk("x", [9] * 40, t=2.0),
    ]
    res = run(make_policy("dfs-weight"), q)
    assert res.deferred == {"dup"} and rids(q) == ["rep", "x", "dup"]
    q = [
        mk("dup", [*SHARED, 1, 2], t=0.0),
        mk("rep", [*SHARED, 1], t=1.0),
        mk("x", [9] * 40, t=2.0),
    ]
    res = run(make_policy("dfs-weight", compat="sglang"), q)
    assert not res.deprioritized and rids(q) == ["dup", "rep", "x"]


def _reference_dedup(queue: list[Req], check: int, threshold: int) -> set[str]:
    """SGLang's algorithm (spec 1.5) with a temporary page-1 radix tree."""
    tree = RadixCache(None, page_size=1)
    dup: set[str] = set()
    for r in queue:
        if r.prefix_len > check:
            continue
        key = CacheKey(r.fill_ids(), r.namespace)
        if tree.match_len(key) >= threshold:
            dup.add(r.rid)
        else:
            tree.insert(key, np.arange(1, r.fill_len + 1, dtype=np.int64))
    return dup


req_specs = st.lists(
    st.tuples(
        st.lists(st.integers(0, 2), min_size=1, max_size=8),  # prompt, tiny vocab
        st.lists(st.integers(0, 2), max_size=2),  # output
        st.sampled_from([None, "k"]),  # extra_key
        st.integers(0, 3),  # arrival
    ),
    max_size=14,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=req_specs,
    cached=st.lists(st.integers(0, 2), max_size=6),
    check=st.integers(-1, 4),
    threshold=st.integers(0, 4),
)
def test_dedup_matches_temporary_radix_tree(
    specs: list[tuple[list[int], list[int], str | None, int]],
    cached: list[int],
    check: int,
    threshold: int,
) -> None:
    def queue() -> list[Req]:
        return [
            mk(f"r{i}", p, output=o, extra_key=k, t=float(t))
            for i, (p, o, k, t) in enumerate(specs)
        ]

    cfg = {
        "in_batch_prefix_check_threshold": check,
        "in_batch_prefix_deprioritize_threshold": threshold,
    }
    # compat: first in list order wins (identical to SGLang's temporary tree)
    q = queue()
    res = run(make_policy("lpm", cache_with(cached), compat="sglang", **cfg), list(q))
    expected = set() if check < 0 else _reference_dedup(q, check, threshold)
    assert res.deprioritized == expected and not res.deferred
    # radixsched: the same algorithm over candidates in (work, entry, arrival, rid) order
    q = queue()
    pol = make_policy("lpm", cache_with(cached), **cfg)
    res = run(pol, list(q))
    cache = cache_with(cached)
    for r in q:
        r.prefix_len = cache.match_len(CacheKey(r.fill_ids(), r.namespace))
    order = sorted(q, key=lambda r: (prefill_work(r), r.queue_entry_time, r.arrival_time, r.rid))
    if threshold <= 0:  # radixsched: one representative per namespace
        cands = [r for r in order if r.prefix_len <= check]
        reps = {r.namespace: r.rid for r in reversed(cands)}
        expected = {r.rid for r in cands} - set(reps.values()) if check >= 0 else set()
    else:
        expected = set() if check < 0 else _reference_dedup(order, check, threshold)
    assert res.deferred == expected == res.deprioritized


# ---- spf chunk limit ---------------------------------------------------------------------------


def _chunked(fill: int, prefix: int) -> Req:
    r = mk("chunked", [1] * fill)
    r.prefix_len = prefix
    return r


def _works(*works: int) -> list[Req]:
    return [mk(f"w{i}", [2] * w, t=float(i)) for i, w in enumerate(works)]


def test_spf_chunk_limit_cases() -> None:
    pol = make_policy("shortest-prefill-first")
    # reserve 8 + 12 + 32 = 52 (page 4); the 100-token request would not fit in 64 - 4
    assert pol.shortest_prefill_chunk_limit(_chunked(200, 50), _works(5, 10, 30, 100), 64, 4) == 12
    # stop at the first request not shorter than the continuation's remainder (8)
    assert pol.shortest_prefill_chunk_limit(_chunked(58, 50), _works(5, 10), 64, 4) == 56
    # nothing reserved -> no cap
    assert pol.shortest_prefill_chunk_limit(_chunked(58, 50), _works(8, 1), 64, 4) is None
    assert pol.shortest_prefill_chunk_limit(_chunked(200, 50), [], 64, 4) is None
    # budget below two pages -> no cap
    assert pol.shortest_prefill_chunk_limit(_chunked(200, 50), _works(1), 7, 4) is None
    # exactly two pages: a 1-token request charges one page and leaves one
    assert pol.shortest_prefill_chunk_limit(_chunked(200, 50), _works(1), 8, 4) == 4
    # a request whose charge would leave no page for the continuation is not reserved
    assert pol.shortest_prefill_chunk_limit(_chunked(200, 50), _works(5), 8, 4) is None
    # page 1: exact arithmetic
    assert pol.shortest_prefill_chunk_limit(_chunked(1000, 0), _works(3, 7), 100, 1) == 90


def test_spf_chunk_limit_only_for_spf() -> None:
    for name in ("fcfs", "lpm", "hrrn", "dfs-weight"):
        pol = make_policy(name)
        assert pol.shortest_prefill_chunk_limit(_chunked(200, 50), _works(5), 64, 4) is None


def test_spf_chunk_limit_skips_deferred_in_radixsched() -> None:
    def queue() -> list[Req]:
        return [mk("rep", [*SHARED, 1], t=0.0), mk("dup", [*SHARED, 2, 3], t=1.0)]

    pol = make_policy("shortest-prefill-first")
    q = queue()
    assert run(pol, q).deferred == {"dup"}
    assert pol.shortest_prefill_chunk_limit(_chunked(1000, 0), q, 200, 1) == 200 - 41
    pol = make_policy("shortest-prefill-first", compat="sglang")
    q = queue()
    run(pol, q)
    assert pol.shortest_prefill_chunk_limit(_chunked(1000, 0), q, 200, 1) == 200 - 41 - 42


# ---- fair (virtual token counter) ----------------------------------------------------------


def _admit(
    pol: SchedulePolicy, queue: list[Req], budget: int, rnd: int, processed: int
) -> list[Req]:
    """One round: order, admit by a token budget (at least one request), charge prefill."""
    res = pol.calc_priority(queue, [], processed, float(rnd))
    admitted: list[Req] = []
    used = 0
    for r in queue:
        if r.rid in res.deferred:
            continue
        work = prefill_work(r)
        if admitted and used + work > budget:
            break
        admitted.append(r)
        used += work
    for r in admitted:
        queue.remove(r)
        pol.on_service(r, prefill_work(r), 0)
    return admitted


def _flood_rounds(policy: str, rounds: int = 30) -> list[int]:
    """Tenant A floods 300 requests at t=0; B sends one request per round. Returns B's waits."""
    pol = make_policy(policy)
    queue = [mk(f"A{i}", [i % 50 + 1] * 100, t=0.0, tenant="A") for i in range(300)]
    arrived: dict[str, int] = {}
    waits: list[int] = []
    for rnd in range(rounds):
        b = mk(f"B{rnd}", [7000 + rnd] * 100, t=float(rnd) + 0.5, tenant="B")
        queue.append(b)
        arrived[b.rid] = rnd
        for r in _admit(pol, queue, 400, rnd, 0):
            if r.tenant == "B":
                waits.append(rnd - arrived[r.rid])
    return waits


def test_fair_serves_light_tenant_despite_flood() -> None:
    waits = _flood_rounds("fair")
    assert len(waits) == 30 and max(waits) == 0
    fcfs_waits = _flood_rounds("fcfs")  # the contrast: B queues behind the flood
    assert len(fcfs_waits) == 0


def test_fair_service_difference_stays_bounded() -> None:
    pol = make_policy("fair")
    big = [mk(f"A{i}", [1] * 1000, t=0.0, tenant="A") for i in range(60)]
    small = [mk(f"B{i}", [2] * 10, t=0.0, tenant="B") for i in range(6000)]
    queue = big + small
    budget = 2000
    for rnd in range(40):
        _admit(pol, queue, budget, rnd, 0)
        a, b = pol.fair.counters["A"], pol.fair.counters["B"]
        assert abs(a - b) <= 2 * 1000 + budget, (rnd, a, b)
    assert pol.fair.counters["A"] > 10_000 and pol.fair.counters["B"] > 10_000


def test_fair_lift_returning_tenant_banks_no_credit() -> None:
    pol = make_policy("fair")
    queue = [mk(f"A{i}", [1] * 100, t=0.0, tenant="A") for i in range(50)]
    for rnd in range(5):
        _admit(pol, queue, 300, rnd, 0)
    a = pol.fair.counters["A"]
    assert a == 5 * 300
    queue += [mk(f"B{i}", [2] * 100, t=10.0, tenant="B") for i in range(10)]
    pol.calc_priority(queue, [], 0, 10.0)
    assert pol.fair.counters["B"] == a  # lifted to A's counter, not 0
    # the two tenants now alternate (tie on counter: A's head arrived first)
    assert [r.tenant for r in queue[:4]] == ["A", "B", "A", "B"]


def test_fair_running_requests_keep_a_tenant_active() -> None:
    pol = make_policy("fair")
    running = [mk("A_run", [1], tenant="A")]
    pol.calc_priority([], running, 0, 0.0)  # A is active (running) with nothing waiting
    pol.fair.charge("A", 1000, 0)
    pol.calc_priority([mk("B0", [2], tenant="B")], running, 0, 0.0)
    assert pol.fair.counters["B"] == 1000.0  # A stayed active (running): B lifted to it
    pol.calc_priority([mk("B1", [2], tenant="B")], [], 0, 1.0)
    pol.fair.charge("A", 500, 0)
    pol.calc_priority([mk("A1", [1], tenant="A")], [], 0, 2.0)
    # A became active again while B stayed: max(1500, B's 1000) = 1500
    assert pol.fair.counters["A"] == 1500.0


def test_fair_decode_weighting_and_within_tenant_affinity() -> None:
    cache = cache_with(PREFIX)
    pol = make_policy("fair", cache)
    pol.on_service(mk("x", [1], tenant="A"), 10, 5)
    assert pol.fair.counters["A"] == 10 * 1.0 + 5 * 2.0
    q = [
        mk("a_miss", [9] * 20, t=0.0, tenant="A"),
        mk("a_hit", [*PREFIX[:50], 1], t=1.0, tenant="A"),
        mk("b", [8] * 20, t=0.0, tenant="B"),
    ]
    pol.calc_priority(q, [], 0, 0.0)
    # B (lifted to A's 20) ties A; A's head (a_hit, t=1) arrived after b (t=0)
    assert rids(q) == ["b", "a_hit", "a_miss"]


def test_on_service_is_a_noop_for_other_policies() -> None:
    pol = make_policy("lpm")
    pol.on_service(mk("x", [1], tenant="A"), 10, 5)
    assert pol.fair.counters == {}


def test_tenant_key_falls_back_to_routing_key() -> None:
    pol = make_policy("fair")
    pol.on_service(mk("x", [1], routing_key="rk"), 3, 0)
    assert pol.fair.counters == {"rk": 3.0}


# ---- waiting-prefix touch -----------------------------------------------------------------------


class SpyCache(RadixCache):
    def __init__(self, **kw: object) -> None:
        super().__init__(None, page_size=1, **kw)  # type: ignore[arg-type]
        self.touched: list[int] = []

    def touch_prefix(self, key: CacheKey) -> None:
        self.touched.append(int(key.tokens[0]))
        super().touch_prefix(key)

    def touch_prefixes(self, keys: Iterable[CacheKey]) -> None:
        keys = list(keys)
        self.touched.extend(int(k.tokens[0]) for k in keys)
        super().touch_prefixes(keys)

    def touch_request_prefixes(self, reqs: Iterable[PrefixHolder]) -> None:
        reqs = list(reqs)
        self.touched.extend(int(r.fill_ids()[0]) for r in reqs)
        # Counted here only: the radix cache's fast path touches through touch_prefixes too.
        before = len(self.touched)
        super().touch_request_prefixes(reqs)
        del self.touched[before:]


def _touch_counts(name: str, rounds: int, n: int = 200, **cfg: object) -> list[int]:
    cache = SpyCache(eviction_policy=str(cfg.pop("radix_eviction_policy", "lru")))
    pol = make_policy(name, cache, radix_eviction_policy=cache.eviction_policy, **cfg)
    q = [mk(f"r{i}", [i + 1, 5], t=float(i)) for i in range(n)]
    counts = []
    for _ in range(rounds):
        before = len(cache.touched)
        pol.calc_priority(q, [], 0, 0.0)
        counts.append(len(cache.touched) - before)
    return counts


def test_waiting_prefix_touch_every_32_rounds_over_128_head_last() -> None:
    counts = _touch_counts("fcfs", 2 * WAITING_PREFIX_REFRESH_INTERVAL + 1)
    span = WAITING_PREFIX_REFRESH_SPAN
    assert counts[0] == span and counts[32] == span and counts[64] == span
    assert sum(counts) == 3 * span
    cache = SpyCache()
    pol = make_policy("fcfs", cache)
    q = [mk(f"r{i}", [i + 1, 5], t=float(i)) for i in range(200)]
    pol.calc_priority(q, [], 0, 0.0)
    assert cache.touched == list(range(128, 0, -1))  # reversed(queue[:128]): head touched last


@pytest.mark.parametrize(
    ("name", "cfg", "expected"),
    [
        ("lpm", {}, 100),  # radixsched lpm scores with match_len: touch keeps prefixes warm
        ("lpm", {"compat": "sglang"}, 0),  # compat: matching already touched
        ("dfs-weight", {}, 100),  # radixsched re-matches only changed subtrees: touch
        ("dfs-weight", {"compat": "sglang"}, 0),  # compat: match_prefix touched every request
        ("routing-key", {"compat": "sglang"}, 100),
        ("fcfs", {"radix_eviction_policy": "lfu"}, 0),
        ("fcfs", {"enable_waiting_prefix_refresh": False}, 0),
    ],
)
def test_waiting_prefix_touch_eligibility(name: str, cfg: dict[str, object], expected: int) -> None:
    assert _touch_counts(name, 1, n=100, **cfg) == [expected]


def test_compat_lpm_above_cap_touches_like_fcfs() -> None:
    # Above 128 the active policy is fcfs (cache-agnostic): SGLang touches then.
    assert _touch_counts("lpm", 1, n=200, compat="sglang") == [WAITING_PREFIX_REFRESH_SPAN]


def test_no_touch_with_disabled_cache_or_empty_queue() -> None:
    cache = SpyCache(disable=True)
    pol = make_policy("fcfs", cache)
    pol.calc_priority([mk("a", [1])], [], 0, 0.0)
    assert cache.touched == []
    cache = SpyCache()
    pol = make_policy("fcfs", cache)
    pol.calc_priority([], [], 0, 0.0)
    pol.calc_priority([mk("a", [1])], [], 0, 0.0)
    assert cache.touched == [1]  # the empty round was not an eligible round


# ---- every policy returns a permutation --------------------------------------------------------

perm_specs = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=40),  # prompt
        st.lists(st.integers(0, 3), max_size=3),  # output
        st.sampled_from([None, 0, 3, -2]),  # priority
        st.sampled_from([None, "", "a", "b"]),  # routing key
        st.sampled_from([None, "t1", "t2"]),  # tenant
        st.integers(0, 5),  # arrival
        st.integers(0, 50),  # entry snapshot of the processed-token counter
    ),
    max_size=25,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=perm_specs,
    cached=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), max_size=4),
    name=st.sampled_from(sorted(POLICIES)),
    compat=st.sampled_from(["radixsched", "sglang"]),
    priority=st.booleans(),
    disabled=st.booleans(),
    threshold=st.integers(1, 8),
)
def test_every_policy_returns_a_permutation(
    specs: list[tuple[list[int], list[int], int | None, str | None, str | None, int, int]],
    cached: list[list[int]],
    name: str,
    compat: str,
    priority: bool,
    disabled: bool,
    threshold: int,
) -> None:
    if disabled and name == "shortest-prefill-first":
        return
    cache = cache_with(*cached)
    if disabled:
        cache = RadixCache(None, disable=True)
    pol = make_policy(
        name,
        cache,
        compat=compat,
        enable_priority_scheduling=priority and name in ("fcfs", "lof"),
        in_batch_prefix_deprioritize_threshold=threshold,
        lpm_max_wait_s=2.0,
    )
    queue = [
        mk(f"r{i}", p, output=o, priority=pr, routing_key=rk, tenant=tn, t=float(t), processed=pt)
        for i, (p, o, pr, rk, tn, t, pt) in enumerate(specs)
    ]
    running = queue[: len(queue) // 3]
    before = sorted(rids(queue))
    for rnd in range(2):
        res = pol.calc_priority(queue, running, 40, float(rnd + 3))
        assert sorted(rids(queue)) == before
        assert res.deferred <= res.deprioritized <= set(before)
        if compat == "sglang":
            assert not res.deferred
        for r in queue:
            assert 0 <= r.num_matched_prefix_tokens <= max(r.fill_len - 1, 0)
    cache.check_integrity()


def _reference_key(name: str, compat: bool, dep: frozenset[str], processed: int, now: float):  # type: ignore[no-untyped-def]
    """The spec's sort keys (1.6-1.8) written out directly, one tuple per request."""

    def hrrn_term(r: Req) -> float:
        if r.rid in dep:
            return float("inf")
        uncached = (r.prompt_len if compat else r.fill_len) - r.num_matched_prefix_tokens
        if uncached <= 0:
            return float("-inf")
        return -(max(0, processed - r.queue_entry_processed_tokens) / uncached)

    def key(r: Req) -> tuple[object, ...]:
        if name == "lpm":
            if now - r.queue_entry_time > 2.0:  # the bound the property test configures
                return (0, r.queue_entry_time, r.arrival_time)
            if compat:
                return (1, float("inf") if r.rid in dep else -r.num_matched_prefix_tokens)
            return (
                1,
                r.rid in dep,
                -r.num_matched_prefix_tokens,
                r.queue_entry_time,
                r.arrival_time,
            )
        if name == "hrrn":
            return (
                (hrrn_term(r), r.rid)
                if compat
                else (hrrn_term(r), r.queue_entry_time, r.arrival_time, r.rid)
            )
        work = max(1, r.fill_len - r.num_matched_prefix_tokens)
        if compat:
            return (r.rid in dep, work, r.queue_entry_time)
        return (r.rid in dep, work, r.queue_entry_time, r.arrival_time)

    return key


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=perm_specs,
    cached=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), max_size=4),
    name=st.sampled_from(["lpm", "hrrn", "shortest-prefill-first"]),
    compat=st.sampled_from(["radixsched", "sglang"]),
    threshold=st.integers(1, 8),
    lazy=st.booleans(),
)
def test_cache_aware_orders_equal_the_spec_keys(
    specs: list[tuple[list[int], list[int], int | None, str | None, str | None, int, int]],
    cached: list[list[int]],
    name: str,
    compat: str,
    threshold: int,
    lazy: bool,
) -> None:
    """The order each policy leaves (or, lazily, hands out) is the spec's sort key's."""
    pol = make_policy(
        name,
        cache_with(*cached),
        compat=compat,
        in_batch_prefix_deprioritize_threshold=threshold,
        lpm_max_wait_s=2.0,
    )
    queue = [
        mk(f"r{i}", p, output=o, t=float(t), processed=pt)
        for i, (p, o, _pr, _rk, _tn, t, pt) in enumerate(specs)
    ]
    original = list(queue)
    res = pol.calc_priority(queue, [], 40, 4.0, lazy=lazy)
    key = _reference_key(name, compat == "sglang", res.deprioritized, 40, 4.0)
    got = queue if res.lazy is None else res.lazy.head(len(queue))
    assert rids(got) == rids(sorted(original, key=key)), (name, compat, specs, cached, threshold)


# ---- incremental orders (radixsched) ------------------------------------------------------------


def test_dfs_weight_follows_root_children_moving_up() -> None:
    """dfs-weight's incremental order keys each top-level subtree on its position among the
    root's children: when earlier children are evicted, every waiting subtree moves up, also
    those no request of which changed (here A, while B is re-matched)."""
    alloc = TokenAllocator(10_000, 1)
    cache = RadixCache(alloc, page_size=1)
    seqs = {
        name: np.arange(100 * i + 1, 100 * i + 21, dtype=np.int32)
        for i, name in enumerate(["X", "Y", "A", "B"])
    }
    for s in seqs.values():  # root children in this order: X, Y, A, B
        cache.insert(CacheKey(s), alloc.alloc(len(s)))
    pol = make_policy("dfs-weight", cache)
    ref = make_policy("dfs-weight", cache)
    ref._engine = None  # the full sort every round
    q = [mk("b", [*seqs["B"][:10], 7], t=0.0), mk("a", [*seqs["A"][:10], 7], t=1.0)]
    rq = [mk("b", [*seqs["B"][:10], 7], t=0.0), mk("a", [*seqs["A"][:10], 7], t=1.0)]
    for r in q:
        pol.on_enqueue(r)
    run(pol, q)
    run(ref, rq)
    assert rids(q) == rids(rq) == ["a", "b"]  # equal weights: A comes first among the children
    cache.evict(40)  # X and Y, the least recently used
    assert len(cache.root.children) == 2
    grow = np.concatenate([seqs["B"], [9, 9]]).astype(np.int32)
    slots = alloc.alloc(len(grow))
    res = cache.insert(CacheKey(grow), slots)  # B changes: b is re-matched
    alloc.free(slots[: res.prefix_len])
    run(pol, q)
    run(ref, rq)
    assert rids(q) == rids(rq) == ["a", "b"]


_SAMPLE = Path(__file__).parent / "data" / "mooncake_sample.jsonl"


@pytest.mark.parametrize(
    ("policy", "cfg", "sim"),
    [
        ("lpm", {}, {}),
        ("lpm", {"page_size": 16}, {}),
        ("dfs-weight", {}, {}),
        ("dfs-weight", {"page_size": 16}, {"enable_hierarchical_cache": True}),
        ("shortest-prefill-first", {"page_size": 16}, {}),
        ("hrrn", {}, {}),
        ("fair", {"page_size": 4}, {}),
        ("lof", {}, {}),
        ("routing-key", {}, {}),
        ("fcfs", {"enable_priority_scheduling": True}, {}),
    ],
)
def test_incremental_orders_leave_simulations_bit_identical(
    policy: str, cfg: dict[str, object], sim: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole simulation (retractions included) with the incremental orders, and with every
    round sorting the whole queue as before: the same results, token for token. Guards the
    assumptions the orders make about the scheduler (hooks, the admission match)."""
    w = load_workload(f"mooncake:{_SAMPLE}", num_requests=120)
    rounds: list[str] = []
    engine_round = SchedulePolicy._engine_round

    def counted(self: SchedulePolicy, *args: Any) -> PriorityResult:
        rounds.append(self.spec.name)
        return engine_round(self, *args)

    def run() -> tuple[str, list[list[float]], int]:
        r = simulate(
            w,
            SchedulerConfig(schedule_policy=policy, **cfg),  # type: ignore[arg-type]
            SimConfig(max_total_tokens=60_000, **sim),  # type: ignore[arg-type]
        )
        out = r.result.to_json()
        out.pop("wall_s")
        out.pop("requests_per_wall_s")
        return (
            json.dumps(out, sort_keys=True),
            [q.times.token_times for q in r.requests],
            len(r.requests),
        )

    monkeypatch.setattr(SchedulePolicy, "_engine_round", counted)
    with_engines = run()
    assert len(rounds) > 50  # the incremental orders really ran
    monkeypatch.setattr(SchedulePolicy, "_make_engine", lambda self, bounded: None)
    assert run() == with_engines


@settings(max_examples=60, deadline=None)
@given(
    tenants=st.lists(st.sampled_from(["a", "b", "", "c"]), min_size=0, max_size=30),
    steps=st.integers(1, 500),
    weights=st.tuples(
        st.floats(0.01, 10.0, allow_nan=False), st.floats(0.001, 10.0, allow_nan=False)
    ),
    start=st.floats(0.0, 1e9, allow_nan=False),
)
def test_fair_charge_decode_equals_one_charge_per_request(
    tenants: list[str], steps: int, weights: tuple[float, float], start: float
) -> None:
    reqs = [
        Req(f"r{i}", np.arange(1, 4, dtype=np.int32), tenant=t or None)
        for i, t in enumerate(tenants)
    ]
    one = VirtualTokenCounter(*weights, counters={"a": start})
    grouped = VirtualTokenCounter(*weights, counters={"a": start})
    for r in reqs:
        one.charge(r.tenant_key, 0, steps)
    grouped.charge_decode(reqs, steps)
    assert grouped.counters == one.counters
    assert all(grouped.counters[t] == one.counters[t] for t in one.counters)


@pytest.mark.parametrize(
    ("name", "skippable"),
    [
        ("fcfs", True),
        ("lpm", True),
        ("hrrn", True),
        ("lof", True),
        ("routing-key", True),
        ("shortest-prefill-first", True),
        ("random", True),
        ("fair", True),
        ("dfs-weight", False),
    ],
)
def test_skip_round_keeps_the_refresh_cadence(name: str, skippable: bool) -> None:
    """Rounds skipped while the batch is full: the waiting-prefix refresh still happens on the
    same rounds, over the same requests, as when every round is computed (the scheduler's
    lazy rounds: random draws only what is read, here the refreshed head)."""

    def touched_per_round(skip_every: int) -> tuple[list[list[int]], int]:
        cache = SpyCache()
        pol = make_policy(name, cache)
        q = [mk(f"r{i}", [i + 1, 5], t=float(i)) for i in range(200)]
        rounds, skipped = [], 0
        for k in range(3 * WAITING_PREFIX_REFRESH_INTERVAL + 5):
            before = len(cache.touched)
            if skip_every and k % skip_every and pol.skip_round(q):
                skipped += 1
            else:
                pol.calc_priority(q, [], 0, 0.0, lazy=True)
            rounds.append(cache.touched[before:])
        return rounds, skipped

    reference, _ = touched_per_round(0)
    for every in (2, 3, 7):
        rounds, skipped = touched_per_round(every)
        assert rounds == reference
        assert (skipped > 0) == skippable


@pytest.mark.parametrize("hooked", [True, False])
def test_fair_skipped_round_still_observes_tenants(hooked: bool) -> None:
    """A fair round skipped while the batch is full makes the tenant observation the full
    round makes: a tenant that shows up (or comes back) then is lifted to the least active
    counter then, not at some later round with other counters."""

    def rounds(skip: bool) -> dict[str, float]:
        pol = make_policy("fair", cache_with())
        if not hooked:
            pol._engine = None  # the full recomputation every round
        a1, b1 = mk("a1", [1, 2], t=0.0, tenant="a"), mk("b1", [3, 4], t=1.0, tenant="b")
        q = [a1]
        pol.on_enqueue(a1)
        pol.calc_priority(q, [], 0, 0.0)
        pol.fair.charge("a", 500, 0)  # a was served
        running = [b1]  # b appears in the running batch; the queue still holds a1 only
        if skip:
            assert pol.skip_round(q, running)
        else:
            pol.calc_priority(q, running, 0, 0.0)
        pol.fair.charge("a", 300, 0)
        pol.calc_priority(q, [], 0, 0.0)  # b left: inactive again
        return dict(pol.fair.counters)

    assert rounds(skip=True) == rounds(skip=False)

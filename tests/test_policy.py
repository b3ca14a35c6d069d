"""Waiting-queue policies: hand-made queues with the expected order written out.

Every queue-level case runs twice (the ``kind`` fixture): on the reference ``WaitingQueue`` and
on the accelerated ``NativeWaitingQueue``, with the same expected orders, so the fast queue is held
to the reference on each case. The property tests at the end run the two side by side
(``Twin``) over many rounds with arrivals, admissions, failed admission attempts, retractions,
aborts, skipped rounds and cache changes in between, and compare everything the fast queue
must reproduce: lists, orders, deferred sets, every request's fields, tenant counters, the
random generator and the cache's recency.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixsched.cache import CacheKey, NoReuseCache, RadixCache, TokenAllocator
from radixsched.cache.base import BasePrefixCache
from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.build import build_scheduler
from radixsched.native.matching import NativeMatcher
from radixsched.native.orders import (
    DfsWeightEngine,
    FairEngine,
    HrrnEngine,
    KeyedEngine,
    RoutingKeyEngine,
)
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache
from radixsched.policies import (
    POLICIES,
    SGLANG_PREFIX_MATCH_CAP,
    VirtualTokenCounter,
    get_policy,
    policy_names,
    prefill_work,
    validate_priority,
)
from radixsched.queue import REFRESH_INTERVAL, REFRESH_SPAN, RoundOrder, WaitingQueue
from radixsched.request import Req, SamplingParams
from radixsched.sim.cost.build import build_cost_model
from radixsched.sim.cost.runner import CostModelRunner
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.simulate import simulate
from radixsched.sim.workloads.load import load_workload

# ---- helpers ------------------------------------------------------------------------------

KINDS: dict[str, type[WaitingQueue]] = {"reference": WaitingQueue, "fast": NativeWaitingQueue}
TREES = (RadixCache, NativeRadixCache)


NO_NATIVE = "the accelerated queue runs over the native tree, which is not built or is off"


def tree_class(kind: type[WaitingQueue]) -> type[Any]:
    """The radix tree a queue of ``kind`` runs over: the fast queue's is the native one."""
    if kind is not NativeWaitingQueue:
        return RadixCache
    if core() is None:
        pytest.skip(NO_NATIVE)
    return NativeRadixCache


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type[WaitingQueue]:
    """The queue under test: every queue-level case runs on both, the fast one over the native
    tree (the test's ``RadixCache`` and ``SpyCache`` are the native tree's then)."""
    kind = KINDS[request.param]
    if tree_class(kind) is NativeRadixCache:
        monkeypatch.setitem(globals(), "RadixCache", NativeRadixCache)
        monkeypatch.setitem(globals(), "SpyCache", NativeSpyCache)
    return kind


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


_SLOTS = itertools.count(1)  # unique slot numbers for caches without an allocator


def put(cache: RadixCache, seq: Sequence[int], extra_key: str | None = None) -> None:
    """Insert ``seq`` (an allocator-free cache: slots are unique numbers, never freed)."""
    arr = np.asarray(seq, dtype=np.int32)
    slots = np.fromiter(itertools.islice(_SLOTS, len(arr)), dtype=np.int64, count=len(arr))
    cache.insert(CacheKey(arr, None if extra_key is None else (extra_key, None)), slots)


def cache_with(
    *seqs: Sequence[int], extra_key: str | None = None, kind: type[WaitingQueue] | None = None
) -> Any:
    """A page-1 tree holding ``seqs`` (``kind``: the tree its queues run over)."""
    cache = (RadixCache if kind is None else tree_class(kind))(None, page_size=1)
    for s in seqs:
        put(cache, s, extra_key)
    return cache


def make_queue(
    kind: type[WaitingQueue],
    name: str,
    cache: BasePrefixCache | None = None,
    reqs: Iterable[Req] = (),
    **cfg: Any,
) -> WaitingQueue:
    """A queue of ``kind`` running policy ``name``, with ``reqs`` added in order."""
    config = SchedulerConfig(schedule_policy=name, **cfg)
    queue = kind(config, cache if cache is not None else cache_with(kind=kind))
    for r in reqs:
        queue.add(r)
    return queue


def hands_out_lazily(queue: WaitingQueue) -> bool:
    """The fast queue's hrrn rounds leave the list as it stands and hand their order out."""
    return (
        isinstance(queue, NativeWaitingQueue)
        and isinstance(queue.engine, HrrnEngine)
        and queue.active_policy() is queue.policy
    )


def round_order(
    queue: WaitingQueue, running: Sequence[Req] = (), processed_tokens: int = 0, now: float = 0.0
) -> list[Req]:
    """One round; returns its whole order (read through ``RoundOrder``), checking that it is
    a permutation of the queue and that the list is in that order (but where the fast hrrn
    round hands it out lazily)."""
    members = {id(r) for r in queue.reqs}
    order = queue.begin_round(running, processed_tokens, now)
    got = order.head(len(queue))
    assert len(got) == len(queue) and {id(r) for r in got} == members
    assert order.position(len(queue)) is None
    if not hands_out_lazily(queue):
        assert all(a is b for a, b in zip(queue.reqs, got, strict=True))
    return got


def rids(reqs: Iterable[Req]) -> list[str]:
    return [r.rid for r in reqs]


PREFIX = list(range(1000, 1100))  # a 100-token cached prefix
NO_DEDUP = {"in_batch_prefix_check_threshold": -1}


# ---- registry and validation ------------------------------------------------------------


def test_registry_names() -> None:
    assert (
        set(policy_names())
        == set(POLICIES)
        == {
            "fcfs",
            "lof",
            "random",
            "routing-key",
            "lpm",
            "dfs-weight",
            "hrrn",
            "shortest-prefill-first",
            "fair",
        }
    )
    assert "priority" not in POLICIES
    cache_aware = {n for n, s in POLICIES.items() if s.cache_aware}
    assert cache_aware == {"lpm", "dfs-weight", "hrrn", "shortest-prefill-first"}
    # every policy but fair has its SGLang variant registered beside it
    assert {n for n, s in POLICIES.items() if s.sglang is None} == {"fair"}
    assert all((p.key is None) != (p.order is None) for p in POLICIES.values())


def test_registry_order() -> None:
    """``policy_names()`` (the CLI's ``--schedule-policy`` choices, in order) is fixed."""
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


@pytest.mark.parametrize("name", ["nope", "priority", "LPM"])
def test_unknown_policy_lists_valid_names(kind: type[WaitingQueue], name: str) -> None:
    with pytest.raises(ValueError, match="valid policies: ") as exc:
        make_queue(kind, name)
    for valid in POLICIES:
        assert valid in str(exc.value)
    with pytest.raises(ValueError, match="valid policies: "):
        get_policy(name)


def test_priority_is_not_a_policy_message(kind: type[WaitingQueue]) -> None:
    with pytest.raises(ValueError, match="enable-priority-scheduling"):
        make_queue(kind, "priority")


@pytest.mark.parametrize("name", ["lpm", "hrrn", "dfs-weight"])
def test_cache_aware_without_cache_falls_back_with_warning(
    kind: type[WaitingQueue], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = RadixCache(None, disable=True)
    with caplog.at_level(logging.WARNING, logger="radixsched.queue"):
        queue = make_queue(kind, name, cache)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert name in warnings[0].getMessage() and "fcfs" in warnings[0].getMessage()
    assert queue.policy.name == "fcfs" and queue.config.schedule_policy == name
    assert not queue.policy.cache_aware
    a, b = mk("a", [3, 4], t=1.0), mk("b", [1, 2], t=2.0)
    queue.add(b)
    queue.add(a)
    assert rids(round_order(queue)) == ["a", "b"]
    assert queue.active_policy().name == "fcfs"
    assert a.num_matched_prefix_tokens == 0 and b.num_matched_prefix_tokens == 0


def test_cache_aware_with_no_reuse_cache_keeps_policy(
    kind: type[WaitingQueue], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        queue = make_queue(kind, "lpm", NoReuseCache())
    assert queue.policy.name == "lpm" and not caplog.records


def test_spf_without_cache_raises_requires_prefix_caching(kind: type[WaitingQueue]) -> None:
    with pytest.raises(ValueError, match="requires prefix caching"):
        make_queue(kind, "shortest-prefill-first", RadixCache(None, disable=True))
    # compat mode gives the same, correct message (SGLang masks it, spec 8 item 5)
    with pytest.raises(ValueError, match="requires prefix caching"):
        make_queue(kind, "shortest-prefill-first", RadixCache(None, disable=True), compat="sglang")


@pytest.mark.parametrize("name", ["random", "routing-key", "lpm", "dfs-weight", "hrrn", "fair"])
def test_priority_scheduling_requires_fcfs_or_lof(kind: type[WaitingQueue], name: str) -> None:
    with pytest.raises(ValueError, match="fcfs, lof"):
        make_queue(kind, name, enable_priority_scheduling=True)


def test_priority_scheduling_allowed_for_fcfs_and_lof(kind: type[WaitingQueue]) -> None:
    for name in ("fcfs", "lof"):
        assert make_queue(kind, name, enable_priority_scheduling=True).policy.name == name


def test_validate_priority() -> None:
    off = SchedulerConfig()
    strict = SchedulerConfig(abort_on_priority_when_disabled=True)
    on = SchedulerConfig(enable_priority_scheduling=True, abort_on_priority_when_disabled=True)
    assert validate_priority(None, strict) is None
    assert validate_priority(3, off) is None
    msg = validate_priority(3, strict)
    assert msg is not None and "without a priority" in msg
    assert validate_priority(3, on) is None
    too_big = validate_priority(2**63, on)
    assert too_big is not None and "64-bit" in too_big
    assert validate_priority(-(2**63), on) is None
    too_small = validate_priority(-(2**63) - 1, on)
    assert too_small is not None and "64-bit" in too_small


# ---- fcfs / lof / random / routing-key ------------------------------------------------------


def test_fcfs_radixsched_sorts_by_queue_entry_then_arrival(kind: type[WaitingQueue]) -> None:
    q = [mk("c", [1], t=3.0), mk("a", [2], t=1.0), mk("b2", [3], t=2.0), mk("b1", [4], t=2.0)]
    q[3].queue_entry_time = 1.5  # kept seniority (e.g. a retracted request)
    queue = make_queue(kind, "fcfs", reqs=q)
    assert rids(round_order(queue)) == ["a", "b1", "b2", "c"]
    assert queue.active_policy().name == "fcfs"
    assert queue.deprioritized == queue.deferred == frozenset()


def test_fcfs_tie_on_entry_time_breaks_by_arrival_then_list_order(
    kind: type[WaitingQueue],
) -> None:
    q = [mk("x", [1], t=5.0), mk("y", [2], t=4.0), mk("z", [3], t=4.0)]
    for r in q:
        r.queue_entry_time = 10.0
    assert rids(round_order(make_queue(kind, "fcfs", reqs=q))) == ["y", "z", "x"]


def test_fcfs_compat_keeps_list_order(kind: type[WaitingQueue]) -> None:
    q = [mk("c", [1], t=3.0), mk("a", [2], t=1.0), mk("b", [3], t=2.0)]
    assert rids(round_order(make_queue(kind, "fcfs", reqs=q, compat="sglang"))) == ["c", "a", "b"]


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_fcfs_priority_high_values_first(kind: type[WaitingQueue], compat: str) -> None:
    q = [
        mk("none", [1], t=0.0),
        mk("p1", [1], t=1.0, priority=1),
        mk("p5_late", [1], t=3.0, priority=5),
        mk("p5_early", [1], t=2.0, priority=5),
        mk("neg", [1], t=0.5, priority=-7),
    ]
    queue = make_queue(kind, "fcfs", reqs=q, enable_priority_scheduling=True, compat=compat)
    assert rids(round_order(queue)) == ["p5_early", "p5_late", "p1", "neg", "none"]
    assert q[0].priority is None  # never mutated


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_fcfs_priority_low_values_first(kind: type[WaitingQueue], compat: str) -> None:
    q = [
        mk("none", [1], t=0.0),
        mk("p1", [1], t=1.0, priority=1),
        mk("p5", [1], t=2.0, priority=5),
        mk("neg", [1], t=3.0, priority=-7),
    ]
    queue = make_queue(
        kind,
        "fcfs",
        reqs=q,
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=True,
        compat=compat,
    )
    assert rids(round_order(queue)) == ["neg", "p1", "p5", "none"]


def test_none_priority_sorts_after_explicit_extremes(kind: type[WaitingQueue]) -> None:
    for low_first, extreme in ((False, -(2**63)), (True, 2**63 - 1)):
        q = [mk("none", [1], t=0.0), mk("extreme", [1], t=1.0, priority=extreme)]
        queue = make_queue(
            kind,
            "fcfs",
            reqs=q,
            enable_priority_scheduling=True,
            schedule_low_priority_values_first=low_first,
        )
        assert rids(round_order(queue)) == ["extreme", "none"]


def test_default_priority_value_applies_to_missing_priorities(kind: type[WaitingQueue]) -> None:
    q = [mk("p1", [1], t=0.0, priority=1), mk("none", [1], t=1.0), mk("p9", [1], t=2.0, priority=9)]
    queue = make_queue(
        kind, "fcfs", reqs=q, enable_priority_scheduling=True, default_priority_value=5
    )
    assert rids(round_order(queue)) == ["p9", "none", "p1"]
    assert q[1].priority is None


def test_fcfs_priority_off_ignores_priority(kind: type[WaitingQueue]) -> None:
    q = [mk("a", [1], t=0.0, priority=1), mk("b", [1], t=1.0, priority=9)]
    assert rids(round_order(make_queue(kind, "fcfs", reqs=q))) == ["a", "b"]


def test_lof_radixsched_ties_by_arrival(kind: type[WaitingQueue]) -> None:
    q = [
        mk("s", [1], t=0.0, max_new=4),
        mk("l_late", [1], t=2.0, max_new=64),
        mk("l_early", [1], t=1.0, max_new=64),
        mk("m", [1], t=3.0, max_new=16),
    ]
    assert rids(round_order(make_queue(kind, "lof", reqs=q))) == ["l_early", "l_late", "m", "s"]


def test_lof_compat_ties_keep_list_order(kind: type[WaitingQueue]) -> None:
    q = [
        mk("s", [1], t=0.0, max_new=4),
        mk("l_late", [1], t=2.0, max_new=64),
        mk("l_early", [1], t=1.0, max_new=64),
    ]
    queue = make_queue(kind, "lof", reqs=q, compat="sglang")
    assert rids(round_order(queue)) == ["l_late", "l_early", "s"]


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_lof_with_priority(kind: type[WaitingQueue], compat: str) -> None:
    q = [
        mk("p0_long", [1], t=0.0, max_new=100, priority=0),
        mk("p2_short", [1], t=1.0, max_new=1, priority=2),
        mk("p2_long", [1], t=2.0, max_new=50, priority=2),
        mk("none_long", [1], t=3.0, max_new=1000),
    ]
    queue = make_queue(kind, "lof", reqs=q, enable_priority_scheduling=True, compat=compat)
    assert rids(round_order(queue)) == ["p2_long", "p2_short", "p0_long", "none_long"]


def _fisher_yates(items: Sequence[Req], seed: int, steps: int) -> tuple[list[Req], random.Random]:
    """The naive reference of radixsched's random order: the first ``steps`` steps of a
    front-to-back Fisher-Yates (step ``i`` swaps position ``i`` with a uniform pick of
    ``[i, n)``; the last position needs no draw). Returns the list and the generator."""
    rng = random.Random(seed)
    out = list(items)
    n = len(out)
    for i in range(min(steps, n - 1)):
        j = i + rng.randrange(n - i)
        out[i], out[j] = out[j], out[i]
    return out, rng


def _numbered(n: int) -> list[Req]:
    return [mk(f"r{i:02d}", [i + 1], t=float(i)) for i in range(n)]


def test_random_is_seeded_and_uses_its_own_rng(kind: type[WaitingQueue]) -> None:
    def order(seed: int) -> list[str]:
        return rids(round_order(make_queue(kind, "random", reqs=_numbered(20), seed=seed)))

    first = order(7)
    random.seed(123)  # the global generator must not matter
    assert order(7) == first
    assert order(8) != first
    assert sorted(first) == rids(_numbered(20))
    assert first == rids(_fisher_yates(_numbered(20), 7, 20)[0])


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(0, 40),
    seed=st.integers(0, 2**32),
    reads=st.lists(st.integers(0, 45), max_size=6),
    kind=st.sampled_from(list(KINDS.values())),
)
def test_random_round_draws_only_what_is_read(
    n: int, seed: int, reads: list[int], kind: type[WaitingQueue]
) -> None:
    """Reading a random round's positions in any increasing pattern performs exactly the
    Fisher-Yates steps the positions read need: after each read the list and the generator
    are the naive shuffle's after that many steps (so the positions read are the full
    shuffle's first ones), and the list stays a permutation."""
    base = _numbered(n)
    queue = make_queue(kind, "random", reqs=base, seed=seed, enable_waiting_prefix_refresh=False)
    order = queue.begin_round([], 0, 0.0)
    end = 0
    for r in sorted(reads):
        order.head(r)
        end = max(end, min(r, n))
        want, rng = _fisher_yates(base, seed, end)
        assert rids(queue.reqs) == rids(want)
        assert queue.rng.getstate() == rng.getstate()
    assert sorted(rids(queue.reqs)) == rids(base)
    full, _ = _fisher_yates(base, seed, n)
    assert rids(order.head(n)) == rids(full)


def test_random_round_is_uniform(kind: type[WaitingQueue]) -> None:
    """Every ordered pair (first, second) of a 4-request queue is equally likely, round after
    round, reading two positions each (a chi-square bound far above what a correct shuffle
    reaches and far below a biased one's)."""
    queue = make_queue(
        kind, "random", reqs=_numbered(4), seed=3, enable_waiting_prefix_refresh=False
    )
    counts: Counter[tuple[str, str]] = Counter()
    trials = 24_000
    for _ in range(trials):
        first, second = queue.begin_round([], 0, 0.0).head(2)
        counts[(first.rid, second.rid)] += 1
    assert len(counts) == 12
    expected = trials / 12
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 40.0  # 11 degrees of freedom: p < 1e-4 beyond 36


def test_random_round_orders_only_what_is_read(kind: type[WaitingQueue]) -> None:
    """A random round leaves the list alone until its order is read; reading the whole order
    gives the full Fisher-Yates shuffle and leaves the list in it. A round that refreshes the
    waiting prefixes draws the head it touches first. compat: SGLang's eager whole-list
    shuffle (``random.shuffle``) every round."""
    quiet = {"enable_waiting_prefix_refresh": False}
    full = rids(_fisher_yates(_numbered(30), 5, 30)[0])
    queue = make_queue(kind, "random", reqs=_numbered(30), seed=5, **quiet)
    order = queue.begin_round([], 0, 0.0)
    assert rids(queue.reqs) == rids(_numbered(30))  # nothing drawn yet
    assert rids(order.head(30)) == full
    assert rids(queue.reqs) == full
    refreshed = make_queue(kind, "random", reqs=_numbered(30), seed=5)
    refreshed.begin_round([], 0, 0.0)  # a refresh round (the first): its head is drawn
    assert rids(refreshed.reqs) == full
    compat = make_queue(kind, "random", reqs=_numbered(30), seed=5, compat="sglang", **quiet)
    compat.begin_round([], 0, 0.0)
    eager = _numbered(30)
    random.Random(5).shuffle(eager)
    assert rids(compat.reqs) == rids(eager) != rids(_numbered(30))


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


def test_routing_key_radixsched_nonmatching_keep_arrival(kind: type[WaitingQueue]) -> None:
    queue = make_queue(kind, "routing-key", reqs=_routing_queue())
    # b (count 2) first, then a and c (count 1, by key), then non-matching by arrival
    assert rids(round_order(queue, _running())) == [
        "b1",
        "b2",
        "a",
        "c",
        "none",
        "zz",
        "aa",
        "empty",
    ]


def test_routing_key_compat_nonmatching_by_key_string(kind: type[WaitingQueue]) -> None:
    queue = make_queue(kind, "routing-key", reqs=_routing_queue(), compat="sglang")
    # non-matching: "" (none, empty) first in list order, then "aa", "zz"
    assert rids(round_order(queue, _running())) == [
        "b1",
        "b2",
        "a",
        "c",
        "none",
        "empty",
        "aa",
        "zz",
    ]


@pytest.mark.parametrize("running", [[], [mk("run", [1], routing_key="")]])
def test_routing_key_without_running_keys_does_not_sort(
    kind: type[WaitingQueue], running: list[Req]
) -> None:
    queue = make_queue(kind, "routing-key", reqs=_routing_queue())
    assert rids(round_order(queue, running)) == rids(_routing_queue())


# ---- matching -----------------------------------------------------------------------------


def test_length_matching_sets_capped_count_only(kind: type[WaitingQueue]) -> None:
    cache = cache_with(PREFIX)
    full = mk("full", PREFIX)  # whole prompt cached: the match is capped at len - 1
    part = mk("part", [*PREFIX[:40], 1, 2])
    ns = mk("ns", PREFIX, extra_key="lora")  # another namespace shares nothing
    retracted = mk("retr", PREFIX[:60], output=PREFIX[60:80])
    q = [full, part, ns, retracted]
    for r in q:
        r.last_node = "sentinel"
    queue = make_queue(kind, "lpm", cache, q, **NO_DEDUP)
    assert rids(round_order(queue)) == ["full", "retr", "part", "ns"]
    assert [r.num_matched_prefix_tokens for r in (full, part, ns, retracted)] == [99, 40, 0, 79]
    assert all(r.last_node == "sentinel" and r.prefix_len == 0 for r in q)  # match_len only


@pytest.mark.parametrize(
    ("name", "compat"),
    [("dfs-weight", "sglang"), ("lpm", "sglang"), ("hrrn", "sglang"), ("dfs-weight", "radixsched")],
)
def test_node_matching_only_under_compat(kind: type[WaitingQueue], name: str, compat: str) -> None:
    """compat: cache-aware policies match with SGLang's match_prefix, which splits the node
    where the match ends and sets the request's prefix fields. radixsched (dfs-weight
    included) matches read-only: the matched count only, no split (the refresh, off here,
    may split like any touch)."""
    cache = cache_with(PREFIX)
    r = mk("r", [*PREFIX[:40], 1, 2])
    queue = make_queue(kind, name, cache, [r], compat=compat, enable_waiting_prefix_refresh=False)
    round_order(queue)
    assert r.num_matched_prefix_tokens == 40 and r.host_hit_len == 0
    top = next(iter(cache.root.children.values()))
    if compat == "sglang":
        assert r.prefix_len == 40
        assert r.last_node is not None and len(r.last_node) == 40  # the split upper node
        assert r.last_node is top and len(top) == 40
    else:
        assert r.prefix_len == 0 and r.last_node is None
        assert len(top) == 100  # not split


def test_cache_agnostic_policies_keep_the_entry_snapshot(kind: type[WaitingQueue]) -> None:
    """Cache-agnostic policies never re-match per round (SGLang never does either): the matched
    length the queue recorded at entry (the router's load snapshot) stays when the cache
    changes; fair (cache-aware within a tenant's turn) refreshes it."""
    for name in ("fcfs", "lof", "random", "routing-key", "fair"):
        cache = cache_with(PREFIX[:10])
        r = mk("r", [*PREFIX[:30], 5])
        queue = make_queue(kind, name, cache, [r])
        assert r.num_matched_prefix_tokens == 10  # the door's match
        put(cache, PREFIX)  # now 30 tokens match
        round_order(queue)
        assert r.num_matched_prefix_tokens == (30 if name == "fair" else 10), name
        assert r.last_node is None and queue.active_policy().name == name


def test_door_match_is_whole_pages_of_fill_minus_one(kind: type[WaitingQueue]) -> None:
    """``add`` records the capped match at the door: whole pages of ``fill_len - 1``."""
    cache = RadixCache(None, page_size=4)
    put(cache, PREFIX[:12])
    reqs = [mk("whole", PREFIX[:12]), mk("more", [*PREFIX[:12], 7, 7]), mk("short", PREFIX[:3])]
    make_queue(kind, "fcfs", cache, reqs, page_size=4)
    # 12 cached: capped at 11, cut to 8 (whole pages); 13 tokens -> 12; 3 tokens: nothing
    assert [r.num_matched_prefix_tokens for r in reqs] == [8, 12, 0]


# ---- lpm --------------------------------------------------------------------------------------


def _lpm_queue() -> list[Req]:
    return [
        mk("m10", [*PREFIX[:10], 1], t=0.0),
        mk("m50_late", [*PREFIX[:50], 2], t=3.0),
        mk("m0", [7, 7, 7], t=1.0),
        mk("m50_early", [*PREFIX[:50], 3], t=2.0),
        mk("m80", [*PREFIX[:80], 4], t=4.0),
    ]


def test_lpm_radixsched_order_and_arrival_ties(kind: type[WaitingQueue]) -> None:
    queue = make_queue(kind, "lpm", cache_with(PREFIX), _lpm_queue())
    assert rids(round_order(queue)) == ["m80", "m50_early", "m50_late", "m10", "m0"]
    assert queue.active_policy().name == "lpm" and not queue.deferred


def test_lpm_compat_ties_keep_list_order(kind: type[WaitingQueue]) -> None:
    queue = make_queue(kind, "lpm", cache_with(PREFIX), _lpm_queue(), compat="sglang")
    assert rids(round_order(queue)) == ["m80", "m50_late", "m50_early", "m10", "m0"]


def test_lpm_starvation_bound_in_seconds(kind: type[WaitingQueue]) -> None:
    def queue() -> WaitingQueue:
        reqs = [
            mk("fresh_hit", [*PREFIX[:90], 1], t=9.0),
            mk("old_miss2", [5, 5], t=1.0),
            mk("old_miss1", [6, 6], t=0.5),
        ]
        return make_queue(kind, "lpm", cache_with(PREFIX), reqs, lpm_max_wait_s=5.0)

    # nobody waited > 5 s: pure lpm (misses by arrival)
    assert rids(round_order(queue(), now=4.0)) == ["fresh_hit", "old_miss1", "old_miss2"]
    # old_miss1 waited 5.7 s, old_miss2 5.2 s: both overdue, by arrival
    assert rids(round_order(queue(), now=6.2)) == ["old_miss1", "old_miss2", "fresh_hit"]
    # only old_miss1 is overdue (5.5 > 5; 5.0 is not > 5)
    assert rids(round_order(queue(), now=6.0)) == ["old_miss1", "fresh_hit", "old_miss2"]


def test_lpm_starvation_bound_in_tokens(kind: type[WaitingQueue]) -> None:
    q = [
        mk("hit", [*PREFIX[:90], 1], t=2.0, processed=900),
        mk("miss", [5, 5], t=1.0, processed=100),
    ]
    queue = make_queue(kind, "lpm", cache_with(PREFIX), q, lpm_max_wait_tokens=500)
    # miss waited 500 tokens: not more than the bound
    assert rids(round_order(queue, processed_tokens=600)) == ["hit", "miss"]
    assert rids(round_order(queue, processed_tokens=601)) == ["miss", "hit"]


def test_starvation_bound_only_for_lpm(kind: type[WaitingQueue]) -> None:
    q = [mk("hit", [*PREFIX[:90], 1], t=9.0), mk("miss", [5, 5], t=0.0)]
    queue = make_queue(kind, "shortest-prefill-first", cache_with(PREFIX), q, lpm_max_wait_s=1.0)
    assert rids(round_order(queue, now=100.0)) == ["hit", "miss"]


@pytest.mark.parametrize("name", ["hrrn", "shortest-prefill-first", "dfs-weight"])
def test_starvation_bound_picks_dedup_representatives_only_for_lpm(
    kind: type[WaitingQueue], name: str
) -> None:
    """lpm's starvation bound makes an overdue member represent its dedup group under lpm only
    (as it orders under lpm only): under the other policies the cheapest member represents
    its group whatever ``--lpm-max-wait-s`` says."""
    q = [mk("cheap", [*SHARED, 1], t=9.0), mk("old_big", [*SHARED, *range(200)], t=0.0)]
    queue = make_queue(kind, name, reqs=q, lpm_max_wait_s=5.0)
    round_order(queue, now=10.0)  # old_big waited 10 s > 5 s
    assert queue.deferred == {"old_big"}


# ---- the queue-length cap ------------------------------------------------------------------


def _cap_queue(n: int) -> list[Req]:
    # Reverse-arrival list order; match length grows with the index.
    return [mk(f"r{i:03d}", [*PREFIX[: i % 90], 9000 + i], t=float(n - i)) for i in range(n)]


@pytest.mark.parametrize("name", ["lpm", "hrrn"])
def test_compat_cap_is_128_strictly_greater(kind: type[WaitingQueue], name: str) -> None:
    def queue(n: int) -> WaitingQueue:
        reqs = _cap_queue(n)[::-1]
        return make_queue(kind, name, cache_with(PREFIX), reqs, compat="sglang", **NO_DEDUP)

    q128 = queue(128)
    assert q128.cap == SGLANG_PREFIX_MATCH_CAP == 128
    order = round_order(q128, processed_tokens=10_000)
    assert q128.active_policy().name == name
    # lpm: the longest match (89) leads; hrrn: every ratio ties (1 uncached token), rid order
    assert order[0].rid == ("r089" if name == "lpm" else "r000")
    q129 = queue(129)
    before = rids(q129.reqs)
    order = round_order(q129, processed_tokens=10_000)
    assert q129.active_policy().name == "fcfs"
    assert rids(order) == before  # compat fallback: the list order is left alone


@pytest.mark.parametrize("name", ["lpm", "hrrn"])
def test_radixsched_has_no_cap_by_default(kind: type[WaitingQueue], name: str) -> None:
    queue = make_queue(kind, name, cache_with(PREFIX), _cap_queue(300), **NO_DEDUP)
    assert queue.cap is None
    order = round_order(queue, processed_tokens=10_000)
    assert queue.active_policy().name == name
    assert max(r.num_matched_prefix_tokens for r in order) == 89
    if name == "lpm":
        assert order[0].num_matched_prefix_tokens == 89


def test_max_prefix_match_queue_radixsched_falls_back_to_arrival(kind: type[WaitingQueue]) -> None:
    cfg: dict[str, Any] = {"max_prefix_match_queue": 4, **NO_DEDUP}
    queue = make_queue(kind, "lpm", cache_with(PREFIX), _cap_queue(4), **cfg)
    assert rids(round_order(queue)) == ["r003", "r002", "r001", "r000"]  # by match length
    assert queue.active_policy().name == "lpm"
    cache = cache_with(PREFIX)
    queue = make_queue(kind, "lpm", cache, _cap_queue(5), **cfg)
    cache.evict(1000)  # every match would be 0 now
    order = round_order(queue)
    assert queue.active_policy().name == "fcfs"
    assert rids(order) == ["r004", "r003", "r002", "r001", "r000"]  # by arrival (t = 5 - i)
    # Above the cap nothing is matched: the load snapshot of the door is left as it was.
    assert [r.num_matched_prefix_tokens for r in order] == [4, 3, 2, 1, 0]
    # Back at the cap (one leaves), the policy matches again.
    queue.remove(order[0])
    order = round_order(queue)
    assert queue.active_policy().name == "lpm"
    assert [r.num_matched_prefix_tokens for r in order] == [0, 0, 0, 0]
    assert rids(order) == ["r003", "r002", "r001", "r000"]  # ties by arrival


def test_max_prefix_match_queue_compat_overrides_128(kind: type[WaitingQueue]) -> None:
    reqs = _cap_queue(5)[::-1]
    queue = make_queue(
        kind, "lpm", cache_with(PREFIX), reqs, max_prefix_match_queue=4, compat="sglang"
    )
    before = rids(queue.reqs)
    assert rids(round_order(queue)) == before
    assert queue.active_policy().name == "fcfs"


@pytest.mark.parametrize("name", ["dfs-weight", "shortest-prefill-first"])
def test_dfs_and_spf_are_never_capped(kind: type[WaitingQueue], name: str) -> None:
    queue = make_queue(
        kind, name, cache_with(PREFIX), _cap_queue(5), compat="sglang", max_prefix_match_queue=2
    )
    round_order(queue)
    assert queue.active_policy().name == name


# ---- hrrn -------------------------------------------------------------------------------------


def test_hrrn_radixsched_ratio_then_arrival(kind: type[WaitingQueue]) -> None:
    # uncached = fill - match; waited = processed_tokens - entry snapshot (1000 here).
    q = [
        mk("b_fresh", [1] * 10, t=2.0, processed=1000),  # ratio 0
        mk("a_fresh", [2] * 10, t=1.0, processed=1000),  # ratio 0, earlier
        mk("slow", [3] * 100, t=0.0, processed=0),  # 1000 / 100 = 10
        mk("fast", [4] * 10, t=0.5, processed=500),  # 500 / 10 = 50
        mk("hit", [*PREFIX[:90], 5], t=0.7, processed=800),  # 200 / 1 = 200
    ]
    queue = make_queue(kind, "hrrn", cache_with(PREFIX), q, **NO_DEDUP)
    assert rids(round_order(queue, processed_tokens=1000)) == [
        "hit",
        "fast",
        "slow",
        "a_fresh",
        "b_fresh",
    ]


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
    """The fast queue's lazy hrrn round (``HrrnRound``, read through ``RoundOrder`` as
    admission reads it): reading positions one by one, past its first selections and through
    heavy ties, gives the sort by (ratio, entry, arrival, rid); ``head`` agrees, and every
    position is handed out once."""
    rid_order = data.draw(st.permutations(range(len(rows))))
    reqs = [mk(f"q{rid_order[i]:02d}", [1], t=0.0) for i in range(len(rows))]
    ratio = np.array([r[0] for r in rows], dtype=np.float64)
    entry = np.array([r[1] for r in rows], dtype=np.float64)
    arrival = np.array([r[2] for r in rows], dtype=np.float64)
    want = sorted(range(len(rows)), key=lambda i: (*rows[i], reqs[i].rid))
    native = core()
    if native is None:
        pytest.skip(NO_NATIVE)
    rnd = RoundOrder(reqs, iter(native.HrrnRound(reqs, ratio, entry, arrival)))
    got = []
    for i in range(min(reads, len(rows) + 1)):
        pos = rnd.position(i)
        if pos is None:
            assert i == len(rows)
            break
        got.append(pos)
    assert got == want[: len(got)]
    assert rids(rnd.head(len(rows))) == [reqs[i].rid for i in want]


def test_hrrn_compat_ties_by_rid(kind: type[WaitingQueue]) -> None:
    q = [
        mk("b_fresh", [1] * 10, t=1.0, processed=1000),
        mk("a_fresh", [2] * 10, t=2.0, processed=1000),
        mk("slow", [3] * 100, t=0.0, processed=0),
    ]
    queue = make_queue(kind, "hrrn", cache_with(PREFIX), q, compat="sglang", **NO_DEDUP)
    assert rids(round_order(queue, processed_tokens=1000)) == ["slow", "a_fresh", "b_fresh"]


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_hrrn_uncached_counts_output_only_in_radixsched(
    kind: type[WaitingQueue], compat: str
) -> None:
    # A retracted request: its prompt is fully cached, its output is not.
    q = [
        mk("waiting", [3] * 10, t=0.0, processed=0),  # 1000 / 10 = 100
        mk("replay", PREFIX[:50], t=1.0, output=[8] * 30, processed=900),
    ]
    queue = make_queue(kind, "hrrn", cache_with(PREFIX[:50]), q, compat=compat, **NO_DEDUP)
    order = rids(round_order(queue, processed_tokens=1000))
    if compat == "radixsched":  # replay uncached = 80 - 50 = 30, ratio 100/30 = 3.3
        assert order == ["waiting", "replay"]
    else:  # prompt 50 - match 50 = 0 uncached: "drain immediately"
        assert order == ["replay", "waiting"]


def test_hrrn_without_clock_orders_by_arrival(kind: type[WaitingQueue]) -> None:
    q = [mk("a", [2] * 5, t=2.0), mk("z", [1] * 5, t=1.0)]
    assert rids(round_order(make_queue(kind, "hrrn", cache_with(), q))) == ["z", "a"]


# ---- shortest-prefill-first ------------------------------------------------------------------


def test_spf_order_work_includes_output(kind: type[WaitingQueue]) -> None:
    q = [
        mk("long", [3] * 200, t=0.0),  # 200
        mk("hit", [*PREFIX[:90], 5, 6], t=1.0),  # 92 - 90 = 2
        mk("retracted", [4] * 5, t=2.0, output=[9] * 20),  # 25
        mk("short_late", [5] * 10, t=4.0),  # 10
        mk("short_early", [6] * 10, t=3.0),  # 10
    ]
    queue = make_queue(kind, "shortest-prefill-first", cache_with(PREFIX), q, **NO_DEDUP)
    order = round_order(queue)
    assert rids(order) == ["hit", "short_early", "short_late", "retracted", "long"]
    assert [prefill_work(r) for r in order] == [2, 10, 10, 25, 200]


def test_spf_work_is_at_least_one(kind: type[WaitingQueue]) -> None:
    r = mk("r", PREFIX)
    round_order(make_queue(kind, "shortest-prefill-first", cache_with(PREFIX), [r]))
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
def test_dfs_weight_worked_example(kind: type[WaitingQueue], compat: str) -> None:
    cache, q = _dfs_cache_and_queue()
    queue = make_queue(kind, "dfs-weight", cache, q, compat=compat)
    # handles [2_20, 11, 10, 10, node1] -> permutation [2, 3, 1, 4, 0]
    assert rids(round_order(queue)) == ["leaf_10a", "leaf_10b", "leaf_11", "node_1", "leaf_2_20"]
    assert queue.active_policy().name == "dfs-weight"


def test_dfs_weight_ties_keep_creation_order(kind: type[WaitingQueue]) -> None:
    cache, q = _dfs_cache_and_queue()
    queue = make_queue(kind, "dfs-weight", cache, q[:2])
    assert rids(round_order(queue)) == ["leaf_11", "leaf_2_20"]


def test_dfs_weight_follows_root_children_moving_up(kind: type[WaitingQueue]) -> None:
    """dfs-weight keys each top-level subtree on its position among the root's children (the
    fast queue keeps that order across rounds): when earlier children are evicted, every
    waiting subtree moves up, also those no request of which changed (here A, while B is
    re-matched)."""
    alloc = TokenAllocator(10_000, 1)
    cache = RadixCache(alloc, page_size=1)
    seqs = {
        name: np.arange(100 * i + 1, 100 * i + 21, dtype=np.int32)
        for i, name in enumerate(["X", "Y", "A", "B"])
    }
    for s in seqs.values():  # root children in this order: X, Y, A, B
        slots = alloc.alloc(len(s))
        assert slots is not None
        cache.insert(CacheKey(s), slots)
    q = [mk("b", [*seqs["B"][:10], 7], t=0.0), mk("a", [*seqs["A"][:10], 7], t=1.0)]
    queue = make_queue(kind, "dfs-weight", cache, q)
    assert rids(round_order(queue)) == ["a", "b"]  # equal weights: A first among the children
    cache.evict(40)  # X and Y, the least recently used
    assert len(cache.root.children) == 2
    grow = np.concatenate([seqs["B"], [9, 9]]).astype(np.int32)
    slots = alloc.alloc(len(grow))
    assert slots is not None
    res = cache.insert(CacheKey(grow), slots)  # B changes: b is re-matched
    alloc.free(slots[: res.prefix_len])
    assert rids(round_order(queue)) == ["a", "b"]
    cache.check_integrity()


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


def _dedup_round(kind: type[WaitingQueue], reqs: list[Req], **cfg: Any) -> WaitingQueue:
    queue = make_queue(kind, "lpm", cache_with(PREFIX), reqs, **cfg)
    round_order(queue)
    return queue


def test_dedup_radixsched_cheapest_then_oldest_represents_and_others_deferred(
    kind: type[WaitingQueue],
) -> None:
    queue = make_queue(kind, "lpm", cache_with(PREFIX), _dedup_queue())
    order = round_order(queue)
    dups = {"first_long", "old_mid", "short_late"}
    assert queue.deprioritized == dups and queue.deferred == dups
    # lpm: cached (60) first, then matches 0 by arrival, duplicates last (by arrival)
    assert rids(order) == [
        "cached",
        "short_total",
        "other",
        "short_early",
        "old_mid",
        "first_long",
        "short_late",
    ]


def test_dedup_compat_first_in_list_wins_and_is_not_binding(kind: type[WaitingQueue]) -> None:
    queue = make_queue(kind, "lpm", cache_with(PREFIX), _dedup_queue(), compat="sglang")
    order = round_order(queue)
    dups = {"old_mid", "short_late", "short_early"}
    assert queue.deprioritized == dups and queue.deferred == frozenset()
    assert rids(order) == [
        "cached",
        "first_long",
        "other",
        "short_total",
        "old_mid",
        "short_late",
        "short_early",
    ]


def test_dedup_thresholds(kind: type[WaitingQueue]) -> None:
    # deprioritize threshold 41: the short ones (40 shared) no longer count; first_long and
    # old_mid still share 60 tokens, and old_mid is cheaper
    queue = _dedup_round(kind, _dedup_queue(), in_batch_prefix_deprioritize_threshold=41)
    assert queue.deferred == {"first_long"}
    queue = _dedup_round(kind, _dedup_queue(), in_batch_prefix_deprioritize_threshold=61)
    assert not queue.deprioritized
    # check threshold -1 disables the check
    assert not _dedup_round(kind, _dedup_queue(), **NO_DEDUP).deprioritized
    # check threshold 60 includes the "cached" request (match 60): it shares no first-32 tokens
    q = [mk("cached", [*PREFIX[:60], *SHARED], t=0.0), mk("c2", [*PREFIX[:60], 1], t=1.0)]
    queue = _dedup_round(kind, q, in_batch_prefix_check_threshold=60)
    assert queue.deferred == {"cached"}  # c2 has 1 uncached token vs 40: c2 represents


def test_dedup_compat_zero_threshold_deprioritizes_every_candidate(
    kind: type[WaitingQueue],
) -> None:
    q = [mk("a", [1, 2], t=0.0), mk("b", [3, 4], t=1.0)]
    queue = make_queue(
        kind, "lpm", reqs=q, compat="sglang", in_batch_prefix_deprioritize_threshold=0
    )
    round_order(queue)
    assert queue.deprioritized == {"a", "b"}
    # radixsched: everything shares >= 0 tokens, so one representative per namespace
    q = [mk("a", [1, 2], t=0.0), mk("b", [3], t=1.0), mk("c", [5], t=2.0, extra_key="k")]
    queue = make_queue(kind, "lpm", reqs=q, in_batch_prefix_deprioritize_threshold=0)
    round_order(queue)
    assert queue.deferred == {"a"}


def test_dedup_respects_namespaces(kind: type[WaitingQueue]) -> None:
    q = [mk("a", [*SHARED, 1], t=0.0), mk("b", [*SHARED, 2], t=1.0, extra_key="lora-1")]
    queue = make_queue(kind, "lpm", reqs=q)
    round_order(queue)
    assert not queue.deprioritized


def test_dedup_overdue_request_represents_its_group(kind: type[WaitingQueue]) -> None:
    def round_of(old_big_t: float) -> tuple[list[str], frozenset[str]]:
        q = [mk("cheap", [*SHARED, 1], t=9.0), mk("old_big", [*SHARED, *range(200)], t=old_big_t)]
        queue = make_queue(kind, "lpm", reqs=q, lpm_max_wait_s=5.0)
        return rids(round_order(queue, now=10.0)), queue.deferred

    assert round_of(0.0) == (["old_big", "cheap"], {"cheap"})
    assert round_of(8.0) == (["cheap", "old_big"], {"old_big"})


@pytest.mark.parametrize("name", ["hrrn", "shortest-prefill-first"])
def test_dedup_moves_duplicates_last_for_hrrn_and_spf(kind: type[WaitingQueue], name: str) -> None:
    def reqs() -> list[Req]:
        return [
            mk("dup", [*SHARED, 1, 2, 3], t=0.0, processed=0),  # would lead on its own
            mk("rep", [*SHARED, 1], t=5.0, processed=0),
            mk("other", list(range(7000, 7100)), t=6.0, processed=0),
        ]

    queue = make_queue(kind, name, reqs=reqs())
    order = round_order(queue, processed_tokens=1000)
    assert queue.deferred == {"dup"} and order[-1].rid == "dup"
    q = reqs()
    queue = make_queue(kind, name, reqs=[q[2], q[0], q[1]], compat="sglang")
    order = round_order(queue, processed_tokens=1000)
    assert queue.deprioritized == {"rep"} and not queue.deferred and order[-1].rid == "rep"


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_dfs_weight_dedup_radixsched_only(kind: type[WaitingQueue], compat: str) -> None:
    q = [
        mk("dup", [*SHARED, 1, 2], t=0.0),
        mk("rep", [*SHARED, 1], t=1.0),
        mk("x", [9] * 40, t=2.0),
    ]
    queue = make_queue(kind, "dfs-weight", reqs=q, compat=compat)
    order = rids(round_order(queue))
    if compat == "radixsched":
        assert queue.deferred == {"dup"} and order == ["rep", "x", "dup"]
    else:
        assert not queue.deprioritized and order == ["dup", "rep", "x"]


def _reference_dedup(
    queue: list[Req], device: dict[str, int], check: int, threshold: int
) -> set[str]:
    """SGLang's algorithm (spec 1.5) with a temporary page-1 radix tree; ``device``: each
    request's uncapped cache match."""
    tree = RadixCache(None, page_size=1)
    dup: set[str] = set()
    for r in queue:
        if device[r.rid] > check:
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
    kind=st.sampled_from(list(KINDS.values())),
)
def test_dedup_matches_temporary_radix_tree(
    specs: list[tuple[list[int], list[int], str | None, int]],
    cached: list[int],
    check: int,
    threshold: int,
    kind: type[WaitingQueue],
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
    probe = cache_with(cached)
    device = {r.rid: probe.match_len(CacheKey(r.fill_ids(), r.namespace)) for r in queue()}
    # compat: first in list order wins (identical to SGLang's temporary tree)
    q = queue()
    wq = make_queue(kind, "lpm", cache_with(cached, kind=kind), q, compat="sglang", **cfg)
    round_order(wq)
    expected = set() if check < 0 else _reference_dedup(q, device, check, threshold)
    assert wq.deprioritized == expected and not wq.deferred
    # radixsched: the same algorithm over candidates in (work, entry, arrival, rid) order
    q = queue()
    wq = make_queue(kind, "lpm", cache_with(cached, kind=kind), q, **cfg)
    round_order(wq)
    order = sorted(q, key=lambda r: (prefill_work(r), r.queue_entry_time, r.arrival_time, r.rid))
    if threshold <= 0:  # radixsched: one representative per namespace
        cands = [r for r in order if device[r.rid] <= check]
        reps = {r.namespace: r.rid for r in reversed(cands)}
        expected = {r.rid for r in cands} - set(reps.values()) if check >= 0 else set()
    else:
        expected = set() if check < 0 else _reference_dedup(order, device, check, threshold)
    assert wq.deferred == expected == wq.deprioritized


# ---- spf chunk limit ---------------------------------------------------------------------------

SPF = POLICIES["shortest-prefill-first"]


def _chunked(fill: int, prefix: int) -> Req:
    r = mk("chunked", [1] * fill)
    r.prefix_len = prefix
    return r


def _works(*works: int) -> list[Req]:
    return [mk(f"w{i}", [2] * w, t=float(i)) for i, w in enumerate(works)]


def test_spf_chunk_limit_cases() -> None:
    limit = SPF.chunk_limit
    assert limit is not None
    none: frozenset[str] = frozenset()
    # reserve 8 + 12 + 32 = 52 (page 4); the 100-token request would not fit in 64 - 4
    assert limit(_chunked(200, 50), _works(5, 10, 30, 100), 64, 4, none) == 12
    # stop at the first request not shorter than the continuation's remainder (8)
    assert limit(_chunked(58, 50), _works(5, 10), 64, 4, none) == 56
    # nothing reserved -> no cap
    assert limit(_chunked(58, 50), _works(8, 1), 64, 4, none) is None
    assert limit(_chunked(200, 50), [], 64, 4, none) is None
    # budget below two pages -> no cap
    assert limit(_chunked(200, 50), _works(1), 7, 4, none) is None
    # exactly two pages: a 1-token request charges one page and leaves one
    assert limit(_chunked(200, 50), _works(1), 8, 4, none) == 4
    # a request whose charge would leave no page for the continuation is not reserved
    assert limit(_chunked(200, 50), _works(5), 8, 4, none) is None
    # page 1: exact arithmetic
    assert limit(_chunked(1000, 0), _works(3, 7), 100, 1, none) == 90


def test_spf_chunk_limit_only_for_spf() -> None:
    assert {n for n, p in POLICIES.items() if p.chunk_limit is not None} == {
        "shortest-prefill-first"
    }


def test_spf_chunk_limit_skips_deferred_in_radixsched(kind: type[WaitingQueue]) -> None:
    limit = SPF.chunk_limit
    assert limit is not None
    for compat, expected in (("radixsched", 200 - 41), ("sglang", 200 - 41 - 42)):
        q = [mk("rep", [*SHARED, 1], t=0.0), mk("dup", [*SHARED, 2, 3], t=1.0)]
        queue = make_queue(kind, "shortest-prefill-first", reqs=q, compat=compat)
        order = round_order(queue)
        assert queue.deprioritized == {"dup"}
        assert limit(_chunked(1000, 0), order, 200, 1, queue.deferred) == expected


# ---- fair (virtual token counter) ----------------------------------------------------------


def _admit(queue: WaitingQueue, budget: int, rnd: int, processed: int) -> list[Req]:
    """One round: order, admit by a token budget (at least one request) skipping the deferred,
    charge each admitted request's tenant for its prefill (as the scheduler does)."""
    order = queue.begin_round([], processed, float(rnd))
    positions: list[int] = []
    used = 0
    for i in itertools.count():
        pos = order.position(i)
        if pos is None:
            break
        r = queue.reqs[pos]
        if r.rid in queue.deferred:
            continue
        work = prefill_work(r)
        if positions and used + work > budget:
            break
        positions.append(pos)
        used += work
    admitted = queue.take(positions)
    for r in admitted:
        queue.fair.charge(r.tenant_key, prefill_work(r), 0)
    return admitted


def _flood_rounds(kind: type[WaitingQueue], policy: str, rounds: int = 30) -> list[int]:
    """Tenant A floods 300 requests at t=0; B sends one request per round. Returns B's waits."""
    flood = [mk(f"A{i}", [i % 50 + 1] * 100, t=0.0, tenant="A") for i in range(300)]
    queue = make_queue(kind, policy, reqs=flood)
    arrived: dict[str, int] = {}
    waits: list[int] = []
    for rnd in range(rounds):
        b = mk(f"B{rnd}", [7000 + rnd] * 100, t=float(rnd) + 0.5, tenant="B")
        queue.add(b)
        arrived[b.rid] = rnd
        for r in _admit(queue, 400, rnd, 0):
            if r.tenant == "B":
                waits.append(rnd - arrived[r.rid])
    return waits


def test_fair_serves_light_tenant_despite_flood(kind: type[WaitingQueue]) -> None:
    waits = _flood_rounds(kind, "fair")
    assert len(waits) == 30 and max(waits) == 0
    assert len(_flood_rounds(kind, "fcfs")) == 0  # the contrast: B queues behind the flood


def test_fair_service_difference_stays_bounded(kind: type[WaitingQueue]) -> None:
    big = [mk(f"A{i}", [1] * 1000, t=0.0, tenant="A") for i in range(60)]
    small = [mk(f"B{i}", [2] * 10, t=0.0, tenant="B") for i in range(6000)]
    queue = make_queue(kind, "fair", reqs=big + small)
    budget = 2000
    for rnd in range(40):
        _admit(queue, budget, rnd, 0)
        a, b = queue.fair.counters["A"], queue.fair.counters["B"]
        assert abs(a - b) <= 2 * 1000 + budget, (rnd, a, b)
    assert queue.fair.counters["A"] > 10_000 and queue.fair.counters["B"] > 10_000


def test_fair_lift_returning_tenant_banks_no_credit(kind: type[WaitingQueue]) -> None:
    queue = make_queue(kind, "fair", reqs=[mk(f"A{i}", [1] * 100, tenant="A") for i in range(50)])
    for rnd in range(5):
        _admit(queue, 300, rnd, 0)
    a = queue.fair.counters["A"]
    assert a == 5 * 300
    for i in range(10):
        queue.add(mk(f"B{i}", [2] * 100, t=10.0, tenant="B"))
    order = round_order(queue, now=10.0)
    assert queue.fair.counters["B"] == a  # lifted to A's counter, not 0
    # the two tenants now alternate (tie on counter: A's head arrived first)
    assert [r.tenant for r in order[:4]] == ["A", "B", "A", "B"]


def test_fair_running_requests_keep_a_tenant_active(kind: type[WaitingQueue]) -> None:
    queue = make_queue(kind, "fair")
    running = [mk("A_run", [1], tenant="A")]
    round_order(queue, running)  # A is active (running) with nothing waiting
    queue.fair.charge("A", 1000, 0)
    b0 = mk("B0", [2], tenant="B")
    queue.add(b0)
    round_order(queue, running)
    assert queue.fair.counters["B"] == 1000.0  # A stayed active (running): B lifted to it
    queue.remove(b0)
    b1 = mk("B1", [2], tenant="B")
    queue.add(b1)
    round_order(queue, now=1.0)
    queue.fair.charge("A", 500, 0)
    queue.remove(b1)
    queue.add(mk("A1", [1], tenant="A"))
    round_order(queue, now=2.0)
    # A became active again while B stayed: max(1500, B's 1000) = 1500
    assert queue.fair.counters["A"] == 1500.0


def test_fair_decode_weighting_and_within_tenant_affinity(kind: type[WaitingQueue]) -> None:
    queue = make_queue(kind, "fair", cache_with(PREFIX))
    queue.fair.charge("A", 10, 5)
    assert queue.fair.counters["A"] == 10 * 1.0 + 5 * 2.0
    q = [
        mk("a_miss", [9] * 20, t=0.0, tenant="A"),
        mk("a_hit", [*PREFIX[:50], 1], t=1.0, tenant="A"),
        mk("b", [8] * 20, t=0.0, tenant="B"),
    ]
    for r in q:
        queue.add(r)
    # b first: B's counter (0: no tenant stayed active to lift it to) is below A's 20; its
    # projected 20 then ties A, whose head (a_hit, the longest match, t=1) arrived after b
    assert rids(round_order(queue)) == ["b", "a_hit", "a_miss"]


@pytest.mark.parametrize("accelerate", [False, True])
def test_scheduler_charges_tenants_only_under_fair(accelerate: bool) -> None:
    """The scheduler charges each step's service to the tenant (``tenant``, else
    ``routing_key``, else "") only under fair: prefill tokens computed at weight 1, decode
    tokens at weight 2 (the accelerated decode charges several steps at once)."""

    def serve(name: str) -> tuple[VirtualTokenCounter, list[Req]]:
        cost = build_cost_model(SimConfig(max_total_tokens=8192))
        sched = build_scheduler(
            SchedulerConfig(schedule_policy=name),
            CostModelRunner(cost, seed=0),
            accelerate=accelerate,
            kv_slots=8192,
            clock=VirtualClock(),
            context_len=cost.model.max_context_len,
        )
        reqs = [
            Req(f"{who}{i}", np.arange(i, i + 40 + 7 * i, dtype=np.int32) % 50 + 1, **kw)
            for i, (who, kw) in enumerate(
                [("t", {"tenant": "A"}), ("k", {"routing_key": "rk"}), ("n", {})] * 3
            )
        ]
        for r in reqs:
            r.sampling = SamplingParams(max_new_tokens=5 + 3 * len(r.rid))
            assert sched.add_request(r, now=0.0).accepted
        while not sched.is_idle:
            sched.step()
        sched.check_integrity()
        assert sched.stats.retractions == 0
        return sched.queue.fair, reqs

    fair, reqs = serve("fair")
    assert {r.tenant_key for r in reqs} == {"A", "rk", ""}
    expected: Counter[str] = Counter()
    for r in reqs:
        assert r.output_len == r.sampling.max_new_tokens
        expected[r.tenant_key] += r.computed_prefill_tokens + 2 * (r.output_len - 1)
    assert fair.counters == dict(expected)
    assert not serve("lpm")[0].counters  # no other policy charges anyone
    assert POLICIES["fair"].charges_service
    assert not any(p.charges_service for n, p in POLICIES.items() if n != "fair")


@settings(max_examples=60, deadline=None)
@given(
    tenants=st.lists(st.sampled_from(["a", "b", "", "c"]), min_size=0, max_size=30),
    steps=st.integers(1, 200),
    start=st.integers(0, 10**9),
)
def test_fair_multi_step_decode_charge_equals_single_steps(
    tenants: list[str], steps: int, start: int
) -> None:
    """The accelerated decode charges each request once for ``steps`` decode tokens; the
    reference once per step and request. Counters stay integral (integral weights, starts
    and lifts), so both give exactly the same counters."""
    reqs = [
        Req(f"r{i}", np.arange(1, 4, dtype=np.int32), tenant=t or None)
        for i, t in enumerate(tenants)
    ]
    grouped = VirtualTokenCounter(counters={"a": float(start)})
    single = VirtualTokenCounter(counters={"a": float(start)})
    for r in reqs:
        grouped.charge(r.tenant_key, 0, steps)
    for _ in range(steps):
        for r in reqs:
            single.charge(r.tenant_key, 0, 1)
    assert grouped.counters == single.counters


# ---- waiting-prefix touch -----------------------------------------------------------------------


class _Spy:
    """Records the first token of every key the queue asks it to touch (the refresh); mixed
    into either tree."""

    touched: list[int]
    _batch: bool

    def __init__(self, **kw: Any) -> None:
        super().__init__(None, page_size=1, **kw)  # type: ignore[call-arg]
        self.touched = []
        self._batch = False

    def touch_prefix(self, key: CacheKey) -> None:
        if not self._batch:
            self.touched.append(int(key.tokens[0]))
        super().touch_prefix(key)  # type: ignore[misc]

    def touch_at(self, node: Any, offset: int) -> Any:  # the fast queue's touch (no key)
        self.touched.append(-1)
        return super().touch_at(node, offset)  # type: ignore[misc]

    def touch_prefixes(self, keys: Iterable[CacheKey]) -> None:
        keys = list(keys)
        self.touched.extend(int(k.tokens[0]) for k in keys)
        self._batch = True
        try:
            super().touch_prefixes(keys)  # type: ignore[misc]
        finally:
            self._batch = False


class SpyCache(_Spy, RadixCache):
    pass


class NativeSpyCache(_Spy, NativeRadixCache):
    pass


def _touch_counts(
    kind: type[WaitingQueue], name: str, rounds: int, n: int = 200, **cfg: Any
) -> list[int]:
    cache = SpyCache(eviction_policy=str(cfg.pop("radix_eviction_policy", "lru")))
    reqs = [mk(f"r{i}", [i + 1, 5], t=float(i)) for i in range(n)]
    queue = make_queue(kind, name, cache, reqs, radix_eviction_policy=cache.eviction_policy, **cfg)
    counts = []
    for _ in range(rounds):
        before = len(cache.touched)
        queue.begin_round([], 0, 0.0)
        counts.append(len(cache.touched) - before)
    return counts


def test_waiting_prefix_touch_every_32_rounds_over_128_head_last(kind: type[WaitingQueue]) -> None:
    counts = _touch_counts(kind, "fcfs", 2 * REFRESH_INTERVAL + 1)
    assert REFRESH_INTERVAL == 32 and REFRESH_SPAN == 128
    span = REFRESH_SPAN
    assert counts[0] == span and counts[32] == span and counts[64] == span
    assert sum(counts) == 3 * span
    cache = SpyCache()
    reqs = [mk(f"r{i}", [i + 1, 5], t=float(i)) for i in range(200)]
    make_queue(kind, "fcfs", cache, reqs).begin_round([], 0, 0.0)
    assert cache.touched == list(range(128, 0, -1))  # reversed(head[:128]): head touched last


@pytest.mark.parametrize(
    ("name", "cfg", "expected"),
    [
        ("lpm", {}, 100),  # radixsched lpm scores with match_len: touch keeps prefixes warm
        ("lpm", {"compat": "sglang"}, 0),  # compat: matching already touched
        ("dfs-weight", {}, 100),  # radixsched dfs-weight matches read-only too: touch
        ("dfs-weight", {"compat": "sglang"}, 0),  # compat: match_prefix touched every request
        ("routing-key", {"compat": "sglang"}, 100),
        ("fcfs", {"radix_eviction_policy": "lfu"}, 0),
        ("fcfs", {"enable_waiting_prefix_refresh": False}, 0),
    ],
)
def test_waiting_prefix_touch_eligibility(
    kind: type[WaitingQueue], name: str, cfg: dict[str, Any], expected: int
) -> None:
    assert _touch_counts(kind, name, 1, n=100, **cfg) == [expected]


def test_compat_lpm_above_cap_touches_like_fcfs(kind: type[WaitingQueue]) -> None:
    # Above 128 the active policy is fcfs (cache-agnostic): SGLang touches then.
    assert _touch_counts(kind, "lpm", 1, n=200, compat="sglang") == [REFRESH_SPAN]


def test_no_touch_with_disabled_cache_or_empty_queue(kind: type[WaitingQueue]) -> None:
    cache = SpyCache(disable=True)
    make_queue(kind, "fcfs", cache, [mk("a", [1])]).begin_round([], 0, 0.0)
    assert cache.touched == []
    cache = SpyCache()
    queue = make_queue(kind, "fcfs", cache)
    queue.begin_round([], 0, 0.0)
    queue.add(mk("a", [1]))
    queue.begin_round([], 0, 0.0)
    assert cache.touched == [1]  # the empty round was not an eligible round


# ---- every policy, both queues, side by side ------------------------------------------------


class Side:
    """One queue of a ``Twin``, with its own cache and its own copies of the requests."""

    def __init__(
        self,
        kind: type[WaitingQueue],
        config: SchedulerConfig,
        cache: BasePrefixCache,
        alloc: TokenAllocator | None,
    ) -> None:
        self.queue = kind(config, cache)
        self.cache = cache
        self.alloc = alloc
        self.running: list[Req] = []
        self.order: list[Req] = []  # the last computed round's order

    def insert(self, tokens: Sequence[int], ns: Any = None) -> None:
        if not isinstance(self.cache, TREES) or self.alloc is None or self.cache.disabled:
            return
        p = self.cache.page_size
        arr = np.asarray(tokens, dtype=np.int32)
        arr = arr[: len(arr) // p * p]
        if not len(arr):
            return
        short = len(arr) - self.alloc.available_size()
        if short > 0:
            self.cache.evict(short)
        slots = self.alloc.alloc(len(arr))
        if slots is None:
            return
        res = self.cache.insert(CacheKey(arr, ns), slots)
        self.alloc.free(slots[: res.prefix_len])

    def try_admission(self, r: Req) -> None:
        """What the scheduler's admission match writes on a request (``match_for_admission``;
        it splits the node where the match ends)."""
        fill = r.fill_ids()
        cap = r.max_prefix_len(len(fill))
        m = self.cache.match_node(CacheKey(fill[:cap], r.namespace))
        r.prefix_len, r.last_node, r.host_hit_len = m.device_len, m.last_node, 0
        r.num_matched_prefix_tokens = min(m.device_len, cap)


def cache_dump(cache: BasePrefixCache) -> list[tuple[Any, ...]]:
    """The tree (paths, recency, hits) in child order: equal for equal histories."""
    if not isinstance(cache, TREES):
        return []
    out: list[tuple[Any, ...]] = []
    stack = [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        path = (*path, *node.key.tolist())
        out.append((path, node.last_access_time, node.hit_count, node.lock_ref))
        stack.extend((c, path) for c in reversed(list(node.children.values())))
    return out


def req_state(r: Req) -> tuple[Any, ...]:
    return (
        r.rid,
        r.num_matched_prefix_tokens,
        r.prefix_len,
        r.host_hit_len,
        r.queue_entry_time,
        r.queue_entry_processed_tokens,
        r.fill_len,
    )


class Twin:
    """The reference and the fast queue fed the same operations (as the scheduler would feed
    them); ``check`` compares everything the fast queue must reproduce."""

    def __init__(
        self,
        config: SchedulerConfig,
        new_cache: Callable[..., tuple[BasePrefixCache, TokenAllocator | None]],
        cached: Iterable[Sequence[int]] = (),
    ) -> None:
        self.ref = Side(WaitingQueue, config, *new_cache())
        self.fast = Side(NativeWaitingQueue, config, *new_cache(native=True))
        self.sides = (self.ref, self.fast)
        for s in self.sides:
            for seq in cached:
                s.insert(seq)
        self.now = 0.0
        self.processed = 0
        self.made = itertools.count()
        # The two lists may differ in order (not in members) until the next computed round:
        # after a round the fast queue skipped, or one it handed out lazily (hrrn).
        self.loose = False

    def add(self, make: Callable[[str, float, int], Req]) -> None:
        rid = f"r{next(self.made)}"
        for s in self.sides:
            s.queue.add(make(rid, self.now, self.processed))

    def round(self, admit: int, tried: bool, skip: bool) -> None:
        """One prefill round; ``skip``: the batch is full (the fast queue may skip it); else
        admission takes the first ``admit`` requests it may and then fails on one more."""
        self.now += 0.5
        if skip:
            self.ref.queue.begin_round(self.ref.running, self.processed, self.now)
            fast = self.fast.queue
            fast.begin_round(self.fast.running, self.processed, self.now)
            self.loose = hands_out_lazily(fast)
            self.check(full=False)
            return
        works = []
        for s in self.sides:
            q = s.queue
            s.order = q.begin_round(s.running, self.processed, self.now).head(len(q))
            assert {id(r) for r in s.order} == {id(r) for r in q.reqs}
        self.loose = hands_out_lazily(self.fast.queue)
        self.check(full=True)
        for s in self.sides:
            eligible = [r for r in s.order if r.rid not in s.queue.deferred]
            taken = eligible[:admit]
            for r in taken:
                s.try_admission(r)
            ids = {id(r) for r in taken}
            s.queue.take([i for i, r in enumerate(s.queue.reqs) if id(r) in ids])
            works.append([prefill_work(r) for r in taken])
            if s.queue.policy.charges_service:  # the step's prefill, charged to the tenants
                for r in taken:
                    s.queue.fair.charge(r.tenant_key, prefill_work(r), 0)
            for r in taken:  # the prefill ran: its KV is cached, it joins the running batch
                s.insert(r.fill_ids(), r.namespace)
                r.output_ids.append(int(r.fill_ids()[-1]))
                s.running.append(r)
            if tried and len(eligible) > admit:
                r = eligible[admit]
                s.try_admission(r)  # fails (out of budget): the queue is told
                if isinstance(s.queue, NativeWaitingQueue):
                    s.queue.note_tried(r)
        assert works[0] == works[1]
        self.processed += sum(works[0])
        self.check(full=False)

    def cache_op(self, tokens: list[int], evict: int) -> None:
        for s in self.sides:
            if evict:
                s.cache.evict(evict)
            else:
                s.insert(tokens)
        self.check(full=False)

    def decode(self, steps: int) -> None:
        """``steps`` decode steps of the running batch (fair charges each token)."""
        for s in self.sides:
            for r in s.running:
                r.output_ids.extend([int(r.fill_ids()[-1])] * steps)
                if s.queue.policy.charges_service:
                    s.queue.fair.charge(r.tenant_key, 0, steps)

    def finish(self, i: int) -> None:
        for s in self.sides:
            if s.running:
                r = s.running.pop(i % len(s.running))
                s.insert(r.fill_ids(), r.namespace)
                s.queue.forget(r)

    def retract(self, i: int, extra: list[int]) -> None:
        for s in self.sides:
            if s.running:
                r = s.running.pop(i % len(s.running))
                r.output_ids.extend(extra)
                s.insert(r.fill_ids()[:-1], r.namespace)  # radixsched caches what it computed
                r.prefix_len = r.host_hit_len = 0
                r.last_node = None
                s.queue.requeue([r], self.now, self.processed)
        self.check(full=False)

    def abort(self, i: int) -> None:
        names = sorted(rids(self.ref.queue.reqs))
        if not names:
            return
        rid = names[i % len(names)]
        for s in self.sides:
            s.queue.remove(next(r for r in s.queue.reqs if r.rid == rid))
        self.check(full=False)

    def check(self, full: bool) -> None:
        ref, fast = self.ref.queue, self.fast.queue
        if full:
            assert rids(self.ref.order) == rids(self.fast.order)
            assert ref.deferred == fast.deferred and ref.deprioritized == fast.deprioritized
        if not self.loose:
            assert rids(ref.reqs) == rids(fast.reqs)
        else:
            assert sorted(rids(ref.reqs)) == sorted(rids(fast.reqs))
        by_rid = {r.rid: r for r in fast.reqs}
        assert [req_state(r) for r in ref.reqs] == [req_state(by_rid[r.rid]) for r in ref.reqs]
        assert ref.fair.counters == fast.fair.counters
        assert ref.rng.getstate() == fast.rng.getstate()
        assert ref.active_policy() is fast.active_policy()
        assert cache_dump(self.ref.cache) == cache_dump(self.fast.cache)


def _skip_or_round(queue: WaitingQueue) -> None:
    """A round while the batch is full: both queues compute it (nobody reads its order)."""
    queue.begin_round([], 0, 0.0)


@pytest.mark.parametrize("name", ["lpm", "shortest-prefill-first", "fair"])
def test_skipped_round_leaves_ties_where_the_reference_round_puts_them(name: str) -> None:
    """A round the fast queue skips (the batch is full) must leave what the reference round
    leaves, the list's order included: it breaks the next round's ties. x and y arrive
    together and tie; y's match grows before a full-batch round, which the reference orders
    (y first); x's match then catches up, and the next round, a stable sort, keeps y first."""
    orders = {}
    for label, kind in KINDS.items():
        cache = cache_with(kind=kind)
        queue = make_queue(kind, name, cache, [mk("x", [5, 6, 6]), mk("y", [7, 8, 8])])
        assert rids(round_order(queue)) == ["x", "y"]
        put(cache, [7])
        _skip_or_round(queue)
        put(cache, [5])
        orders[label] = rids(round_order(queue))
    assert orders == {"reference": ["y", "x"], "fast": ["y", "x"]}


def test_requeue_after_a_skipped_round_goes_where_the_reference_puts_it() -> None:
    """Where a retracted request re-enters depends on the list's order (its place in arrival
    order only while the list is in arrival order), so a skipped round must leave the list as
    the reference round does. c is admitted; b's match grows before a full-batch round, which
    the reference orders (b before a: out of arrival order); c is retracted, so the reference
    appends it, and c then ties with b (same match, same arrival): b stays first."""
    orders = {}
    for label, kind in KINDS.items():
        cache = cache_with([7], kind=kind)
        c, a, b = mk("c", [7, 9]), mk("a", [5, 6]), mk("b", [8, 6])
        queue = make_queue(kind, "lpm", cache, [c, a, b])
        assert rids(round_order(queue)) == ["c", "a", "b"]
        assert queue.take([0]) == [c]
        c.output_ids.append(3)
        put(cache, [8])
        _skip_or_round(queue)
        queue.requeue([c], 1.0, 0)
        orders[label] = rids(round_order(queue))
    assert orders == {"reference": ["b", "c", "a"], "fast": ["b", "c", "a"]}


def test_fcfs_sorts_requeued_requests_that_entered_out_of_order(kind: type[WaitingQueue]) -> None:
    """A request may enter with an earlier entry time than one already waiting (``add_request``
    with an earlier ``now``); re-queued at their places in arrival order, such requests break
    entry order, and fcfs must sort them by entry."""
    a, b = mk("a", [1], t=1.0), mk("b", [2], t=0.0)  # b entered earlier, arrived later
    queue = make_queue(kind, "fcfs", reqs=[a, b])
    assert rids(round_order(queue)) == ["b", "a"]
    assert rids(queue.take([0, 1])) == ["b", "a"]
    queue.add(mk("c", [3], t=2.0))
    queue.requeue([a], 3.0, 0)
    queue.requeue([b], 3.0, 0)
    assert rids(queue.reqs) == ["a", "b", "c"]  # by arrival
    assert rids(round_order(queue)) == ["b", "a", "c"]


@pytest.mark.parametrize("name", ["fcfs", "routing-key"])
def test_fast_requeue_into_an_unpermuted_list_does_not_scan_the_queue(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Requests re-queued at their places into a list in arrival and entry order leave it in
    both: the fast queue knows it without the reference's scan of the whole list (the scan is
    what a deep queue pays on every retraction), and its order is the reference's. fcfs keeps
    the list in entry order; routing-key without running keys leaves it as it stands."""
    scans: list[int] = []
    scan = WaitingQueue._in_arrival_order
    monkeypatch.setattr(
        WaitingQueue, "_in_arrival_order", lambda self: scans.append(1) or scan(self)
    )
    orders = {}
    for label, kind in KINDS.items():
        scans.clear()
        reqs = [mk(f"r{i}", [i + 1], t=float(i)) for i in range(6)]
        queue = make_queue(kind, name, reqs=reqs)
        round_order(queue)
        taken = queue.take([0, 2, 4])
        queue.requeue(taken[::-1], 9.0, 0)
        orders[label] = (rids(queue.reqs), rids(round_order(queue)), len(scans))
    every = [f"r{i}" for i in range(6)]
    assert orders == {"reference": (every, every, 1), "fast": (every, every, 0)}


def test_failed_admission_match_is_refreshed_next_round() -> None:
    """A failed admission attempt rewrites the request's matched length with the admission's
    (page 2: the match of ``fill[:len - 1]``, 2 tokens here); the next round gives it the
    queue's again (3: ``fill_len - 1`` of a fully cached 4-token prompt). The fast queue is
    told through ``note_tried``."""
    config = SchedulerConfig(schedule_policy="lpm", page_size=2)
    twin = Twin(config, _new_cache(page=2), [[1, 1, 1, 1]])
    twin.add(lambda rid, now, processed: mk(rid, [1, 1, 1, 1], t=now))
    twin.add(lambda rid, now, processed: mk(rid, [2, 2, 2], t=now))
    twin.round(admit=0, tried=True, skip=False)
    assert [r.num_matched_prefix_tokens for r in twin.ref.queue.reqs] == [2, 0]
    twin.round(admit=0, tried=False, skip=False)  # Twin.check: the fast queue agrees
    assert [r.num_matched_prefix_tokens for r in twin.ref.queue.reqs] == [3, 0]


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
PermSpec = tuple[list[int], list[int], int | None, str | None, str | None, int, int]


def _perm_req(rid: str, spec: PermSpec) -> Req:
    p, o, pr, rk, tn, t, pt = spec
    return mk(rid, p, output=o, priority=pr, routing_key=rk, tenant=tn, t=float(t), processed=pt)


def _new_cache(
    page: int = 1, eviction: str = "lru", disabled: bool = False
) -> Callable[..., tuple[BasePrefixCache, TokenAllocator | None]]:
    """The trees of a twin's sides: ``native`` for the fast queue's."""

    def make(native: bool = False) -> tuple[BasePrefixCache, TokenAllocator | None]:
        tree = tree_class(NativeWaitingQueue if native else WaitingQueue)
        if disabled:
            return tree(None, disable=True), None
        alloc = TokenAllocator(1 << 14, page)
        return tree(alloc, page_size=page, eviction_policy=eviction), alloc

    return make


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
    specs: list[PermSpec],
    cached: list[list[int]],
    name: str,
    compat: str,
    priority: bool,
    disabled: bool,
    threshold: int,
) -> None:
    """Every policy, both queues: each round's order is a permutation of the queue, deferred
    requests are deprioritized ones (none under compat), matches are capped, the cache stays
    whole, and the fast queue equals the reference (``Twin.check``)."""
    if disabled and name == "shortest-prefill-first":
        return
    config = SchedulerConfig(
        schedule_policy=name,
        compat=compat,  # type: ignore[arg-type]
        enable_priority_scheduling=priority and name in ("fcfs", "lof"),
        in_batch_prefix_deprioritize_threshold=threshold,
        lpm_max_wait_s=2.0,
    )
    twin = Twin(config, _new_cache(disabled=disabled), cached)
    for spec in specs:
        twin.add(lambda rid, now, processed, spec=spec: _perm_req(rid, spec))
    for s in twin.sides:
        s.running = [_perm_req(f"run{i}", spec) for i, spec in enumerate(specs[: len(specs) // 3])]
    before = sorted(rids(twin.ref.queue.reqs))
    for rnd in range(2):
        twin.now, twin.processed = float(rnd) + 2.5, 40  # the round runs at now + 0.5
        twin.round(admit=0, tried=False, skip=False)
        queue = twin.ref.queue
        assert sorted(rids(twin.ref.order)) == before
        assert queue.deferred <= queue.deprioritized <= set(before)
        if compat == "sglang":
            assert not queue.deferred
        for r in queue.reqs:
            assert 0 <= r.num_matched_prefix_tokens <= max(r.fill_len - 1, 0)
    for s in twin.sides:
        s.cache.check_integrity()


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
    kind=st.sampled_from(list(KINDS.values())),
)
def test_cache_aware_orders_equal_the_spec_keys(
    specs: list[PermSpec],
    cached: list[list[int]],
    name: str,
    compat: str,
    threshold: int,
    kind: type[WaitingQueue],
) -> None:
    """The order each policy hands out (the fast hrrn round lazily) is the spec's sort key's."""
    reqs = [
        _perm_req(f"r{i}", (p, o, None, None, None, t, pt))
        for i, (p, o, *_, t, pt) in enumerate(specs)
    ]
    queue = make_queue(
        kind,
        name,
        cache_with(*cached, kind=kind),
        reqs,
        compat=compat,
        in_batch_prefix_deprioritize_threshold=threshold,
        lpm_max_wait_s=2.0,
    )
    got = round_order(queue, processed_tokens=40, now=4.0)
    key = _reference_key(name, compat == "sglang", queue.deprioritized, 40, 4.0)
    assert rids(got) == rids(sorted(reqs, key=key)), (name, compat, specs, cached, threshold)


twin_req_specs = st.tuples(
    st.lists(st.integers(0, 3), min_size=1, max_size=12),  # prompt
    st.lists(st.integers(0, 3), max_size=2),  # output (a replay)
    st.sampled_from([None, None, "k"]),  # extra_key
    st.sampled_from([None, 0, 3]),  # priority
    st.sampled_from([None, "a", "b"]),  # routing key
    st.sampled_from([None, "t1", "t2"]),  # tenant
    st.integers(1, 64),  # max_new_tokens
    st.sampled_from([0.0, 0.0, -0.25]),  # arrival before now: entries out of order
)
_add = st.tuples(st.just("add"), twin_req_specs)
_round = st.tuples(st.just("round"), st.integers(0, 3), st.booleans(), st.booleans())
twin_ops = st.lists(
    st.one_of(
        _add,
        _add,
        _round,
        _round,
        st.tuples(
            st.just("cache"),
            st.lists(st.integers(0, 3), min_size=1, max_size=14),
            st.sampled_from([0, 0, 3, 10]),
        ),
        st.tuples(st.just("decode"), st.integers(1, 3)),
        st.tuples(st.just("finish"), st.integers(0, 9)),
        st.tuples(st.just("retract"), st.integers(0, 9), st.lists(st.integers(0, 3), max_size=3)),
        st.tuples(st.just("abort"), st.integers(0, 19)),
    ),
    min_size=10,
    max_size=40,
)


def _twin_req(spec: tuple[Any, ...]) -> Callable[[str, float, int], Req]:
    prompt, out, ek, prio, rk, tn, max_new, back = spec

    def make(rid: str, now: float, processed: int) -> Req:
        return mk(
            rid,
            prompt,
            output=out,
            extra_key=ek,
            priority=prio,
            routing_key=rk,
            tenant=tn,
            max_new=max_new,
            t=now + back,
            processed=processed,
        )

    return make


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(POLICIES)),
    compat=st.sampled_from(["radixsched", "radixsched", "sglang"]),
    page=st.sampled_from([1, 1, 2]),
    eviction=st.sampled_from(["lru", "lru", "lfu"]),
    priority=st.booleans(),
    bound=st.sampled_from([None, None, 30]),
    check=st.sampled_from([-1, 0, 2, 32]),
    width=st.sampled_from([0, 1, 2, 4]),
    cap=st.sampled_from([None, None, 3]),
    cached=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=14), max_size=3),
    ops=twin_ops,
)
def test_fast_queue_equals_reference_over_rounds(
    name: str,
    compat: str,
    page: int,
    eviction: str,
    priority: bool,
    bound: int | None,
    check: int,
    width: int,
    cap: int | None,
    cached: list[list[int]],
    ops: list[tuple[Any, ...]],
) -> None:
    """The fast queue against the reference over many rounds, fed as the scheduler feeds them:
    arrivals, admissions (which split nodes and cache the admitted KV), failed admission
    attempts (``note_tried``), finishes, retractions (``requeue``), aborts, rounds the fast
    queue may skip while the batch is full, insertions and evictions; after each step the two
    agree on everything ``Twin.check`` compares."""
    config = SchedulerConfig(
        schedule_policy=name,
        compat=compat,  # type: ignore[arg-type]
        page_size=page,
        radix_eviction_policy=eviction,
        enable_priority_scheduling=priority and name in ("fcfs", "lof"),
        lpm_max_wait_tokens=bound,
        in_batch_prefix_check_threshold=check,
        in_batch_prefix_deprioritize_threshold=width,
        max_prefix_match_queue=cap,
    )
    twin = Twin(config, _new_cache(page, eviction), cached)
    for op in ops:
        if op[0] == "add":
            twin.add(_twin_req(op[1]))
        elif op[0] == "round":
            twin.round(admit=op[1], tried=op[2], skip=op[3])
        elif op[0] == "cache":
            twin.cache_op(op[1], op[2])
        elif op[0] == "decode":
            twin.decode(op[1])
        elif op[0] == "finish":
            twin.finish(op[1])
        elif op[0] == "retract":
            twin.retract(op[1], op[2])
        else:
            twin.abort(op[1])
    twin.round(admit=0, tried=False, skip=False)
    for s in twin.sides:
        s.cache.check_integrity()


# ---- whole simulations ---------------------------------------------------------------------------

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
def test_fast_scheduler_leaves_simulations_bit_identical(
    policy: str, cfg: dict[str, Any], sim: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole simulation (retractions included) with the accelerators (the fast queue's kept
    orders, skipped rounds, decode jumps) and with the reference core: the same results,
    token for token. Guards the assumptions the kept orders make about the scheduler."""
    w = load_workload(f"mooncake:{_SAMPLE}", num_requests=60)
    engine_calls: Counter[str] = Counter()
    for cls in (KeyedEngine, RoutingKeyEngine, HrrnEngine, DfsWeightEngine, FairEngine):
        for meth in ("rebuild", "advance"):

            def counted(
                self: Any, *args: Any, _orig: Any = getattr(cls, meth), _m: str = meth
            ) -> Any:
                engine_calls[_m] += 1
                return _orig(self, *args)

            monkeypatch.setattr(cls, meth, counted)
    native_round = NativeMatcher.round

    def counted_round(self: Any, *args: Any, **kw: Any) -> Any:
        out = native_round(self, *args, **kw)
        if out[2]:  # lpm's kept order advanced inside the native round
            engine_calls["advance"] += 1
        return out

    monkeypatch.setattr(NativeMatcher, "round", counted_round)

    def run(accelerate: bool) -> tuple[str, list[list[float]], int]:
        r = simulate(
            w,
            SchedulerConfig(schedule_policy=policy, **cfg),
            SimConfig(max_total_tokens=60_000, **sim),
            accelerate=accelerate,
        )
        out = r.result.to_json()
        out.pop("wall_s")
        out.pop("requests_per_wall_s")
        return (
            json.dumps(out, sort_keys=True),
            [q.times.token_times for q in r.requests],
            len(r.requests),
        )

    fast = run(True)
    assert json.loads(fast[0])["retractions"] > 0
    assert sum(engine_calls.values()) > 50  # the kept orders really ran
    engine_calls.clear()
    assert run(False) == fast
    assert not engine_calls  # the reference computes every round itself

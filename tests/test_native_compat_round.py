"""SGLang's compat round of shortest-prefill-first and dfs-weight in one native call
(``compat_round``, ``_native/compat_round.cpp``, behind ``NativeWaitingQueue.begin_round``)
against the reference queue's round (``WaitingQueue.begin_round``: its node matching, compat
dedup and order) over the reference ``RadixCache`` and over ``NativeRadixCache``: the same
order, the same dedup verdict, the same request fields and the same tree after, round after
round. And fair's compat round, which is its radixsched round, on the accelerated path.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from fakes import tree_snapshot
from radixsched.cache import CacheKey, RadixCache
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.queue import WaitingQueue
from radixsched.request import Req

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")

# prompt, outputs, extra_key, cache_salt, queue_entry_time
Spec = tuple[list[int], list[int], str | None, str | None, Any]


def _req(i: int, spec: Spec) -> Req:
    prompt, outputs, extra, salt, entry = spec
    r = Req(f"r{i}", np.asarray(prompt, dtype=np.int32), extra_key=extra, cache_salt=salt)
    r.output_ids.extend(outputs)
    r.queue_entry_time = entry
    return r


def _fields(r: Req) -> tuple[Any, ...]:
    vals = (r.prefix_len, r.host_hit_len, r.num_matched_prefix_tokens)
    return (r.rid, *vals, tuple(map(type, vals)), r.last_node.id, len(r.last_node))


def _rounds(
    queue: WaitingQueue, cached: list[tuple[list[int], Any]], specs: list[Spec], tracked: bool
) -> Any:
    """Fill the queue's cache, then three rounds (each over the last one's splits, times and
    order): the order, the dedup's verdict, the fields and the tree each leaves. ``tracked``:
    the requests join through ``add`` (the matcher keeps their memos), else the list is set."""
    cache, page = queue.cache, queue.cache.page_size
    for tokens, ns in cached:
        n = len(tokens) - len(tokens) % page
        cache.insert(CacheKey(np.asarray(tokens[:n], dtype=np.int32), ns), np.arange(1, n + 1))
    reqs = [_req(i, s) for i, s in enumerate(specs)]
    if tracked:
        for r in reqs:
            queue.add(r)
    else:
        queue.reqs = reqs  # not tracked: each walked natively, as the reference walks it
    seen = []
    for _ in range(3):
        order = queue.begin_round([], 0, 0.0)
        rids = [r.rid for r in order.head(len(queue.reqs))]
        verdict = (queue.deprioritized, queue.deferred)
        seen.append((rids, verdict, [_fields(r) for r in queue.reqs], tree_snapshot(cache)))
    return seen


def _check(
    policy: str,
    cached: list[tuple[list[int], Any]],
    specs: list[Spec],
    *,
    page: int = 1,
    native: bool = True,
    **cfg_kw: Any,
) -> Any:
    from radixsched.native.queue import NativeWaitingQueue
    from radixsched.native.radix import NativeRadixCache

    cfg = SchedulerConfig(schedule_policy=policy, compat="sglang", page_size=page, **cfg_kw)
    kw: dict[str, Any] = {"page_size": page, "compat_sglang": True}
    ref = _rounds(WaitingQueue(cfg, RadixCache(None, **kw)), cached, specs, True)
    loop = _rounds(WaitingQueue(cfg, NativeRadixCache(None, **kw)), cached, specs, True)
    assert loop == ref
    for tracked in (True, False):
        fast = NativeWaitingQueue(cfg, NativeRadixCache(None, **kw))
        assert (fast.compat_kind is not None) == native
        assert (fast.matcher is not None) == native
        assert _rounds(fast, cached, specs, tracked) == ref
    return ref


BASE = [1, 2, 3, 4, 5, 6, 7, 8]
CACHED: list[tuple[list[int], Any]] = [
    (BASE, None),
    ([*BASE[:3], 9, 9, 9], None),
    (BASE, ("x", None)),
]


def test_spf_sorts_by_deferred_then_work_then_entry_stably() -> None:
    specs: list[Spec] = [
        ([*BASE, 20], [], None, None, 3.0),  # work 1
        ([*BASE[:3], 9, 9, 9, 9, 9], [], None, None, 1.0),  # work 2
        ([*BASE[:2], 30, 31], [], None, None, 2.0),  # work 2: splits BASE after 2 tokens
        ([*BASE[:3], 40], [], None, None, 2.0),  # work 1, the same entry as r2
        ([*BASE, 21], [], None, None, 3.0),  # r0's twin: kept after it (stable)
        ([50, 51, 52], [], None, None, 0.5),  # a miss: work 3
        (BASE, [], None, None, 2.5),  # all cached: capped at 7, work 1
        (BASE[:4], [], None, None, 0.0),  # all cached (inside a node): capped at 3, work 1
    ]
    got = _check("shortest-prefill-first", CACHED, specs, in_batch_prefix_check_threshold=-1)
    assert got[0][0] == ["r7", "r3", "r6", "r0", "r4", "r1", "r2", "r5"]
    matched = {f[0]: f[3] for f in got[0][2]}  # num_matched_prefix_tokens, by rid
    assert (matched["r6"], matched["r7"]) == (7, 3)
    assert got[0][1] == (frozenset(), frozenset())


@pytest.mark.parametrize("threshold", [-1, 0, 2, 3])
@pytest.mark.parametrize("check", [-1, 0, 2, 100])
def test_spf_defers_the_compat_dedup_s_duplicates_last(threshold: int, check: int) -> None:
    """Every dedup branch (off, all candidates, groups by namespace and first tokens with
    outputs in the key and short fills left out), the deferred sorted last."""
    specs: list[Spec] = [
        ([60, 61, 62, 63], [], None, None, 1.0),
        ([60, 61, 62, 70, 71], [], None, None, 0.5),  # r0's group at 3 tokens
        ([60, 61, 62, 63], [], "y", None, 2.0),  # another namespace
        ([60, 61], [62], None, "", 0.0),  # outputs: r0's group (an empty salt: default)
        ([60], [], None, None, 4.0),  # shorter than the threshold
        ([*BASE, 1], [], None, None, 5.0),  # matches 8 tokens: a candidate only at check 100
        ([*BASE, 2], [], None, None, 6.0),
    ]
    got = _check(
        "shortest-prefill-first",
        CACHED,
        specs,
        in_batch_prefix_check_threshold=check,
        in_batch_prefix_deprioritize_threshold=threshold,
    )
    deferred = got[0][1][0]
    if check == 100 and threshold == 3:
        assert deferred == frozenset({"r1", "r3", "r6"})
        assert got[0][0][-3:] == ["r6", "r3", "r1"]  # last, by work (1, 3, 5)
    if check < 0:
        assert deferred == frozenset()


@pytest.mark.parametrize(
    "entries",
    [
        [2**60, 2**60 + 1, 0.0, 1],  # ints past 2**53: Python's exact comparison
        [float("nan"), 1.0, 0.5, float("nan")],  # NaN: Python's sort, as it goes
        [Fraction(1, 3), 0.0, 1.0, 2],  # not a float or an int
        [True, 0, 1.0, False],  # bool: an int subclass
    ],
)
def test_spf_entry_times_a_double_does_not_hold_fall_back_to_python_s_sort(
    entries: list[Any],
) -> None:
    from radixsched.native.radix import NativeRadixCache

    specs: list[Spec] = [([70 + i, 1, 2], [], None, None, t) for i, t in enumerate(entries)]
    _check("shortest-prefill-first", CACHED, specs, in_batch_prefix_check_threshold=-1)
    reqs = [_req(i, s) for i, s in enumerate(specs)]
    mod: Any = core()
    tree = NativeRadixCache(None, compat_sglang=True).tree
    deferred, ordered = mod.compat_round(tree, reqs, None, False, lambda ns: 1, False, 0, 0, 1)
    assert (
        deferred == frozenset()
        and not ordered
        and [r.rid for r in reqs] == ["r0", "r1", "r2", "r3"]
    )  # untouched


def test_spf_ints_and_floats_compare_exactly_in_the_native_sort() -> None:
    """Entry times of ints (within 2**53) and floats: the native sort, ties equal across types
    (3 == 3.0 keeps the list's order)."""
    from radixsched.native.radix import NativeRadixCache

    entries: list[Any] = [3, 3.0, 2**53, 2.0**53, -(2**53), 0.5, 1]
    specs: list[Spec] = [([80 + i, 1, 2], [], None, None, t) for i, t in enumerate(entries)]
    got = _check("shortest-prefill-first", CACHED, specs, in_batch_prefix_check_threshold=-1)
    assert got[0][0] == ["r4", "r5", "r6", "r0", "r1", "r2", "r3"]
    cache = NativeRadixCache(None, compat_sglang=True)
    reqs = [_req(i, s) for i, s in enumerate(specs)]
    mod: Any = core()
    deferred, ordered = mod.compat_round(
        cache.tree, reqs, None, False, lambda ns: 1, False, 0, 0, 1
    )
    assert ordered and deferred == frozenset()


@pytest.mark.parametrize("page", [1, 4])
def test_dfs_weight_orders_by_the_tree_as_each_walk_left_it(page: int) -> None:
    p = page
    cached: list[tuple[list[int], Any]] = [
        (list(range(1, 8 * p + 1)), None),
        ([*range(1, 2 * p + 1), *range(50, 50 + 2 * p)], None),
        (list(range(90, 90 + 2 * p)), None),
    ]
    specs: list[Spec] = [
        (list(range(90, 90 + 3 * p)), [], None, None, 0.0),
        (list(range(1, 4 * p + 1)), [], None, None, 0.0),  # splits the first at 4 pages
        (list(range(1, 8 * p + 2)), [], None, None, 0.0),  # its lower part, after the split
        ([*range(1, 2 * p + 1), *range(50, 50 + 3 * p)], [], None, None, 0.0),
        (list(range(1, 3 * p + 1)), list(range(3 * p + 1, 6 * p + 1)), None, None, 0.0),
        ([7] * (2 * p), [], "x", None, 0.0),  # a miss in its own namespace
    ]
    got = _check("dfs-weight", cached, specs, page=p)
    assert sorted(got[0][0]) == sorted(f"r{i}" for i in range(6))


@pytest.mark.parametrize("policy", ["shortest-prefill-first", "dfs-weight"])
def test_a_tracked_request_s_int_fields_are_set_whatever_int_they_held(policy: str) -> None:
    """A tracked request's round sets its int fields unless they hold that int already (read
    in place from an int's digits where it has one or two): every other int is replaced."""
    from radixsched.native.queue import NativeWaitingQueue
    from radixsched.native.radix import NativeRadixCache

    cfg = SchedulerConfig(schedule_policy=policy, compat="sglang")
    queue = NativeWaitingQueue(cfg, NativeRadixCache(None, compat_sglang=True))
    tokens = list(range(1, 2**5))  # 3 of them cached: prefix_len 3, matched 3
    queue.cache.insert(CacheKey(np.asarray(tokens[:3], dtype=np.int32)), np.arange(1, 4))
    r = _req(0, (tokens, [], None, None, 0.0))
    queue.add(r)
    for held in [3 + 2**30, 3 - 2**30, -3, 3 + 2**60, 3 - 2**60, 3 + 2**64, 0, 2**30, 2**31]:
        r.prefix_len = r.num_matched_prefix_tokens = held
        r.host_hit_len = held + 1
        queue.begin_round([], 0, 0.0)
        assert (r.prefix_len, r.num_matched_prefix_tokens, r.host_hit_len) == (3, 3, 0)


def test_an_empty_queue_and_the_policies_the_call_does_not_order() -> None:
    _check("shortest-prefill-first", CACHED, [])
    _check("dfs-weight", CACHED, [])
    specs: list[Spec] = [([*BASE, 3], [], None, None, 1.0), ([60, 61], [], None, None, 0.0)]
    _check("lpm", CACHED, specs, native=False)  # its own key: the reference round
    _check("hrrn", CACHED, specs, native=False)


def test_fair_s_compat_round_is_its_radixsched_round_on_the_accelerated_path() -> None:
    """fair has no SGLang variant, matches read-only and reads no dedup: its compat round is
    the accelerated one (the kept order), with the reference's requeue (appended, stamped)."""
    from radixsched.native.queue import NativeWaitingQueue
    from radixsched.native.radix import NativeRadixCache

    for policy, fast in [("fair", True), ("shortest-prefill-first", False), ("lpm", False)]:
        cfg = SchedulerConfig(schedule_policy=policy, compat="sglang")
        assert NativeWaitingQueue(cfg, NativeRadixCache(None, compat_sglang=True)).fast is fast
    cfg = SchedulerConfig(schedule_policy="fair", compat="sglang")
    seen = []
    for queue in (
        WaitingQueue(cfg, NativeRadixCache(None, compat_sglang=True)),
        NativeWaitingQueue(cfg, NativeRadixCache(None, compat_sglang=True)),
    ):
        cache = queue.cache
        cache.insert(CacheKey(np.asarray(BASE, dtype=np.int32)), np.arange(1, 9))
        reqs = []
        for i, (prompt, tenant) in enumerate([(BASE[:5], "a"), ([9, 9], "b"), (BASE, "a")]):
            r = Req(f"r{i}", np.asarray([*prompt, 100 + i], dtype=np.int32), tenant=tenant)
            r.queue_entry_time = r.arrival_time = float(i)
            reqs.append(r)
            queue.add(r)
        rounds = []
        for step in range(3):
            order = queue.begin_round([], 10 * step, float(step))
            rounds.append([r.rid for r in order.head(len(queue))])
            if step == 0:  # the head leaves and comes back: SGLang appends it, re-stamped
                head = queue.take([0])
                queue.fair.charge(head[0].tenant_key, 5, 0)
                queue.requeue(head, 5.0, 10)
        seen.append((rounds, [r.queue_entry_time for r in reqs], queue.fair.counters))
    assert seen[0] == seen[1]
    assert seen[1][0][0] == ["r1", "r2", "r0"]  # equal counters: the older head (b) first


class _Watched(Req):
    """A request whose ``prefix_len`` is a property (no slot): every write goes through it."""

    @property  # type: ignore[override]
    def prefix_len(self) -> int:
        got: int = self.__dict__.get("_prefix", 0)
        return got

    @prefix_len.setter
    def prefix_len(self, v: int) -> None:
        self.__dict__.setdefault("writes", []).append(v)
        self.__dict__["_prefix"] = v


def test_attributes_that_are_not_plain_slots_go_through_python() -> None:
    """The round writes a slot through its descriptor only where the type's attribute is one;
    a subclass's property is called (and plain requests around it still match)."""
    from radixsched.native.radix import NativeRadixCache

    cache = NativeRadixCache(None, compat_sglang=True)
    cache.insert(CacheKey(np.asarray(BASE, dtype=np.int32)), np.arange(1, 9))
    plain = [_req(i, ([*BASE[:3], 50 + i], [], None, None, 0.0)) for i in range(2)]
    watched = _Watched("w", np.asarray([*BASE[:5], 60], dtype=np.int32))
    reqs: list[Req] = [plain[0], watched, plain[1]]
    mod: Any = core()
    mod.compat_round(cache.tree, reqs, None, False, lambda ns: 1, False, 0, 0, 0)
    assert watched.__dict__["writes"] == [0, 5]  # the dataclass's init, then the round's
    assert [r.prefix_len for r in plain] == [3, 3]
    assert [r.num_matched_prefix_tokens for r in reqs] == [3, 5, 3]

"""``NativeWaitingQueue.take`` in one native call (``queue_take``, ``_native/round.cpp``): the same
list, matcher, dicts, arrivals and kept order as the Python take (``WaitingQueue.take``, then
``_untrack`` per request), for every engine; and the call's own branches on plain objects."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from radixsched.cache import CacheKey
from radixsched.config import SchedulerConfig
from radixsched.native import core, namespace_of
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache
from radixsched.request import Req

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _queue(policy: str, native: bool) -> NativeWaitingQueue:
    q = NativeWaitingQueue(SchedulerConfig(schedule_policy=policy), NativeRadixCache(None))
    if not native:
        q._native_take = None  # the Python take, request by request
    return q


def _state(q: NativeWaitingQueue) -> tuple[Any, ...]:
    m, e = q.matcher, q.engine
    return (
        [r.rid for r in q.reqs],
        None if m is None else sorted(r.rid for r in m.reqs.values()),
        None if m is None else len(m._fills),
        sorted(r.rid for r in q.moved.values()),
        sorted(r.rid for r in q.tried.values()),
        [r.rid for r in q.added],
        None if e is None else [r.rid for r in e.members()],
    )


def _fill(q: NativeWaitingQueue, start: int, n: int) -> None:
    for i in range(start, start + n):
        toks = np.asarray([i % 3, i % 5, i, i + 1], dtype=np.int32)
        q.add(Req(f"r{i}", toks, arrival_time=float(i)))


@pytest.mark.parametrize("policy", ["lpm", "fcfs", "dfs-weight", "hrrn", "routing-key", "fair"])
def test_native_take_leaves_what_the_python_take_leaves(policy: str) -> None:
    twins = [_queue(policy, native=True), _queue(policy, native=False)]
    for q in twins:
        _fill(q, 0, 6)
        q.begin_round([], 0, 1.0)  # the engine's members
        _fill(q, 6, 3)  # arrivals not yet ordered
        q.note_tried(q.reqs[1])
    taken = [q.take([7, 1, 4]) for q in twins]  # an arrival, a tried one, a member
    assert [r.rid for r in taken[0]] == [r.rid for r in taken[1]] == ["r7", "r1", "r4"]
    assert _state(twins[0]) == _state(twins[1])
    m = twins[0].matcher
    if m is not None:
        assert all(m.memo.get(id(r)) is None for r in taken[0])  # untracked in the tree
    for q in twins:  # a later round still agrees
        q.begin_round([], 0, 2.0)
    assert _state(twins[0]) == _state(twins[1])


class _Order:
    """An order other than a StableOrder: its ``remove`` is called by name."""

    def __init__(self) -> None:
        self.removed: list[str] = []

    def remove(self, r: Any) -> None:
        self.removed.append(r.rid)


class _R:
    def __init__(self, rid: str) -> None:
        self.rid = rid


def test_queue_take_branches_on_plain_objects() -> None:
    take = core().queue_take  # type: ignore[union-attr]
    reqs = [_R(c) for c in "abcde"]
    q, added = list(reqs), [reqs[3]]
    moved = {id(reqs[0]): reqs[0], id(reqs[1]): reqs[1]}
    tried = {id(reqs[4]): reqs[4]}
    gone: list[str] = []
    ref = list(q)  # the reference's take: read each position, then delete highest first
    for i in sorted([4, 0, -2], reverse=True):
        del ref[i]
    got = take(
        q, [4, 0, -2], None, None, None, moved, tried, added, None, lambda r: gone.append(r.rid)
    )
    assert [r.rid for r in got] == ["e", "a", "d"]  # positions as given; -2 counts from the end
    assert q == ref and [r.rid for r in q] == ["b", "d"]
    assert added == [] and gone == ["e", "a"]  # the arrival left the arrivals, not the order
    assert list(moved) == [id(reqs[1])] and tried == {}
    order = _Order()
    take(q, [1], None, None, None, {}, {}, [], order, None)
    assert order.removed == ["d"] and [r.rid for r in q] == ["b"]
    before = list(q)
    with pytest.raises(IndexError):
        take(q, [0, 5], None, None, None, {}, {}, [], None, None)
    assert q == before  # nothing deleted: every position is read first, as the list's take


class _Logged(list):  # type: ignore[type-arg]
    """A list whose deletions are seen (``del l[i]`` through its own ``__delitem__``)."""

    def __init__(self, items: Any) -> None:
        super().__init__(items)
        self.deleted: list[int] = []

    def __delitem__(self, i: Any) -> None:
        self.deleted.append(i)
        super().__delitem__(i)


def test_queue_take_deletes_from_a_list_subclass_through_its_own_del() -> None:
    """An exact list's items are moved down in place; a subclass's deletions (the list's and
    the arrivals') go through its ``__delitem__``, as Python's ``del`` does."""
    take = core().queue_take  # type: ignore[union-attr]
    reqs = [_R(c) for c in "abcd"]
    q, added = _Logged(reqs), _Logged([reqs[2]])
    got = take(q, [2, 0], None, None, None, {}, {}, added, None, None)
    assert [r.rid for r in got] == ["c", "a"] and [r.rid for r in q] == ["b", "d"]
    assert q.deleted == [2, 0] and added.deleted == [0] and list(added) == []


def test_queue_take_without_an_engine_or_matcher_only_edits_the_list() -> None:
    take = core().queue_take  # type: ignore[union-attr]
    reqs = [_R(c) for c in "xyz"]
    q = list(reqs)
    assert [r.rid for r in take(q, [], None, None, None, {}, {}, [], None, None)] == []
    assert [r.rid for r in take(q, [2, 1], None, None, None, {}, {}, [], None, None)] == ["z", "y"]
    assert [r.rid for r in q] == ["x"]


def _tree_state(c: Any) -> list[tuple[int, int, int]]:
    return [(n.id, n.last_access_time, len(n.key)) for n in c._iter_nodes()]


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_native_refresh_touches_what_the_reference_refresh_touches(policy: str) -> None:
    """The reference refresh's touches (``touch_fills``): fills walked last to first, ahead of
    the queue then the order's head, in namespaces too, the head read from the list where
    the round's order is the list: the same clock, access times and splits."""
    rng = np.random.default_rng(5)
    twins = [_queue(policy, native=True), _queue(policy, native=True)]
    twins[1]._touch_fills = None  # the reference's refresh
    ahead = [Req("a0", np.asarray([1, 2, 0], dtype=np.int32))]
    for q in twins:
        q.ahead = lambda: ahead
    for i in range(40):
        seq = rng.integers(0, 3, int(rng.integers(1, 12))).astype(np.int32)
        for q in twins:
            q.cache.insert(CacheKey(seq), np.arange(100 * i, 100 * i + len(seq)))
        salt = "s" if i % 3 == 0 else None
        for q in twins:
            q.add(Req(f"r{i}", seq.copy(), arrival_time=float(i), cache_salt=salt))
    for rnd in range(70):  # past two refresh intervals
        for q in twins:
            q.begin_round([], rnd, float(rnd))
        assert _tree_state(twins[0].cache) == _tree_state(twins[1].cache)
    assert twins[0]._refresh_rounds == twins[1]._refresh_rounds > 64


def test_touch_fills_walks_nothing_on_a_disabled_tree() -> None:
    touch = core().touch_fills  # type: ignore[union-attr]
    cache = NativeRadixCache(None, disable=True)
    r = Req("x", np.asarray([1, 2], dtype=np.int32))
    touch(cache.tree, [r], [r], lambda r: 1 / 0)  # nothing read: no namespace asked
    assert [n.last_access_time for n in cache._iter_nodes()] == [
        n.last_access_time for n in NativeRadixCache(None, disable=True)._iter_nodes()
    ]


class _OwnFill(Req):
    """A request type whose fill is its own (so ``touch_fills`` must call it)."""

    calls = 0

    def fill_ids(self) -> Any:
        _OwnFill.calls += 1
        return np.asarray([2, 1, 0], dtype=np.int32)


def _fill_reqs() -> list[Req]:
    """Requests whose fills ``touch_fills`` reads itself (a ``Req``'s prompt, its outputs
    joined) or asks for (outputs that are not plain ints, a subclass's own fill)."""
    reqs = [
        Req("p", np.asarray([1, 2, 0, 1], dtype=np.int32)),  # no outputs: the prompt in place
        Req("o", np.asarray([1, 2], dtype=np.int32), output_ids=[0, 2, 2]),  # joined
        Req("s", np.asarray([1, 2], dtype=np.int32), output_ids=[0], cache_salt="s"),
        Req("n", np.asarray([1, 2], dtype=np.int32), output_ids=[np.int64(0), 1]),  # asked
        _OwnFill("f", np.asarray([9], dtype=np.int32)),
        Req("e", np.asarray([2, 1], dtype=np.int32), output_ids=[-(2**31), 2**31 - 1]),
    ]
    return reqs


def test_touch_fills_reads_a_reqs_fill_as_fill_ids_makes_it() -> None:
    """``plain``: a ``Req``'s fill (prompt, then outputs) read natively, any other request's
    fill asked of it: the same walks (clock, access times, splits) as fill_ids' fills."""
    touch = core().touch_fills  # type: ignore[union-attr]
    rng = np.random.default_rng(9)
    caches = [NativeRadixCache(None), NativeRadixCache(None)]
    for i in range(30):
        seq = rng.integers(0, 3, int(rng.integers(1, 8))).astype(np.int32)
        for c in caches:
            c.insert(CacheKey(seq), np.arange(100 * i, 100 * i + len(seq)))
    _OwnFill.calls = 0
    for c, plain in zip(caches, (Req, None), strict=True):
        reqs = _fill_reqs()
        touch(c.tree, reqs[:3], reqs[3:], namespace_of, plain)
    assert _OwnFill.calls == 2  # asked of it either way
    assert _tree_state(caches[0]) == _tree_state(caches[1])
    big = Req("b", np.asarray([1], dtype=np.int32), output_ids=[2**31])  # not int32: asked,
    for c, plain in zip(caches, (Req, None), strict=True):  # and fill_ids raises
        with pytest.raises(OverflowError):
            touch(c.tree, [big], [], namespace_of, plain)

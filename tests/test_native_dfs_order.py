"""dfs-weight's native kept order (``_native/dfs_order.cpp``, behind ``DfsWeightEngine``) against
the reference round: a ``WaitingQueue`` over the Python tree and a ``NativeWaitingQueue`` over the
native tree get the same requests and the same cache edits, and every round's whole order must
be the same. Each case also checks which branch the kept order took (an advance, or a rebuild
around a new base), so that a case that stops reaching its branch fails rather than passes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixsched.cache import CacheKey, RadixCache
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.orders import DfsWeightEngine
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache
from radixsched.queue import WaitingQueue
from radixsched.request import Req

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")

PAGES = (1, 16)


class Twins:
    """A reference queue over the Python tree and a fast one over the native tree, edited
    alike. Tokens are given in pages: page v is ``page`` tokens ``v * 64 + k``."""

    def __init__(self, page: int, **cfg: Any) -> None:
        self.page = page
        self.caches = [RadixCache(None, page_size=page), NativeRadixCache(None, page_size=page)]
        config = SchedulerConfig(schedule_policy="dfs-weight", page_size=page, **cfg)
        self.ref = WaitingQueue(config, self.caches[0])
        self.fast = NativeWaitingQueue(config, self.caches[1])
        self.rounds = 0
        self.seq = 0

    def tokens(self, pages: list[int], tail: int = 0) -> np.ndarray:
        """The pages' tokens, then ``tail`` tokens of a page of their own (never cached)."""
        toks = [v * 64 + k for v in pages for k in range(self.page)]
        toks += [63 * 64 + 7 + self.seq * 3 + k for k in range(tail)]
        return np.asarray(toks, dtype=np.int32)

    def insert(self, pages: list[int]) -> None:
        t = self.tokens(pages)
        for c in self.caches:
            c.insert(CacheKey(t), np.arange(len(t)))

    def evict(self, n: int) -> None:
        for c in self.caches:
            c.evict(n)

    def add(self, rid: str, pages: list[int]) -> None:
        t = self.tokens(pages, tail=1)  # one token past the pages: the pages can all match
        for q in (self.ref, self.fast):
            q.add(Req(rid, t.copy(), arrival_time=float(self.seq)))
        self.seq += 1

    def take(self, rid: str) -> tuple[Req, Req]:
        taken = []
        for q in (self.ref, self.fast):
            pos = [r.rid for r in q.reqs].index(rid)
            taken.append(q.take([pos])[0])
        return taken[0], taken[1]

    def requeue(self, pair: tuple[Req, Req]) -> None:
        for q, r in zip((self.ref, self.fast), pair, strict=True):
            q.requeue([r], float(self.rounds), 10 * self.rounds)

    def round(self) -> list[str]:
        """One round in both; their whole orders must agree (returned)."""
        now = self.rounds
        orders = [q.begin_round([], 10 * now, float(now)) for q in (self.ref, self.fast)]
        self.rounds += 1
        got = [[r.rid for r in o.head(len(self.ref) + 1)] for o in orders]
        assert got[0] == got[1], self.rounds
        assert [r.rid for r in self.fast.reqs] == got[1]  # the list is the round's order
        return got[0]

    @property
    def engine(self) -> DfsWeightEngine:
        engine = self.fast.engine
        assert isinstance(engine, DfsWeightEngine)
        return engine

    @contextmanager
    def calls(self) -> Iterator[dict[str, int]]:
        """Counts the kept order's advances, rebuilds and places (an advance that declines
        rebuilds), wherever they are called from: the engine, or the native round."""
        order, seen = self.engine.order, {"advance": 0, "rebuild": 0, "place": 0}
        before = dict(order.calls)
        try:
            yield seen
        finally:
            seen.update({name: order.calls[name] - before[name] for name in seen})

    def top(self, rid: str) -> int | None:
        r = next(r for r in self.fast.reqs if r.rid == rid)
        top: int | None = self.engine.order.top_of(r)
        return top


def _branches(page: int, **cfg: Any) -> Twins:
    """Prefix P = pages [1, 2] with children A = [3, 4], B = [5, 6], C = [7]; a separate
    branch Q = [9, 9]. Six waiting requests pass through P: the base is P's node. The
    in-batch dedup is off unless ``cfg`` turns it on."""
    tw = Twins(page, **{"in_batch_prefix_check_threshold": -1, **cfg})
    for pages in ([1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 7], [9, 9]):
        tw.insert(pages)
    tw.add("a1", [1, 2, 3, 4])  # ends at A's end
    tw.add("b1", [1, 2, 5, 6])
    tw.add("a2", [1, 2, 3])  # ends inside A
    tw.add("p1", [1, 2, 8])  # ends at P's end: of no child's group
    tw.add("b2", [1, 2, 5, 6, 8])
    tw.add("c1", [1, 2, 7])
    return tw


def test_the_queue_hands_its_kept_order_to_the_native_round() -> None:
    """The native round (``queue_round``) advances dfs-weight's kept order: the queue hands
    it over (the Python ``_order`` then does not run; the counts above are the order's own)."""
    tw = _branches(1)
    assert tw.fast.kept_order is tw.engine.order
    _first_round(tw)  # not yet in sync: the Python round rebuilds
    tw.add("p2", [1, 2])
    with tw.calls() as calls:
        tw.engine.advance = None  # (a Python advance would fail: the native one runs)
        tw.round()
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}


def _first_round(tw: Twins) -> list[str]:
    with tw.calls() as calls:
        order = tw.round()
    assert calls == {"advance": 0, "rebuild": 1, "place": 0}
    base = tw.engine.order.base
    assert base.parent is not None and base.parent.parent is None  # P, under the root
    assert len(base) == 2 * tw.page
    return order


@pytest.mark.parametrize("page", PAGES)
def test_rebuild_orders_children_by_count_then_slot_and_the_base_members_last(page: int) -> None:
    tw = _branches(page)
    assert _first_round(tw) == ["a1", "a2", "b1", "b2", "c1", "p1"]
    tops = {rid: tw.top(rid) for rid in ("a1", "a2", "b1", "b2", "c1", "p1")}
    assert tops["a1"] == tops["a2"] != tops["b1"] == tops["b2"] != tops["c1"]
    assert tops["p1"] is None and None not in (tops["a1"], tops["b1"], tops["c1"])


@pytest.mark.parametrize("page", PAGES)
def test_a_changed_member_is_re_segmented_without_a_rebuild(page: int) -> None:
    tw = _branches(page)
    _first_round(tw)
    tw.insert([1, 2, 5, 6, 8])  # b2's match goes deeper, in B's own subtree
    tw.insert([1, 2, 7, 3])  # a child under C that no match reaches: nothing moves there
    with tw.calls() as calls:
        assert tw.round() == ["a1", "a2", "b2", "b1", "c1", "p1"]
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}


@pytest.mark.parametrize("page", PAGES)
def test_an_arrival_under_a_new_child_forms_its_group(page: int) -> None:
    tw = _branches(page)
    _first_round(tw)
    tw.insert([1, 2, 11, 12])
    tw.add("d1", [1, 2, 11, 12])
    tw.add("d2", [1, 2, 11])
    tw.add("d3", [1, 2, 11, 12, 13])
    tw.add("p2", [1, 2])
    with tw.calls() as calls:
        assert tw.round() == ["d1", "d3", "d2", "a1", "a2", "b1", "b2", "c1", "p1", "p2"]
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}
    assert tw.top("d1") == tw.top("d2") not in (tw.top("a1"), tw.top("b1"), tw.top("c1"))


@pytest.mark.parametrize("page", PAGES)
def test_a_member_outside_the_base_rebuilds_around_the_root(page: int) -> None:
    tw = _branches(page)
    _first_round(tw)
    tw.add("q1", [9, 9])  # its match ends in Q, beside P
    with tw.calls() as calls:
        tw.round()
    assert calls == {"advance": 1, "rebuild": 1, "place": 0}
    assert tw.engine.order.base.parent is None  # the root
    tw.add("p3", [1, 2])
    with tw.calls() as calls:
        tw.round()
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}


@pytest.mark.parametrize("page", PAGES)
def test_a_member_above_the_base_fits(page: int) -> None:
    tw = _branches(page)
    _first_round(tw)
    tw.add("none", [30])  # no match: ends at the root, above the base
    with tw.calls() as calls:
        assert tw.round()[-1] == "none"  # the shallowest match, last
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}
    assert tw.top("none") is None


@pytest.mark.parametrize("page", PAGES)
def test_a_detached_base_rebuilds(page: int) -> None:
    tw = _branches(page)
    _first_round(tw)
    base = tw.engine.order.base
    tw.evict(10_000)  # everything: P's node is detached
    assert base.parent is None
    with tw.calls() as calls:
        tw.round()
    assert calls == {"advance": 1, "rebuild": 1, "place": 0}
    tw.insert([1, 2, 5])
    tw.add("b3", [1, 2, 5])
    tw.round()


@pytest.mark.parametrize("page", PAGES)
def test_remove_re_segments_the_leavers_group(page: int) -> None:
    tw = _branches(page)
    _first_round(tw)
    tw.take("b1")  # B is left with b2: it ties C by count, and comes first by slot
    tw.take("p1")
    with tw.calls() as calls:
        assert tw.round() == ["a1", "a2", "b2", "c1"]
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}
    tw.take("a1")
    tw.take("a2")  # A's group is gone
    tw.insert([1, 2, 7, 3])
    tw.add("c2", [1, 2, 7, 3])
    with tw.calls() as calls:
        assert tw.round() == ["c2", "c1", "b2"]
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}


def test_remove_of_a_non_member_does_nothing_and_place_needs_a_neighbour() -> None:
    tw = _branches(1)
    order = tw.engine.order
    stranger = Req("x", np.arange(3, dtype=np.int32))
    order.remove(stranger)
    assert order.place(stranger, 0) is False and len(order) == 0
    _first_round(tw)
    with pytest.raises(KeyError):
        order.top_of(stranger)
    with pytest.raises(IndexError):
        order.place(stranger, 99)


@pytest.mark.parametrize("page", PAGES)
def test_a_requeued_request_is_placed_then_re_keyed(page: int) -> None:
    """Requests that match nothing tie on their key: the sorted list stays in arrival order,
    so a retracted request goes back to its place there, and the kept order takes it."""
    tw = Twins(page)
    tw.insert([1, 2])
    for i in range(6):
        tw.add(f"u{i}", [20 + i])
    tw.round()
    taken = tw.take("u2")
    tw.add("u6", [21 + 6])
    tw.round()
    with tw.calls() as calls:
        tw.requeue(taken)
        assert tw.fast.synced and tw.fast._in_sync(tw.engine)
    assert calls["place"] == 1
    assert tw.top("u2") is None
    tw.add("p", [1, 2])  # ends at P, a child of the base (the root): ahead of the rest
    with tw.calls() as calls:
        assert tw.round()[0] == "p"
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}


@pytest.mark.parametrize("page", PAGES)
def test_deferred_members_go_last_in_their_dfs_order(page: int) -> None:
    """Every request under P matches 2 to 4 pages (at most the check) and shares P's two
    pages: one group of the in-batch dedup. Its representative (the cheapest, then the
    oldest: c1) leads; the others follow in their DFS order."""
    tw = Twins(
        page,
        in_batch_prefix_check_threshold=8 * page,
        in_batch_prefix_deprioritize_threshold=2 * page,
    )
    for pages in ([1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 7]):
        tw.insert(pages)
    for rid, pages in [
        ("c1", [1, 2, 7]),
        ("a1", [1, 2, 3, 4]),
        ("b1", [1, 2, 5, 6]),
        ("a2", [1, 2, 3]),
        ("p1", [1, 2, 8]),
        ("b2", [1, 2, 5, 6, 8]),
    ]:
        tw.add(rid, pages)
    assert tw.round() == ["c1", "a1", "a2", "b1", "b2", "p1"]
    assert tw.fast.deferred == frozenset({"a1", "a2", "b1", "b2", "p1"})
    tw.add("e1", [1, 2, 3, 4])  # deferred too: A's group grows to 3
    tw.insert([1, 2, 7, 9])
    tw.add("c2", [1, 2, 7, 9])  # as cheap as c1 and newer: deferred
    with tw.calls() as calls:
        assert tw.round() == ["c1", "a1", "e1", "a2", "b1", "b2", "c2", "p1"]
    assert calls == {"advance": 1, "rebuild": 0, "place": 0}


# ---- random rounds against the reference ------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(1, 4), min_size=1, max_size=5)),
        st.tuples(st.just("add"), st.lists(st.integers(1, 4), min_size=0, max_size=5)),
        st.tuples(st.just("evict"), st.integers(1, 40)),
        st.tuples(st.just("take"), st.integers(0, 30)),
        st.tuples(st.just("requeue"), st.integers(0, 30)),
        st.tuples(st.just("round"), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, page=st.sampled_from(PAGES), dedup=st.booleans())
def test_random_rounds_equal_the_reference(ops: list[Any], page: int, dedup: bool) -> None:
    cfg = {"in_batch_prefix_check_threshold": 3 * page if dedup else -1}
    cfg["in_batch_prefix_deprioritize_threshold"] = page
    tw = Twins(page, **cfg)
    out: list[tuple[Req, Req]] = []
    for n, (op, arg) in enumerate(ops):
        if op == "insert":
            tw.insert(arg)
        elif op == "add":
            tw.add(f"r{n}", arg)
        elif op == "evict":
            tw.evict(arg * page)
        elif op == "take" and tw.ref.reqs:
            out.append(tw.take(tw.ref.reqs[arg % len(tw.ref.reqs)].rid))
        elif op == "requeue" and out:
            tw.requeue(out.pop(arg % len(out)))
        elif op == "round":
            tw.round()
    tw.round()
    tw.round()


# ---- the tree's dfs-weight order over given match ends ------------------------------------------


def test_dfs_weight_order_at_reads_only_the_reached_nodes_and_agrees_with_the_reference() -> None:
    """``Tree::dfs_weight_order_at`` (the kept order's segments, the compat round's order) on a
    node with many children that no match reaches, children tied by weight (creation order
    breaks the tie: [8, 8] before [5, 6]), a subtree heavier than a node's own matches say
    ([1, 2]'s six against [9, 9]'s three), matches at a node's end and inside it (ties in
    their order; several offsets inside one node, deepest first), one at the root and one
    in a detached node (last)."""
    caches = [RadixCache(None, page_size=1), NativeRadixCache(None, page_size=1)]
    seqs = [[1, 2, 7], [1, 2, 3, 4], [1, 2, 8, 8], [1, 2, 5, 6], [9, 9], [20, 21, 22, 23]]
    seqs += [[1, 2, 100 + k] for k in range(20)]  # never reached
    for c in caches:
        for s in seqs:
            c.insert(CacheKey(np.asarray(s, dtype=np.int32)), np.arange(len(s)))
    queries = [[1, 2, 5, 6], [1, 2, 3, 4], [1, 2, 3], [1, 2, 5, 6, 99], [1, 2], [9], [1, 2, 3]]
    queries += [[42], [1, 2, 7], [1, 2, 8, 8], [1, 2, 8], [9, 9], [9]]
    queries += [[20], [20, 21, 22], [20, 21]]  # inside one node, deepest first
    orders = []
    for c in caches:
        ends = [c.match_end(CacheKey(np.asarray(q, dtype=np.int32))) for q in queries]
        c.evict(1)  # the oldest leaf, [7]: query 8's node is detached
        assert ends[8].node.parent is None and ends[0].node.parent is not None
        orders.append(c.dfs_weight_order_at([(e.node, e.offset) for e in ends]))
    assert orders[0] == orders[1] == [1, 2, 6, 9, 10, 0, 3, 4, 11, 5, 12, 14, 15, 13, 7, 8]

"""The waiting queue's round in one native call (``_native/round.cpp``): lpm's kept order
advanced there while the list is in sync with it, the Python round everywhere else (decided per
round), each round's order the reference's; the refresh's native touches equal the Python
loop's."""

from __future__ import annotations

import operator
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest

from radixsched.cache import CacheKey, RadixCache
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.matching import NativeMatcher
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache
from radixsched.policies import POLICIES, Reads, Round
from radixsched.queue import WaitingQueue
from radixsched.request import Req

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


def _twins(page: int = 1, **cfg: Any) -> tuple[list[Any], WaitingQueue, NativeWaitingQueue]:
    caches = [RadixCache(None, page_size=page), NativeRadixCache(None, page_size=page)]
    config = SchedulerConfig(schedule_policy=cfg.pop("policy", "lpm"), page_size=page, **cfg)
    return caches, WaitingQueue(config, caches[0]), NativeWaitingQueue(config, caches[1])


class _Rounds:
    """Records each native round's ``done`` (whether it advanced lpm's order)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.done: list[bool] = []
        orig = NativeMatcher.round

        def recording(m: NativeMatcher, *a: Any, **kw: Any) -> Any:
            out = orig(m, *a, **kw)
            self.done.append(out[2])
            return out

        monkeypatch.setattr(NativeMatcher, "round", recording)


def _add(queues: tuple[WaitingQueue, ...], rid: str, tokens: list[int], t: float) -> None:
    for q in queues:
        q.add(Req(rid, np.asarray(tokens, dtype=np.int32), arrival_time=t))


def _heads(queues: tuple[WaitingQueue, ...], rnd: int, take: bool = False) -> list[list[str]]:
    """Each queue's whole order this round (``take``: then its head is admitted)."""
    orders = [q.begin_round([], 10 * rnd, float(rnd)) for q in queues]
    heads = [[r.rid for r in o.head(len(q) + 1)] for q, o in zip(queues, orders, strict=True)]
    for q, o in zip(queues, orders, strict=True):
        if take:
            q.take([o.position(0) or 0])
    return heads


def test_lpm_round_advances_natively_in_sync_and_falls_back_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds = _Rounds(monkeypatch)
    caches, ref, fast = _twins()
    assert fast.kept_order is not None
    qs = (ref, fast)
    shared = [1, 2, 3, 4, 5, 6]
    for c in caches:
        c.insert(CacheKey(np.asarray(shared, dtype=np.int32)), np.arange(6))
    for i in range(6):  # the first round: no kept order yet, the Python round builds it
        _add(qs, f"a{i}", (shared[: i + 1] if i % 2 else [9, i]) + [7, 8], float(i))
    heads = _heads(qs, 0)
    assert heads[0] == heads[1]
    _add(qs, "b0", [*shared, 9, 9], 10.0)  # one arrival, tied with a5 (older: first)
    heads = _heads(qs, 1)
    assert heads[0] == heads[1] and heads[1][:2] == ["a5", "b0"]
    assert rounds.done[-1] is True  # in sync, few moving: advanced natively
    for c in caches:  # the cache grows under a waiting request: it moves up
        c.insert(CacheKey(np.asarray([9, 3, 7, 8], dtype=np.int32)), np.arange(4))
    heads = _heads(qs, 2)
    assert heads[0] == heads[1] and rounds.done[-1] is True
    for q in qs:  # the list edited behind the order's back: out of sync, rebuilt in Python
        q.reqs.reverse()
    heads = _heads(qs, 3)
    assert heads[0] == heads[1] and rounds.done[-1] is False
    heads = _heads(qs, 4)
    assert heads[0] == heads[1] and rounds.done[-1] is True  # in sync again
    for i in range(40):  # more than 32 and a quarter of the list arrive: a rebuild
        _add(qs, f"c{i}", [5, i, i], 20.0 + i)
    heads = _heads(qs, 5)
    assert heads[0] == heads[1] and rounds.done[-1] is False


@pytest.mark.parametrize(
    ("cfg", "native_order"),
    [
        ({}, True),
        ({"in_batch_prefix_check_threshold": -1}, True),  # no dedup: nothing deferred
        ({"lpm_max_wait_s": 5.0}, False),  # the starvation bound reads the clock
        ({"enable_priority_scheduling": True, "policy": "fcfs"}, False),  # lpm refuses them
        ({"policy": "shortest-prefill-first"}, True),  # its key built there too (spf_key)
        ({"policy": "hrrn"}, False),
        ({"policy": "dfs-weight"}, True),  # its tree order, advanced (or rebuilt) there too
    ],
)
def test_only_lpms_and_dfs_weights_kept_orders_are_advanced_natively(
    cfg: dict[str, Any], native_order: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = _Rounds(monkeypatch)
    caches, ref, fast = _twins(**{"in_batch_prefix_deprioritize_threshold": 2, **cfg})
    assert (fast.kept_order is not None) is native_order
    qs = (ref, fast)
    for c in caches:
        c.insert(CacheKey(np.asarray([1, 2, 3, 4], dtype=np.int32)), np.arange(4))
    rng = np.random.default_rng(3)
    deferred = 0
    for rnd in range(30):
        for _ in range(int(rng.integers(0, 3))):
            n = int(rng.integers(2, 9))
            _add(qs, f"r{rnd}.{_}", list(rng.integers(1, 5, n)), float(rnd))
        heads = _heads(qs, rnd, take=len(ref) > 3 and rng.random() < 0.5)
        assert heads[0] == heads[1], rnd
        assert ref.deferred == fast.deferred, rnd
        deferred += len(ref.deferred)
    assert any(rounds.done) is native_order
    dedups = Reads.DEDUP in fast.reads and cfg.get("in_batch_prefix_check_threshold", 0) >= 0
    assert (deferred > 0) is dedups


def test_native_touches_equal_the_python_loops() -> None:
    """touch_memos: each request's memo read just before its touch, last to first (a touch's
    split re-points the memos ending in the split node): the same clock, access times and
    splits as touching each memo from Python."""
    rng = np.random.default_rng(13)
    caches = [NativeRadixCache(None, page_size=1) for _ in range(2)]
    matchers = [NativeMatcher(c) for c in caches]
    for i in range(30):
        seq = rng.integers(0, 3, int(rng.integers(1, 20))).astype(np.int32)
        for c in caches:
            c.insert(CacheKey(seq), np.arange(100 * i, 100 * i + len(seq)))
    reqs: list[list[Req]] = [[], []]
    for i in range(25):
        t = rng.integers(0, 3, int(rng.integers(1, 25))).astype(np.int32)
        for m, rs in zip(matchers, reqs, strict=True):
            r = Req(f"r{i}", t.copy())
            m.track(r)
            rs.append(r)
    for r in reversed(reqs[0]):
        memo = matchers[0].memo[id(r)]
        caches[0].touch_at(memo.node, len(memo.node) if memo.full else memo.offset)
    matchers[1].touch_ends(reqs[1])

    def state(c: Any) -> list[tuple[int, int, int]]:
        return [(n.id, n.last_access_time, len(n.key)) for n in c._iter_nodes()]

    assert state(caches[0]) == state(caches[1])
    stranger = Req("x", np.asarray([1], dtype=np.int32))
    with pytest.raises(KeyError):
        matchers[1].touch_ends([stranger])


def test_in_sync_compares_identities_members_then_arrivals() -> None:
    """The queue's sync check: the list is the members, then the arrivals, object for object."""
    mod = core()
    a, b, c = (Req(f"r{i}", np.asarray([1], dtype=np.int32)) for i in range(3))
    twin = Req("r0", np.asarray([1], dtype=np.int32))  # the same fields, another request
    assert mod.in_sync([a, b, c], [a, b], [c])
    assert mod.in_sync([], [], [])
    assert not mod.in_sync([a, b, c], [a, b], [])  # a request neither member nor arrival
    assert not mod.in_sync([a, c, b], [a, b], [c])
    assert not mod.in_sync([twin, b, c], [a, b], [c])
    assert not mod.in_sync([a, b], [a, b], [c])
    assert not mod.in_sync([a, b, a], [a, b], [c])  # the members in place, another arrival


def test_lpm_round_advances_natively_past_a_few_arrivals(monkeypatch: pytest.MonkeyPatch) -> None:
    """More than a few arrivals (their membership test a hash set's, not a scan) on a long list
    in sync: advanced natively, the order the reference's."""
    rounds = _Rounds(monkeypatch)
    caches, ref, fast = _twins()
    qs = (ref, fast)
    for c in caches:
        c.insert(CacheKey(np.asarray([1, 2, 3, 4, 5, 6], dtype=np.int32)), np.arange(6))
    shared = [1, 2, 3, 4, 5, 6]
    for i in range(90):
        _add(qs, f"a{i}", [*shared[: i % 7], 8, i % 5], float(i % 13))
    heads = _heads(qs, 0)
    assert heads[0] == heads[1]
    for i in range(20):  # 20 arrivals: under the rebuild's bound, past the scan's
        _add(qs, f"b{i}", [*shared[: i % 5], 9, i], 50.0 - i)
    heads = _heads(qs, 2)
    assert heads[0] == heads[1] and rounds.done[-1] is True


class _T:
    """A request's tenant (all ``add_tenants`` reads)."""

    def __init__(self, tenant: Any) -> None:
        self.tenant_key = tenant


def test_add_tenants_is_set_update_from_an_index_on() -> None:
    """fair's observation (``add_tenants``): the same set, built in the same order (so it
    iterates alike), as ``set.update`` of the tenants of ``seq[start:]``."""
    add = core().add_tenants  # type: ignore[union-attr]
    keys = ["a", "a", "b", "a", "", "c", "b"] + [f"t{i}" for i in range(12)]
    seq = [_T(k) for k in keys]
    for start in (0, 1, 5, len(seq), len(seq) + 3):
        got, want = {"z", "b"}, {"z", "b"}
        add(got, seq, start)
        want.update(k for k in keys[start:])
        assert got == want and list(got) == list(want)
    with pytest.raises(ValueError):
        add(set(), seq, -1)
    with pytest.raises(TypeError):
        add(frozenset(), seq, 0)
    with pytest.raises(TypeError):  # an unhashable tenant, as set.update raises
        add(set(), [_T([1])], 0)
    with pytest.raises(AttributeError):
        add(set(), [object()], 0)


def test_tenant_counts_is_a_counter_of_tenants() -> None:
    """The decode charge's tenants (``tenant_counts``): the counts ``Counter`` gives, in the
    order it gives them; equal tenants that are other objects counted together, runs of one
    object and tenants that come back included."""
    count = core().tenant_counts  # type: ignore[union-attr]
    keys = ["a", "a", "b", "a", "", "c", "b", "".join(["c"])] + [f"t{i % 5}" for i in range(12)]
    for seq in (keys, [], ["x"], keys[::-1], keys[3:]):
        got, want = count([_T(k) for k in seq]), Counter(seq)
        assert got == want and list(got) == list(want) and type(got) is dict
    with pytest.raises(TypeError):  # an unhashable tenant, as Counter raises
        count([_T("a"), _T([1])])
    with pytest.raises(AttributeError):
        count([object()])


class _S:
    """A request's sampling parameters as ``sort_lof`` reads them (an exact class)."""

    def __init__(self, max_new: Any) -> None:
        self.max_new_tokens = max_new


class _N:
    """A request (all ``sort_lof`` reads: its ``sampling``, in a plain member)."""

    __slots__ = ("i", "sampling")

    def __init__(self, max_new: Any, i: int, params: type = _S) -> None:
        self.sampling, self.i = params(max_new), i


class _Prop(_S):
    """Parameters whose budget is a property: a read could run code, so Python sorts."""

    @property  # type: ignore[override]
    def max_new_tokens(self) -> int:
        return 1

    @max_new_tokens.setter
    def max_new_tokens(self, v: int) -> None:
        pass


def test_sort_lof_is_the_stable_descending_sort() -> None:
    """SGLang compat's lof round (``sort_lof``): ``list.sort(key=sampling.max_new_tokens,
    reverse=True)``'s order (equal keys keep theirs) for sorted heads with arrivals behind
    them, whole shuffles and lists sorted already; False, the list untouched, where a key is
    not an int within int64 read from parameters of exactly the class given, or the queue is
    not a list."""
    sort = core().sort_lof  # type: ignore[union-attr]
    rng = random.Random(7)
    key = operator.attrgetter("sampling.max_new_tokens")
    for trial in range(300):
        n = rng.randrange(0, 60)
        keys = [rng.randrange(-3, 6) * (2**60 if trial % 7 == 0 else 1) for _ in range(n)]
        if trial % 3 == 0:  # a sorted head, arrivals behind it
            head = rng.randrange(0, n + 1)
            keys[:head] = sorted(keys[:head], reverse=True)
        got = [_N(k, i) for i, k in enumerate(keys)]
        want = list(got)
        want.sort(key=key, reverse=True)
        assert sort(got, _S) is True and got == want
    for odd in (1.5, True, 2**63, None):
        reqs = [_N(3, 0), _N(odd, 1), _N(5, 2)]
        before = list(reqs)
        assert sort(reqs, _S) is False and reqs == before
    assert sort([_N(1, 0), _N(2, 1, _Prop)], _S) is False
    assert sort([_N(1, 0), _N(2, 1)], _Prop) is False
    assert sort((_N(1, 0), _N(2, 1)), _S) is False


class _Long(Req):
    """A request type whose ``fill_len`` is its own (spf's native key must ask it)."""

    @property
    def fill_len(self) -> int:
        return 1000 + len(self.prompt_ids)


def test_spf_round_reads_a_subclass_fill_len(monkeypatch: pytest.MonkeyPatch) -> None:
    """spf's kept order advanced natively keys a ``Req`` by its prompt and outputs, and a
    request of another type by its own ``fill_len``: the reference's order either way."""
    rounds = _Rounds(monkeypatch)
    caches, ref, fast = _twins(policy="shortest-prefill-first")
    qs = (ref, fast)
    for c in caches:
        c.insert(CacheKey(np.asarray([1, 2, 3], dtype=np.int32)), np.arange(3))
    for i in range(8):
        _add(qs, f"a{i}", [1, 2, 3, 9, i][: 2 + i % 4] + [7] * (i % 3), float(i))
    heads = _heads(qs, 0)
    assert heads[0] == heads[1]
    for i in range(3):  # each arrival: the shortest work if read from its tokens
        for q in qs:
            q.add(_Long(f"l{i}", np.asarray([1, 2, 3, 8], dtype=np.int32), arrival_time=9.0))
        _add(qs, f"b{i}", [1, 2, 3, 5, 6, i], 10.0 + i)
        heads = _heads(qs, 2 + i)
        assert heads[0] == heads[1] and rounds.done[-1] is True
        assert heads[1][-1].startswith("l")


def test_fair_round_advances_one_tenants_order_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """fair with one tenant waiting, arrivals of that tenant only: its order advanced in the
    native round (the observation made after it); another tenant's arrival: the Python round
    (the merge). Each round's order and the counters' state the reference's."""
    rounds = _Rounds(monkeypatch)
    caches, ref, fast = _twins(policy="fair")
    qs = (ref, fast)
    for c in caches:
        c.insert(CacheKey(np.asarray([1, 2, 3, 4], dtype=np.int32)), np.arange(4))

    def add(rid: str, tokens: list[int], t: float, tenant: str | None = None) -> None:
        for q in qs:
            q.add(Req(rid, np.asarray(tokens, dtype=np.int32), arrival_time=t, tenant=tenant))

    def round_(rnd: int, running: list[Req]) -> bool:
        orders = [q.begin_round(running, 10 * rnd, float(rnd)) for q in qs]
        heads = [[r.rid for r in o.head(len(q) + 1)] for q, o in zip(qs, orders, strict=True)]
        assert heads[0] == heads[1], rnd
        states = [(q.fair.counters, q.fair._active, q.fair._floor) for q in qs]
        assert states[0] == states[1], rnd
        return rounds.done[-1]

    for i in range(5):
        add(f"a{i}", [*[1, 2, 3, 4][: 1 + i % 4], 9, i], float(i))
    round_(0, [])  # the first round: built in Python
    busy = Req("run", np.asarray([5], dtype=np.int32), tenant="u")
    for q in qs:
        q.fair.charge("u", 7, 0)
    add("a5", [1, 2, 3, 9], 5.0)
    assert round_(1, [busy]) is True  # one tenant, its arrival: native
    assert round_(2, []) is True  # the running tenant went idle
    add("b0", [1, 2, 9], 6.0, tenant="t")  # a second tenant: merged in Python
    assert round_(3, [busy]) is False
    assert round_(4, []) is False


def test_fair_advance_breaks_counter_ties_by_the_tenants_first_members() -> None:
    """Two tenants with tied counters and heads: the merge's tie goes to the tenant whose
    first member comes first in the list as it stands (here b's: a was ahead on service when
    the list was built), not to the tenant the engine met first."""
    from radixsched.native.orders import FairEngine
    from radixsched.policies import VirtualTokenCounter

    def req(rid: str, tenant: str) -> Req:
        r = Req(rid, np.arange(10, dtype=np.int32), arrival_time=0.0, tenant=tenant)
        r.queue_entry_time = 0.0
        return r

    queue = [req("a1", "a"), req("a2", "a"), req("b1", "b"), req("b2", "b")]
    fair = VirtualTokenCounter(prefill_weight=1.0, decode_weight=1.0, counters={"a": 10.0})
    rnd = Round(SchedulerConfig(schedule_policy="fair"), fair=fair)
    engine = FairEngine(POLICIES["fair"])
    list(engine.rebuild(queue, rnd))  # met a first; b behind on service heads the list
    assert [r.rid for r in queue] == ["b1", "a1", "b2", "a2"]
    fair.counters["b"] = 10.0  # b charged (say, its running requests' decode): a tie
    list(engine.advance([], [], rnd, queue))
    assert [r.rid for r in queue] == ["b1", "a1", "b2", "a2"]

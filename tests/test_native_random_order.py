"""The plain random policy's order natively (``_native/lazy_shuffle.cpp``): the reference
generator's (``policies.random_order``) lazy front-to-back Fisher-Yates, its positions, its
swaps and its draws made on the ``random.Random`` object's own state, only for the positions
read. The same list, positions and generator state as the reference after any number of
reads, whatever the seed, the draws before and between them and the list's length; any other
generator takes the reference path."""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache
from radixsched.policies import Round, random_order
from radixsched.queue import REFRESH_SPAN, RoundOrder
from radixsched.request import Req, SamplingParams
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")


def _reference(queue: list[Any], rng: random.Random) -> Iterator[int]:
    rnd = Round(SchedulerConfig(schedule_policy="random"))
    rnd.rng = rng
    assert random_order.order is not None
    return random_order.order(queue, rnd)


def _native(queue: list[Any], rng: random.Random) -> Iterator[int]:
    mod = core()
    assert mod is not None
    it: Iterator[int] = mod.LazyShuffle(queue, rng)
    return it


def _pair(seed: int, draws: int) -> tuple[random.Random, random.Random]:
    ours, theirs = random.Random(seed), random.Random(seed)
    for _ in range(draws):
        ours.getrandbits(32)
        theirs.getrandbits(32)
    return ours, theirs


def test_the_layout_is_checked_and_cpythons() -> None:
    mod = core()
    assert mod is not None
    assert mod.random_layout_ok() is True


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**64),
    draws=st.integers(0, 700),
    n=st.integers(0, 1500),
    read=st.integers(0, 1600),
)
def test_the_positions_read_are_the_references(seed: int, draws: int, n: int, read: int) -> None:
    """``draws`` earlier draws put the state's index anywhere in its block (a read may
    regenerate it part-way); ``read`` positions read, past the end included."""
    ours, theirs = _pair(seed, draws)
    a, b = list(range(n)), list(range(n))
    want = list(itertools.islice(_reference(a, theirs), read))
    got = list(itertools.islice(_native(b, ours), read))
    assert got == want == list(range(min(n, read)))
    assert b == a
    assert ours.getstate() == theirs.getstate()
    assert ours.random() == theirs.random()


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(2, 700), between=st.integers(1, 3))
def test_draws_between_reads_are_seen(seed: int, n: int, between: int) -> None:
    """Anything may draw from the generator between two reads: the next read draws after it."""
    ours, theirs = _pair(seed, 0)
    a, b = list(range(n)), list(range(n))
    ref, nat = _reference(a, theirs), _native(b, ours)
    for want in ref:
        assert next(nat) == want
        assert [ours.random() for _ in range(between)] == [theirs.random() for _ in range(between)]
    with pytest.raises(StopIteration):
        next(nat)
    assert (b, ours.getstate()) == (a, theirs.getstate())


@pytest.mark.parametrize("n", [0, 1])
def test_a_list_too_short_to_shuffle_draws_nothing(n: int) -> None:
    rng = random.Random(3)
    before = rng.getstate()
    items = list(range(n))
    assert list(_native(items, rng)) == list(range(n))
    assert items == list(range(n)) and rng.getstate() == before


def test_powers_of_two_bounds_draw_their_bits_exactly() -> None:
    """A bound of 2**k draws k bits, never rejected; 2**k + 1 draws k + 1 bits."""
    for n in (2, 3, 4, 5, 8, 9, 16, 17, 1024, 1025):
        rng, ref = random.Random(n), random.Random(n)
        a, b = list(range(n)), list(range(n))
        assert list(_native(b, rng)) == list(_reference(a, ref))
        assert (b, rng.getstate()) == (a, ref.getstate())


def test_the_length_is_read_at_the_first_read() -> None:
    """As the generator's body starts at its first resume: an arrival before it is in."""
    ours, theirs = _pair(9, 0)
    a, b = list(range(10)), list(range(10))
    ref, nat = _reference(a, theirs), _native(b, ours)
    a.append(10)
    b.append(10)
    assert list(nat) == list(ref) == list(range(11))
    assert (b, ours.getstate()) == (a, theirs.getstate())


def test_a_list_that_shrank_raises_as_the_reference_then_stops() -> None:
    """A pick past the list's end: IndexError after the draw, and the order is over."""
    ours, theirs = _pair(1, 0)
    a, b = list(range(50)), list(range(50))
    ref, nat = _reference(a, theirs), _native(b, ours)
    assert next(nat) == next(ref) == 0
    del a[1:], b[1:]
    with pytest.raises(IndexError):
        next(ref)
    with pytest.raises(IndexError):
        next(nat)
    assert (b, ours.getstate()) == (a, theirs.getstate())
    assert list(nat) == list(ref) == []


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    n=st.integers(0, 300),
    reads=st.lists(st.tuples(st.booleans(), st.integers(-1, 320)), max_size=6),
)
def test_head_reads_as_the_round_orders_head(
    seed: int, n: int, reads: list[tuple[bool, int]]
) -> None:
    """``LazyShuffle.head(seen, k)`` (the refresh's head, read natively) is ``RoundOrder.head``
    on the order it reads for, whatever was read before it (``position``, ``head``)."""
    ours, theirs = _pair(seed, 0)
    a, b = [f"r{i}" for i in range(n)], [f"r{i}" for i in range(n)]
    ref, nat = RoundOrder(a, _reference(a, theirs)), RoundOrder(b, _native(b, ours))
    for is_head, k in reads:
        if is_head:
            assert nat._positions.head(b, nat._seen, k) == ref.head(k)  # type: ignore[attr-defined]
        else:
            assert nat.position(max(k, 0)) == ref.position(max(k, 0))
        assert (b, nat._seen, ours.getstate()) == (a, ref._seen, theirs.getstate())


@pytest.mark.parametrize("read", [1, 5])
def test_head_of_a_shrunk_list_raises_as_the_reference(read: int) -> None:
    """Step for step: a remembered position past the list's end, or a pick past it, raises
    IndexError after the same draws as the reference's head."""
    ours, theirs = _pair(2, 0)
    a, b = list(range(50)), list(range(50))
    ref, nat = RoundOrder(a, _reference(a, theirs)), RoundOrder(b, _native(b, ours))
    assert nat.position(read) == ref.position(read)
    del a[3:], b[3:]
    with pytest.raises(IndexError):
        ref.head(10)
    with pytest.raises(IndexError):
        nat._positions.head(b, nat._seen, 10)  # type: ignore[attr-defined]
    assert (b, nat._seen, ours.getstate()) == (a, ref._seen, theirs.getstate())


class _Counted(random.Random):
    """A generator of its own: its draws are Python's, counted."""

    calls = 0

    def randrange(self, *args: Any, **kwargs: Any) -> int:
        type(self).calls += 1
        return super().randrange(*args, **kwargs)


def test_only_an_exact_random_is_taken() -> None:
    mod = core()
    assert mod is not None
    for rng in (_Counted(1), random.SystemRandom(), object()):
        with pytest.raises(TypeError, match="exactly"):
            mod.LazyShuffle([1, 2, 3], rng)


def _queue(rng: random.Random | None = None) -> NativeWaitingQueue:
    cfg = SchedulerConfig(schedule_policy="random", seed=5)
    q = NativeWaitingQueue(cfg, NativeRadixCache(None))
    if rng is not None:
        q.rng = rng
    for i in range(40):
        q.add(Req(f"r{i}", [i, i + 1], SamplingParams(max_new_tokens=i + 1)))
    return q


def _round(q: NativeWaitingQueue, read: int) -> tuple[str, list[int], list[str]]:
    rnd = Round(q.config)
    positions = q._order(q.policy, q.reads, rnd, [])
    head = list(itertools.islice(positions, read))
    return type(positions).__name__, head, [r.rid for r in q.reqs]


def test_the_queue_takes_the_native_order_for_its_own_generator_only() -> None:
    """Python's own generator: LazyShuffle (the same positions, list and state as the
    reference); a subclass's: the reference generator, its randrange called."""
    native, own = _queue(), _queue(_Counted(5))
    _Counted.calls = 0
    for read in (3, 0, 40, 7):
        kind, *got = _round(native, read)
        own_kind, *want = _round(own, read)
        assert (kind, own_kind) == ("LazyShuffle", "generator")
        assert got == want
        assert native.rng.getstate() == own.rng.getstate()
    assert _Counted.calls == 3 + 0 + 39 + 7


def test_the_refresh_reads_the_head_natively_for_a_native_order_only() -> None:
    """The refresh's head (``_head``): natively for a ``LazyShuffle`` (the same requests and
    draws as the reference's head), ``RoundOrder.head`` for any other order."""
    native, own = _queue(), _queue(_Counted(5))
    ours, theirs = (
        RoundOrder(q.reqs, q._order(q.policy, q.reads, Round(q.config), [])) for q in (native, own)
    )
    _Counted.calls = 0
    got = [r.rid for r in native._head(ours)]
    assert got == [r.rid for r in own._head(theirs)]
    assert len(got) == 40 and _Counted.calls == 39
    assert native.rng.getstate() == own.rng.getstate()
    plain = RoundOrder(native.reqs, iter(range(len(native.reqs))))
    assert native._head(plain) == native.reqs[:REFRESH_SPAN]


def test_random_rounds_equal_the_reference() -> None:
    """The accelerated plain random policy (the native order, read lazily by admission and the
    refresh) gives the reference's schedule, under memory pressure (admission stops early)."""
    w = load_workload(
        "shared-prefix:groups=4,prompts=12,system_len=200,question_len=20,output_len=24",
        request_rate=200.0,
    )
    sched = SchedulerConfig(schedule_policy="random", seed=11)
    for tokens in (1500, 3000):
        sim = SimConfig(max_total_tokens=tokens)
        fast = simulate(copy.deepcopy(w), sched, sim, accelerate=True, check_integrity=True)
        ref = simulate(copy.deepcopy(w), sched, sim, accelerate=False)
        got = [(r.rid, r.times.first_scheduled, list(r.output_ids)) for r in fast.requests]
        want = [(r.rid, r.times.first_scheduled, list(r.output_ids)) for r in ref.requests]
        assert got == want

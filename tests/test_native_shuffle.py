"""SGLang compat's random round: ``random.Random.shuffle`` of the whole waiting list, run
natively (``_native/shuffle.cpp``) from and back to the generator's state. The same
permutation and the same state after it as Python's shuffle, whatever the seed, the draws
before it and the list's length; a state that is not MT19937's is refused."""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.radix import NativeRadixCache
from radixsched.policies import Round
from radixsched.request import Req, SamplingParams
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")


def _native_shuffle(rng: random.Random, items: list[Any]) -> None:
    mod = core()
    assert mod is not None
    version, state, gauss = rng.getstate()
    rng.setstate((version, mod.shuffle(items, state), gauss))


def _in_place_shuffle(rng: random.Random, items: list[Any]) -> None:
    mod = core()
    assert mod is not None
    mod.shuffle_in_place(items, rng)


@pytest.mark.parametrize("shuffle", [_native_shuffle, _in_place_shuffle])
@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**64), draws=st.integers(0, 700), n=st.integers(0, 3000))
def test_the_shuffle_is_pythons(shuffle: Any, seed: int, draws: int, n: int) -> None:
    """``draws`` earlier draws move the state's index anywhere in its block (624 words), so
    the shuffle also regenerates the block part-way. Both ways: from and back to the state
    ``getstate()`` gives, and on the generator's own state in place (``shuffle_in_place``, the
    queue's way where the generator's layout is CPython 3.11's)."""
    ours, theirs = random.Random(seed), random.Random(seed)
    for _ in range(draws):
        ours.getrandbits(32)
        theirs.getrandbits(32)
    a, b = list(range(n)), list(range(n))
    theirs.shuffle(a)
    shuffle(ours, b)
    assert b == a
    assert ours.getstate() == theirs.getstate()
    assert ours.random() == theirs.random()


def test_the_in_place_shuffle_takes_only_pythons_generator() -> None:
    class Own(random.Random):
        pass

    with pytest.raises(TypeError):
        _in_place_shuffle(Own(1), [1, 2, 3])


@pytest.mark.parametrize("n", [0, 1])
def test_a_list_too_short_to_shuffle_draws_nothing(n: int) -> None:
    rng = random.Random(3)
    before = rng.getstate()
    items = list(range(n))
    _native_shuffle(rng, items)
    assert items == list(range(n)) and rng.getstate() == before


def test_powers_of_two_bounds_draw_their_bits_exactly() -> None:
    """A bound of 2**k draws k bits, never rejected; 2**k + 1 draws k + 1 bits."""
    for n in (2, 3, 4, 5, 8, 9, 16, 17, 1024, 1025):
        rng, ref = random.Random(n), random.Random(n)
        a, b = list(range(n)), list(range(n))
        ref.shuffle(a)
        _native_shuffle(rng, b)
        assert (b, rng.getstate()) == (a, ref.getstate())


def test_a_state_that_is_not_mt19937s_is_refused() -> None:
    mod = core()
    assert mod is not None
    state = random.Random(1).getstate()[1]
    with pytest.raises(ValueError, match="getstate"):
        mod.shuffle([1, 2, 3], state[:-1])
    with pytest.raises(ValueError, match="index"):
        mod.shuffle([1, 2, 3], (*state[:-1], 625))


@pytest.mark.parametrize("policy", ["random", "lof", "fcfs"])
def test_compat_rounds_of_plain_policies_equal_the_reference(policy: str) -> None:
    """SGLang's random, lof and fcfs rounds on the accelerated queue (the native shuffle, the
    C-keyed stable sort, the list left standing) give the reference's schedule."""
    w = load_workload(
        "shared-prefix:groups=4,prompts=10,system_len=200,question_len=20,output_len=24",
        request_rate=200.0,
    )
    varied = [  # max_new_tokens in 13 values, ties among them (lof's sort keeps their order)
        dataclasses.replace(r, sampling=SamplingParams(max_new_tokens=8 + i * 5 % 13))
        for i, r in enumerate(w.requests)
    ]
    w = dataclasses.replace(w, requests=varied)
    sched = SchedulerConfig(schedule_policy=policy, compat="sglang", seed=11)
    sim = SimConfig(max_total_tokens=3000)
    fast = simulate(w, sched, sim, accelerate=True, check_integrity=True)
    ref = simulate(w, sched, sim, accelerate=False)
    assert [r.rid for r in fast.requests] == [r.rid for r in ref.requests]
    got = [(r.rid, r.times.first_scheduled, list(r.output_ids)) for r in fast.requests]
    want = [(r.rid, r.times.first_scheduled, list(r.output_ids)) for r in ref.requests]
    assert got == want


class _Counted(random.Random):
    """A generator of its own: its shuffle is Python's, counted."""

    calls = 0

    def shuffle(self, x: Any) -> None:
        type(self).calls += 1
        super().shuffle(x)


def _round(queue: NativeWaitingQueue) -> list[int]:
    pol = queue.policy.variant(queue.config)
    rnd = Round(queue.config)
    queue.order(pol, rnd)
    return [r.sampling.max_new_tokens for r in queue.reqs]


def test_the_native_shuffle_stands_aside_for_a_generator_of_its_own() -> None:
    """Python's own generator: the native shuffle (the same list and state as its shuffle);
    a subclass's: its own shuffle, called."""
    cfg = SchedulerConfig(schedule_policy="random", compat="sglang", seed=5)
    reqs = [Req(f"r{i}", [i, i + 1], SamplingParams(max_new_tokens=i + 1)) for i in range(40)]
    native = NativeWaitingQueue(cfg, NativeRadixCache(None))
    own = NativeWaitingQueue(cfg, NativeRadixCache(None))
    own.rng = _Counted(5)
    for q in (native, own):
        for r in reqs:
            q.add(copy.copy(r))
    assert _round(native) == _round(own)
    assert _Counted.calls == 1
    assert native.rng.getstate() == own.rng.getstate()
    assert _round(native) == _round(own)  # the state after the first round carried on
    assert _Counted.calls == 2

"""The native steps' stand-in tokens as Python ints (``_native/token_ints.hpp``): the values
the Python runner computes, each value below 2**20 one int object kept for the process and
shared by every list that holds it, larger values made anew."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.sim.cost.runner import _stand_ins
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.simulate import simulate
from radixsched.sim.workloads.load import load_workload

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")

_LIMIT = 1 << 20


@pytest.mark.parametrize("vocab", [7, 128_000, _LIMIT, _LIMIT + 5, 1 << 40])
def test_stand_ins_are_the_runners_tokens(vocab: int) -> None:
    c: Any = core()
    for h in (0, 1, 0xDEADBEEF, (1 << 64) - 1):
        got = c.stand_ins(h, 3, 64, vocab)
        assert got == _stand_ins(h, range(3, 67), vocab)
        assert all(type(t) is int for t in got)


def test_a_small_token_is_one_kept_int_and_a_large_one_is_made_anew() -> None:
    c: Any = core()
    a, b = c.stand_ins(11, 0, 200, 1000), c.stand_ins(12, 0, 200, 1000)
    common = set(a) & set(b)
    assert common  # 200 draws each from 1000 values
    for v in common:
        assert a[a.index(v)] is b[b.index(v)]  # the same object
    big = 1 << 40
    x, y = c.stand_ins(5, 0, 1, big), c.stand_ins(5, 0, 1, big)
    assert x == y and x[0] is not y[0]


def test_simulated_outputs_share_their_ints_and_match_the_reference() -> None:
    w = load_workload(
        "shared-prefix:groups=2,prompts=4,system_len=64,question_len=16,output_len=24"
    )
    sched, sim = SchedulerConfig(), SimConfig(max_total_tokens=6000)
    fast = simulate(copy.deepcopy(w), sched, sim, accelerate=True)
    ref = simulate(copy.deepcopy(w), sched, sim, accelerate=False)
    outs = [r.output_ids for r in fast.requests]
    assert outs == [r.output_ids for r in ref.requests]
    seen: dict[int, int] = {}
    for t in (t for o in outs for t in o):
        assert seen.setdefault(t, id(t)) == id(t)  # one object per value

"""The counting-slots mode of the native core (``_native/pool.hpp``, ``radix.hpp``): a simulator
run, whose runner reads no KV slot id, builds a pool that counts free pages and a tree whose
nodes hold no slots. Every simulate output must be what the slotted core (and the reference
core) gives, bit for bit: per-request tokens, times, hits, retractions and preemptions, and the
run's summary, over page sizes, chunked prefill, retraction and eviction in tight pools,
priority preemption, replicas, dp-attention lockstep, a host tier and disaggregation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import golden
from radixsched.cache.base import IntegrityError
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.native.scheduler import NativeScheduler
from radixsched.sim.cost.runner import CostModelRunner
from radixsched.sim.deploy.run import SimRun
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload
from simcases import SAMPLE, random_lengths

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built or is off")

AGENTIC = (
    "multi-turn:conversations=4,turns=8,first_len=1500,turn_len=200,output_len=64,think_time_s=0.05"
)
SHARED = "shared-prefix:groups=6,prompts=5,system_len=700,question_len=90,output_len=40"

# (workload, scheduler config, simulator config): the Mooncake sample's long prompts in a 60k
# pool evict and retract (and load back from a host tier); agents' deep prefixes split nodes.
SHAPES: dict[str, tuple[Callable[[], Workload], dict[str, Any], dict[str, Any]]] = {
    **{
        f"mooncake-p{p}{'-chunked' if chunk else ''}": (
            lambda: load_workload(f"mooncake:{SAMPLE}", num_requests=60),
            {"page_size": p, "chunked_prefill_size": chunk},
            {"max_total_tokens": 60_000},
        )
        for p in (1, 4, 16)
        for chunk in (None, 2048)
    },
    **{
        f"agentic-p{p}-chunked": (
            lambda: load_workload(AGENTIC, request_rate=40.0),
            {"page_size": p, "chunked_prefill_size": 256},
            {"max_total_tokens": 9000},
        )
        for p in (1, 16)
    },
    "host-tier-p4": (
        lambda: load_workload(f"mooncake:{SAMPLE}", num_requests=60),
        {"page_size": 4},
        {"max_total_tokens": 60_000, "enable_hierarchical_cache": True, "hicache_size": 0.05},
    ),
    "priority-preempt": (
        lambda: load_workload(f"jsonl:{golden._random_trace(48, 11, priorities=True)}"),
        {
            "enable_priority_scheduling": True,
            "priority_scheduling_preemption_threshold": 5,
            "chunked_prefill_size": 512,
        },
        {"max_total_tokens": 6000},
    ),
    "dp2-closed-loop": (
        lambda: random_lengths(2, 24),
        {"chunked_prefill_size": None},
        {"max_total_tokens": 1500, "dp": 2, "router": "cache-aware", "max_concurrency": 4},
    ),
    "lockstep": (
        lambda: load_workload(SHARED, request_rate=50.0),
        {"chunked_prefill_size": 512},
        {"max_total_tokens": 6000, "dp": 2, "enable_dp_attention": True},
    ),
    "disagg-1p2d-tight": (
        lambda: load_workload(SHARED, request_rate=200.0),
        {"chunked_prefill_size": 512, "page_size": 16},
        {
            "disaggregation": True,
            "prefill_instances": 1,
            "decode_instances": 2,
            "max_total_tokens": 6000,
            "decode_max_total_tokens": 3000,
        },
    ),
}
CASES = [
    (s, p) for s in sorted(SHAPES) for p in (("fcfs", "lof") if "prio" in s else ("lpm", "fcfs"))
]


def _observe(run: SimRun) -> dict[str, Any]:
    obs = golden.observe(run)
    obs["requests"] = sorted((golden.request_trace(r) for r in run.requests), key=lambda t: t[0])
    obs["extra"] = run.result.extra.get("disaggregation")
    return obs


def _run(
    shape: str, policy: str, *, accelerate: bool = True, check: bool = False
) -> tuple[dict[str, Any], list[bool]]:
    """The shape's run and the modes of the pools its schedulers built (True: counting)."""
    make, sched, sim = SHAPES[shape]
    modes: list[bool] = []
    pool_factory = NativeScheduler.pool_factory

    def spy(self: NativeScheduler, size: int, page: int) -> Any:
        pool = pool_factory(self, size, page)
        modes.append(bool(pool.counting))
        return pool

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NativeScheduler, "pool_factory", spy)
        run = simulate(
            make(),
            SchedulerConfig(**{"schedule_policy": policy, **sched}),
            SimConfig(**sim),
            accelerate=accelerate,
            check_integrity=check,
        )
    return _observe(run), modes


@pytest.mark.parametrize(("shape", "policy"), CASES)
def test_counting_mode_gives_the_slotted_and_reference_runs(shape: str, policy: str) -> None:
    counted, modes = _run(shape, policy, check=True)  # integrity checked after every step
    assert modes and all(modes), "a simulator run builds counting pools"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CostModelRunner, "reads_kv_slots", True)
        slotted, slot_modes = _run(shape, policy)
    assert slot_modes and not any(slot_modes)
    assert counted["requests"] == slotted["requests"], "per-request metrics differ"
    assert counted == slotted
    reference, _ = _run(shape, policy, accelerate=False)
    assert counted["requests"] == reference["requests"]
    assert golden.comparable(counted) == golden.comparable(reference)


def test_the_tight_runs_retract_and_load_from_the_host_tier() -> None:
    counted, _ = _run("mooncake-p16-chunked", "lpm")
    assert counted["replicas"][0]["retractions"] > 0
    counted, _ = _run("host-tier-p4", "lpm")
    assert counted["replicas"][0]["host_hit_rate"] > 0


# ---- the counting pool and tree through their Python faces ----------------------------------


def _ops(seed: int, page: int) -> Iterator[tuple[str, int]]:
    rng = np.random.default_rng(seed)
    ops = ["alloc", "free", "recycle", "reserve", "claim"]
    for _ in range(400):
        yield str(rng.choice(ops)), int(rng.integers(0, 6)) * page


@pytest.mark.parametrize("page", [1, 4, 16])
def test_counting_pool_counts_as_the_slotted_pool(page: int) -> None:
    native = core()
    slotted, counting = native.Pool(400, page), native.Pool(400, page, counting=True)
    assert counting.counting and not slotted.counting
    held: list[np.ndarray] = []
    for op, n in _ops(page, page):
        if op == "alloc":
            got = slotted.alloc(n)
            assert (got is None) == (counting.alloc(n) is None)
            if got is not None:
                held.append(got)
        elif op == "free" and held:
            slots = held.pop(n % len(held))
            slotted.free(slots)
            counting.free(slots)
        elif op == "recycle" and held:  # free a held array, then allocate n
            slots = held.pop(n % len(held))
            got = slotted.recycle(slots, n)
            assert (got is None) == (counting.recycle(slots, n) is None)
            if got is not None:
                held.append(got)
        elif op == "reserve":
            assert slotted.reserve(n) == counting.reserve(n)
        elif op == "claim" and n <= slotted.reserved_size():
            held.append(slotted.claim(n))
            assert len(counting.claim(n)) == n
        assert slotted.available_size() == counting.available_size()
        assert slotted.reserved_size() == counting.reserved_size()
    counting.check_integrity(request_slots=held)
    with pytest.raises(IntegrityError, match="conservation"):
        counting.check_integrity(request_slots=[*held, np.zeros(page, np.int64)])


def test_counting_pool_keeps_the_checks_a_count_can_make() -> None:
    pool = core().Pool(64, 4, counting=True)
    slots = pool.alloc(8)
    with pytest.raises(ValueError, match="whole number of pages"):
        pool.free(slots[:3])
    pool.free(slots)
    with pytest.raises(ValueError, match="1 page\\(s\\) freed with 0 allocated"):
        pool.free(slots[:4])  # a double free, seen only as more than is allocated
    with pytest.raises(ValueError, match="names no slots"):
        pool.free_slots()
    assert pool.available_size() == 64


def test_a_counting_tree_holds_no_slots_and_evicts_the_same() -> None:
    native = core()
    trees = []
    for counting in (False, True):
        pool = native.Pool(4096, 4, counting=counting)
        tree = native.Tree(4, "lru", 2, False, False, counting)
        rng = np.random.default_rng(0)
        for i in range(30):
            toks = np.concatenate([np.full(8 * (i % 3), 5), rng.integers(0, 4, 64)]).astype(
                np.int32
            )
            n = len(toks) - len(toks) % 4
            row = pool.alloc(n)
            node = tree.checkpoint(pool, toks[:n], 0, 0, row, 0, n, 0, 0, None)
            tree.dec_lock_ref(node)
        freed = [tree.evict_free(pool, 37) for _ in range(5)]
        tree.check_integrity()
        trees.append((tree, pool, freed))
    (slotted, sp, sf), (counting, cp, cf) = trees
    assert counting.counting and all(len(n.value) == 0 for n in counting.nodes())
    assert sf == cf and sp.available_size() == cp.available_size()
    assert [bytes(n.key) for n in slotted.nodes()] == [bytes(n.key) for n in counting.nodes()]
    assert len(counting.all_values()) == len(slotted.all_values())
    with pytest.raises(ValueError, match="a counting tree with a slotted pool"):
        counting.evict_free(sp, 4)

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.cluster.pagehash import page_hashes
from radixsched.cluster.routers import (
    DEFAULT_ROUTER,
    ROUTERS,
    CacheAwareRouter,
    ConsistentHashRouter,
    LeastLoadRouter,
    RandomRouter,
    ReplicaLoad,
    RoundRobinRouter,
    create_router,
    default_router_name,
)
from radixsched.request import Req


def req(tokens: list[int] | np.ndarray, rid: str = "r", **kw: object) -> Req:
    return Req(rid, np.asarray(tokens, dtype=np.int32), **kw)  # type: ignore[arg-type]


def loads(*values: int, ids: list[int] | None = None) -> list[ReplicaLoad]:
    ids = ids if ids is not None else list(range(len(values)))
    return [ReplicaLoad(i, v, 0, 0, 0, 0.0) for i, v in zip(ids, values, strict=True)]


def test_load_is_uncached_prefill_plus_decode() -> None:
    assert ReplicaLoad(0, 100, 23, 2, 3, 0.5).load == 123


def test_registry_and_factory() -> None:
    assert set(ROUTERS) == {"round-robin", "random", "least-load", "consistent-hash", "cache-aware"}
    assert DEFAULT_ROUTER == "cache-aware"
    assert default_router_name(2) == "cache-aware"
    assert default_router_name(1) == "round-robin"
    assert isinstance(create_router("cache-aware", page_size=4), CacheAwareRouter)
    with pytest.raises(ValueError, match="unknown router"):
        create_router("nope")


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_empty_replicas_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="no replicas"):
        create_router(name).route(req([1, 2]), [], 0.0)


def test_round_robin_cycles_over_ids() -> None:
    r = RoundRobinRouter()
    reps = loads(0, 0, 0, ids=[5, 7, 9])
    assert [r.route(req([1]), reps, 0.0) for _ in range(5)] == [5, 7, 9, 5, 7]


def test_random_is_seeded() -> None:
    reps = loads(0, 0, 0, 0)

    def draw(seed: int) -> list[int]:
        r = RandomRouter(seed=seed)
        return [r.route(req([1]), reps, 0.0) for _ in range(50)]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)
    assert set(draw(3)) == {0, 1, 2, 3}


def test_least_load_ties_to_lowest_id() -> None:
    r = LeastLoadRouter()
    assert r.route(req([1]), loads(30, 10, 10), 0.0) == 1
    reps = [ReplicaLoad(0, 5, 10, 0, 0, 0.0), ReplicaLoad(1, 20, 0, 0, 0, 0.0)]
    assert r.route(req([1]), reps, 0.0) == 0  # 15 < 20: decode tokens count too


# ---- consistent hash ---------------------------------------------------------------------


def test_consistent_hash_routing_key_and_prefix_fallback() -> None:
    r = ConsistentHashRouter()
    reps = loads(0, 0, 0, 0)
    a = r.route(req([1, 2, 3], routing_key="tenant-a"), reps, 0.0)
    # Same key, different prompt: same replica; load is ignored.
    assert r.route(req([9, 9], routing_key="tenant-a"), loads(0, 10**9, 0, 0), 0.0) == a
    # No key: the first 256 tokens decide.
    head = list(range(256))
    b = r.route(req([*head, 1, 2]), reps, 0.0)
    assert r.route(req([*head, 7, 7, 7]), reps, 0.0) == b
    # Stable across instances (no per-process hash seeds).
    assert ConsistentHashRouter().route(req([*head, 5]), reps, 0.0) == b


def test_consistent_hash_adding_a_replica_moves_about_one_in_n() -> None:
    r = ConsistentHashRouter()
    keys = [req([1], routing_key=f"user-{i}") for i in range(4000)]
    before = [r.route(k, loads(0, 0, 0, 0), 0.0) for k in keys]
    after = [r.route(k, loads(0, 0, 0, 0, 0), 0.0) for k in keys]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    # Every moved key lands on the new replica; about 1/5 of them move.
    assert all(a == 4 for _, a in moved)
    assert 0.12 < len(moved) / len(keys) < 0.28
    # And the spread over 5 replicas is reasonably even with 160 virtual nodes.
    counts = np.bincount(after, minlength=5) / len(keys)
    assert counts.min() > 0.12 and counts.max() < 0.28


# ---- cache-aware ---------------------------------------------------------------------------


def test_page_hashes_chain_and_namespace() -> None:
    a = page_hashes(np.arange(10, dtype=np.int32), 4)
    b = page_hashes(np.array([0, 1, 2, 3, 9, 9, 9, 9], dtype=np.int32), 4)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    assert page_hashes(np.arange(10, dtype=np.int32), 4, ("x", None))[0] != a[0]
    # Chained: page 1 with different page 0 differs even with the same content.
    c = page_hashes(np.array([7, 7, 7, 7, 4, 5, 6, 7], dtype=np.int32), 4)
    assert c[1] != a[1]


def test_cache_aware_prefers_longest_match() -> None:
    r = CacheAwareRouter(page_size=4, cache_threshold=0.5)
    sys_a, sys_b = list(range(100, 116)), list(range(200, 216))
    reps = loads(0, 0, 0)
    # Cold: no match -> least loaded (ties to the lowest id), then recorded there.
    assert r.route(req([*sys_a, 1, 2, 3, 4]), reps, 0.0) == 0
    assert r.route(req([*sys_b, 1]), loads(5, 0, 0), 0.0) == 1
    assert r.match_len(req([*sys_a, 9]), 0) == 16
    assert r.record_size(0) == 20
    # Affinity beats a small load difference.
    assert r.route(req([*sys_a, 5, 6, 7, 8]), loads(100, 0, 0), 0.0) == 0
    assert r.route(req([*sys_b, 5, 6]), loads(0, 100, 0), 0.0) == 1


def test_cache_aware_below_threshold_goes_least_loaded() -> None:
    r = CacheAwareRouter(page_size=4, cache_threshold=0.5)
    shared = list(range(8))
    r.route(req(shared), loads(0, 0), 0.0)  # recorded on 0
    long_prompt = [*shared, *range(1000, 1020)]  # 8 of 28 tokens match: < 0.5
    assert r.route(req(long_prompt), loads(10, 0), 0.0) == 1
    # At exactly the threshold the match wins.
    r2 = CacheAwareRouter(page_size=4, cache_threshold=0.5)
    r2.route(req(shared), loads(0, 0), 0.0)
    assert r2.route(req([*shared, *range(50, 58)]), loads(10, 0), 0.0) == 0


def test_cache_aware_imbalance_needs_both_thresholds() -> None:
    r = CacheAwareRouter(page_size=4, balance_abs_threshold=100, balance_rel_threshold=1.5)
    p = list(range(16))
    r.route(req(p), loads(0, 0), 0.0)  # recorded on 0
    # abs gap 101 but ratio 1.1 -> balanced -> affinity.
    assert r.route(req(p), loads(1101, 1000), 0.0) == 0
    # ratio large but abs gap 100 (not > 100) -> affinity.
    assert r.route(req(p), loads(100, 0), 0.0) == 0
    # Both exceeded -> least loaded, and the prompt is now recorded there too.
    assert r.route(req(p), loads(101, 0), 0.0) == 1
    assert r.match_len(req(p), 1) == 16
    assert r.is_imbalanced(loads(0, 101)) and not r.is_imbalanced(loads(0, 100))


def test_cache_aware_match_ties_break_by_load_then_id() -> None:
    r = CacheAwareRouter(page_size=4)
    p = list(range(8))
    r.route(req(p), loads(0, 0, 0), 0.0)  # recorded on 0
    r._record(2, page_hashes(np.asarray(p, dtype=np.int32), 4))
    assert r.route(req(p), loads(50, 0, 10), 0.0) == 2
    assert r.route(req(p), loads(10, 0, 10), 0.0) == 0


def test_cache_aware_namespaces_do_not_share() -> None:
    r = CacheAwareRouter(page_size=4)
    p = list(range(8))
    r.route(req(p, extra_key="lora-1"), loads(0, 0), 0.0)
    assert r.match_len(req(p), 0) == 0
    assert r.match_len(req(p, extra_key="lora-1"), 0) == 8


def test_cache_aware_record_is_bounded_lru() -> None:
    r = CacheAwareRouter(page_size=4, max_tokens_per_replica=16)  # 4 pages
    a, b = list(range(8)), list(range(100, 108))
    r.route(req(a), loads(0), 0.0)
    r.route(req(b), loads(0), 0.0)
    assert r.record_size(0) == 16
    r.route(req(a), loads(0), 0.0)  # refresh a
    r.route(req(list(range(300, 304))), loads(0), 0.0)  # one new page: evicts b's deep page
    assert r.match_len(req(a), 0) == 8
    assert r.match_len(req(b), 0) == 4  # deep page went first, the prefix survives
    assert r.record_size(0) == 16


def test_cache_aware_short_prompt_has_no_match() -> None:
    r = CacheAwareRouter(page_size=64)
    r.route(req([1, 2, 3]), loads(0, 0), 0.0)
    assert r.route(req([1, 2, 3]), loads(5, 0), 0.0) == 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24), min_size=1, max_size=20),
    st.lists(st.integers(0, 500), min_size=3, max_size=3),
)
def test_cache_aware_properties(prompts: list[list[int]], load_values: list[int]) -> None:
    """The choice is a valid id; when balanced and some replica holds >= half the prompt, the
    chosen replica's recorded match is the longest; the record never exceeds its bound."""
    r = CacheAwareRouter(page_size=2, max_tokens_per_replica=20, balance_abs_threshold=10**9)
    reps = loads(*load_values)
    for i, p in enumerate(prompts):
        q = req(p, rid=f"r{i}")
        matches = [r.match_len(q, k) for k in range(3)]
        choice = r.route(q, reps, float(i))
        assert choice in (0, 1, 2)
        best = max(matches)
        if best > 0 and best >= 0.5 * len(p):
            assert matches[choice] == best
        else:
            assert reps[choice].load == min(x.load for x in reps)
        assert all(r.record_size(k) <= 20 for k in range(3))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=0, max_size=40),
    st.lists(st.integers(0, 5), min_size=0, max_size=40),
    st.integers(1, 5),
)
def test_page_hash_property(a: list[int], b: list[int], page: int) -> None:
    """Hash i matches exactly when the first (i + 1) pages match; it is independent of the
    page size (a hash names a prefix length, not a page count); max_pages truncates."""
    ta, tb = np.asarray(a, dtype=np.int32), np.asarray(b, dtype=np.int32)
    ha, hb = page_hashes(ta, page), page_hashes(tb, page)
    assert len(ha) == len(a) // page
    for i in range(min(len(ha), len(hb))):
        same = a[: (i + 1) * page] == b[: (i + 1) * page]
        assert (ha[i] == hb[i]) == same
    per_token = page_hashes(ta, 1)
    assert ha == per_token[page - 1 :: page][: len(ha)]
    assert page_hashes(ta, page, max_pages=1) == ha[:1]

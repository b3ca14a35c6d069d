"""Random insert / match / lock / unlock / evict against a naive reference model.

The reference is the set of cached page-boundary prefixes ``(namespace, tokens[:k])`` plus the
slot each cached token position holds. It predicts every matched length, every insert's
already-cached length, every matched index array, and the protected size implied by the held
locks. Eviction is strategy-dependent, so the model is pruned to what the cache still matches
after an ``evict``; the checks then are the amount freed, that locked prefixes survive, and
that the pruned model's size equals the cache's. ``check_integrity`` and allocator conservation
run after every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from radixsched.cache import EVICTION_STRATEGIES, CacheKey, RadixCache, TokenAllocator
from radixsched.cache.base import Namespace
from radixsched.native import core
from radixsched.native.radix import NativeRadixCache

NAMESPACES: list[Namespace] = [None, ("", None), ("a", "s")]
# Sequences share prefixes often: a cut of one of a few related bases plus a random tail.
_A = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
_B = [*_A[:6], 3, 3, 2, 1, 1, 2, 3, 3, 2, 1]
_C = [*_A[:9], 1, 1, 1, 2, 2, 2, 3]
seqs = st.builds(
    lambda base, cut, tail: base[:cut] + tail,
    st.sampled_from([_A, _B, _C]),
    st.integers(0, 16),
    st.lists(st.integers(1, 3), max_size=6),
)
namespaces = st.sampled_from(NAMESPACES)

Prefix = tuple[Namespace, tuple[int, ...]]


class RadixMachine(RuleBasedStateMachine):
    page_size = 1
    cache_class: Any = RadixCache

    def __init__(self) -> None:
        super().__init__()
        self.alloc = TokenAllocator(4096, self.page_size)
        self.cache: RadixCache = self.cache_class(self.alloc, self.page_size)
        self.present: set[Prefix] = set()  # cached prefixes, one per page boundary
        # Slot of token i, keyed by the page prefix that contains it and i.
        self.slot_of: dict[tuple[Namespace, tuple[int, ...], int], int] = {}
        self.locks: list[tuple[Any, Namespace, tuple[int, ...]]] = []

    @initialize(policy=st.sampled_from(sorted(EVICTION_STRATEGIES)), compat=st.booleans())
    def build(self, policy: str, compat: bool) -> None:
        self.cache = self.cache_class(self.alloc, self.page_size, policy, compat_sglang=compat)

    # ---- reference ------------------------------------------------------------------------
    def aligned(self, seq: list[int]) -> tuple[int, ...]:
        p = self.page_size
        return tuple(seq[: len(seq) - len(seq) % p])

    def slot_key(
        self, ns: Namespace, t: tuple[int, ...], i: int
    ) -> tuple[Namespace, tuple[int, ...], int]:
        return (ns, t[: (i // self.page_size + 1) * self.page_size], i)

    def ref_match(self, ns: Namespace, seq: list[int]) -> int:
        t = self.aligned(seq)
        k = 0
        while k < len(t) and (ns, t[: k + self.page_size]) in self.present:
            k += self.page_size
        return k

    def ref_protected(self) -> int:
        pages = {
            (ns, t[: k + self.page_size])
            for _, ns, t in self.locks
            for k in range(0, len(t), self.page_size)
        }
        return len(pages) * self.page_size

    # ---- rules ----------------------------------------------------------------------------
    @rule(seq=seqs, ns=namespaces, priority=st.integers(0, 3))
    def insert(self, seq: list[int], ns: Namespace, priority: int) -> None:
        p = self.page_size
        expect = self.ref_match(ns, seq)
        n = len(seq)
        slots = self.alloc.alloc(-(-n // p) * p)
        assert slots is not None
        res = self.cache.insert(CacheKey(np.array(seq, dtype=np.int32), ns), slots, priority)
        assert res.prefix_len == expect
        t = self.aligned(seq)
        for i in range(expect, len(t)):
            self.slot_of[self.slot_key(ns, t, i)] = int(slots[i])
        for k in range(expect, len(t), p):
            self.present.add((ns, t[: k + p]))
        self.alloc.free(slots[:expect])
        self.alloc.free(slots[len(t) :])

    @rule(seq=seqs, ns=namespaces)
    def match(self, seq: list[int], ns: Namespace) -> None:
        key = CacheKey(np.array(seq, dtype=np.int32), ns)
        expect = self.ref_match(ns, seq)
        assert self.cache.match_len(key) == expect
        m = self.cache.match_prefix(key)
        assert m.device_len == expect
        t = tuple(seq)
        assert m.indices.tolist() == [self.slot_of[self.slot_key(ns, t, i)] for i in range(expect)]
        if expect == 0:
            assert m.last_node is self.cache.root

    @rule(seq=seqs, ns=namespaces)
    def lock(self, seq: list[int], ns: Namespace) -> None:
        m = self.cache.match_prefix(CacheKey(np.array(seq, dtype=np.int32), ns))
        if m.device_len == 0:
            return
        before = self.cache.evictable_size()
        delta = self.cache.inc_lock_ref(m.last_node)
        assert delta <= 0 and self.cache.evictable_size() == before + delta
        self.locks.append((m.last_node, ns, tuple(seq[: m.device_len])))

    @precondition(lambda self: bool(self.locks))
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.locks) - 1))
        node, _, _ = self.locks.pop(i)
        before = self.cache.evictable_size()
        delta = self.cache.dec_lock_ref(node)
        assert delta >= 0 and self.cache.evictable_size() == before + delta

    @rule(n=st.integers(0, 40))
    def evict(self, n: int) -> None:
        p = self.page_size
        total = self.cache.total_size()
        evictable = self.cache.evictable_size()
        protected = self.cache.protected_size()
        free_before = self.alloc.available_size()
        freed = self.cache.evict(n)
        want = min(n, evictable)
        assert freed >= want
        if self.cache.compat_sglang:
            assert freed <= evictable
        elif n <= evictable:
            assert freed < want + p
        else:
            assert freed == evictable
        assert self.cache.total_size() == total - freed
        assert self.cache.protected_size() == protected
        assert self.alloc.available_size() == free_before + freed
        # Prune the model to what is still cached; locked prefixes must all survive.
        kept = {
            (ns, t)
            for ns, t in self.present
            if self.cache.match_len(CacheKey(np.array(t, dtype=np.int32), ns)) == len(t)
        }
        for _, ns, t in self.locks:
            assert self.ref_match(ns, list(t)) == len(t)
            for k in range(p, len(t) + 1, p):
                assert (ns, t[:k]) in kept
        self.present = kept

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        cache = self.cache
        cache.check_integrity()
        self.alloc.check_integrity(cache_slots=cache.all_values())
        assert cache.total_size() == len(self.present) * self.page_size
        assert cache.protected_size() == self.ref_protected()
        assert cache.evictable_size() == cache.total_size() - cache.protected_size()

    def teardown(self) -> None:
        for node, _, _ in self.locks:
            self.cache.dec_lock_ref(node)
        self.cache.evict(self.cache.total_size())
        assert self.cache.total_size() == 0
        assert self.alloc.available_size() == self.alloc.total_size


class RadixMachinePage4(RadixMachine):
    page_size = 4


_settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestRadixStatefulPage1 = RadixMachine.TestCase
TestRadixStatefulPage1.settings = _settings
TestRadixStatefulPage4 = RadixMachinePage4.TestCase
TestRadixStatefulPage4.settings = _settings


if core() is not None:  # the same machine against the native tree

    class NativeRadixMachine(RadixMachine):
        cache_class = NativeRadixCache

    class NativeRadixMachinePage4(RadixMachinePage4):
        cache_class = NativeRadixCache

    TestNativeRadixStatefulPage1 = NativeRadixMachine.TestCase
    TestNativeRadixStatefulPage1.settings = _settings
    TestNativeRadixStatefulPage4 = NativeRadixMachinePage4.TestCase
    TestNativeRadixStatefulPage4.settings = _settings

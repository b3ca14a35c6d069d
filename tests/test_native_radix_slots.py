"""The native tree keeps a node's KV slots as int32 (``SlotVec``, ``_native/radix.hpp``): every
way out (``Node.value``, matches, a prefix's slots, evictions) reads the int64 slots that went
in, negative and int32-extreme ones included; a slot outside int32 is refused (ValueError)
and leaves no node behind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from radixsched.native import core

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built")

I32, I64 = np.int32, np.int64
EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 7, 2**31 - 2, -(2**31) + 1, 123_456_789]


def _tree() -> Any:
    mod = core()
    assert mod is not None
    return mod.Tree(1, "lru", 2, False, False)


def test_slots_read_out_as_they_went_in() -> None:
    tree = _tree()
    toks = np.arange(len(EDGES), dtype=I32)
    length, node = tree.insert(toks, 0, np.array(EDGES, I64), 0, 0, None, 0, 0)
    assert length == 0
    assert node.value.dtype == I64 and node.value.tolist() == EDGES
    _, m, values = tree.walk(toks, 0, True)
    assert m == len(EDGES) and list(values) == EDGES
    assert tree.prefix_slots(node, len(EDGES), None).tolist() == EDGES
    out = np.empty(len(EDGES), I64)
    tree.prefix_slots(node, len(EDGES), out)
    assert out.tolist() == EDGES
    node.value = np.array(EDGES[::-1], I64)  # the setter narrows them the same way
    assert node.value.tolist() == EDGES[::-1]
    assert sorted(tree.all_values()) == sorted(EDGES)


def test_a_split_node_keeps_each_part_of_its_slots() -> None:
    tree = _tree()
    toks = np.arange(9, dtype=I32)
    tree.insert(toks, 0, np.array(EDGES, I64), 0, 0, None, 0, 0)
    _, m, values = tree.walk(toks[:4], 0, True)  # splits the node at 4
    assert m == 4 and list(values) == EDGES[:4]
    assert tree.prefix_slots(tree.walk(toks, 0, False)[0], 9, None).tolist() == EDGES


def test_evicted_slots_come_out_as_int64() -> None:
    tree = _tree()
    tree.insert(np.arange(5, dtype=I32), 0, np.array(EDGES[:5], I64), 0, 0, None, 0, 0)
    tree.insert(np.array([9, 9, 9], I32), 0, np.array(EDGES[5:8], I64), 0, 0, None, 0, 0)
    freed = [int(s) for seg in tree.evict(8) for s in seg]
    assert sorted(freed) == sorted(EDGES[:8])


@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1, 2**40])
def test_a_slot_outside_int32_is_refused(bad: int) -> None:
    tree = _tree()
    values = np.array([1, 2, bad, 4, 5, 6, 7], I64)
    with pytest.raises(ValueError, match="int32"):
        tree.insert(np.arange(7, dtype=I32), 0, values, 0, 0, None, 0, 0)
    assert tree.nodes() == [] and tree.evictable_size() == 0
    _, node = tree.insert(np.arange(2, dtype=I32), 0, np.array([3, 4], I64), 0, 0, None, 0, 0)
    with pytest.raises(ValueError, match="int32"):
        node.value = np.array([bad, 0], I64)
    assert node.value.tolist() == [3, 4]
    tree.check_integrity()

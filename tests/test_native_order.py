"""The native kept orders (``_native/order.cpp``) against Python itself: ``StableOrder`` compares
keys exactly as Python compares tuples (int against float exactly, bools as ints, strings by
code point, anything else by Python's own operators) and keeps the order a stable ``sorted``
gives; ``HrrnColumns`` hands out hrrn's order, sorted by the ratios Python computes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.native import core

native = core()
pytestmark = pytest.mark.skipif(native is None, reason="the native core is not built, or is off")


def _reqs(n: int) -> list[Any]:
    return [SimpleNamespace(rid=f"r{i}") for i in range(n)]


def _sorted_by_reset(keys: list[tuple[Any, ...]]) -> list[int]:
    assert native is not None
    reqs = _reqs(len(keys))
    order = native.StableOrder()
    order.reset(reqs, keys)
    return [reqs.index(r) for r in order.reqs]


def _python_sort(keys: list[tuple[Any, ...]]) -> list[int]:
    return sorted(range(len(keys)), key=keys.__getitem__)


@pytest.mark.parametrize(
    "keys",
    [
        [(2**53 + 1,), (float(2**53),), (2**53,), (2**53 - 1,)],  # past float precision
        [(True,), (1,), (1.0,), (0.5,), (False,), (-0.0,), (0,)],  # bools are ints; -0.0 == 0
        [(0,), (-0.5,), (-1,), (-1.5,), (2,), (2.5,)],  # int against a fraction either side
        [(float("inf"),), (2**62,), (float("-inf"),), (-(2**63),), (float(-(2**63)),)],
        [(2**70,), (2**64 + 0.0,), (2**63,), (float(2**63),), (2**63 - 1,)],  # past int64
        [("b",), ("a",), ("é",), ("\U0001f600",), ("\uffff",), ("",), ("ab",)],  # code points
        [(1, "x", 2.5), (1, "x", 2), (1, "w", 9), (0, "z", 0), (1, "x", 2.5)],  # stable ties
        [(1,), (1, 0), (0, 5), (1, -1), ()],  # shorter is less when a prefix
        [((1, 2),), ((1,),), ((0, 9),)],  # nested tuples: Python's operators
        [(float("nan"),), (1,)],  # nan: by Python's operators (never less, never equal)
    ],
)
def test_reset_sorts_as_python_sorts(keys: list[tuple[Any, ...]]) -> None:
    assert _sorted_by_reset(keys) == _python_sort(keys)


def test_update_moves_only_what_changed_and_edits_the_mirror() -> None:
    assert native is not None
    reqs = _reqs(4)
    order = native.StableOrder()
    order.reset(reqs, [(1, 0.5), (0, 2), (1, 0.5), (2, 0)])
    assert order.reqs == [reqs[1], reqs[0], reqs[2], reqs[3]]
    new = SimpleNamespace(rid="new")
    mirror = [*order.reqs, new]
    order.update([(reqs[3], (0, 2.0)), (reqs[0], (1, 0.5))], [(new, (1, True))], mirror)
    # r3 shrank to r1's key: after r1 (it stood after it); r0 unchanged; new (1, 1) > (1, 0.5)
    assert order.reqs == [reqs[1], reqs[3], reqs[0], reqs[2], new]
    assert mirror == order.reqs
    assert [order.position(r) for r in order.reqs] == [0, 1, 2, 3, 4]
    assert order.stored(reqs[3]) == (0, 2.0, 5)
    assert order.remove(reqs[1], mirror) and not order.remove(reqs[1])
    assert mirror == order.reqs == [reqs[3], reqs[0], reqs[2], new]
    assert len(order) == 4 and reqs[0] in order and reqs[1] not in order


def test_place_takes_a_neighbours_key_and_a_tie_between() -> None:
    assert native is not None
    reqs = _reqs(3)
    order = native.StableOrder()
    order.reset(reqs, [(0,), (0,), (1,)])
    a, b, c = (SimpleNamespace(rid=x) for x in "abc")
    assert order.place(a, 1)  # between two of key 0: tie 0.5
    assert order.stored(a) == (0, 0.5)
    assert order.place(b, 3)  # after the last of key 0, before key 1: above every tie
    assert order.stored(b) == (0, 4)
    assert order.place(c, 0)
    assert order.stored(c) == (0, -2)
    assert order.reqs == [c, reqs[0], a, reqs[1], b, reqs[2]]
    with pytest.raises(IndexError):
        order.place(SimpleNamespace(rid="d"), 7)
    assert not native.StableOrder().place(a, 0)  # an empty order has no neighbour


def test_unknown_members_and_bad_input_raise() -> None:
    assert native is not None
    order = native.StableOrder()
    order.reset(_reqs(2), [(0,), (1,)])
    with pytest.raises(KeyError):
        order.update([(SimpleNamespace(rid="x"), (0,))], [])
    with pytest.raises(ValueError):
        order.reset(_reqs(2), [(0,)])
    with pytest.raises(TypeError):
        order.reset(_reqs(2), [(0,), ("a",)])  # int against str, as sorted() raises


# Keys of one fixed shape: each position numeric (bools, ints past 2^53, floats) or text.
_NUMBER = st.one_of(
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([2**53, 2**53 + 1, -(2**63), 2**63 - 1]),
    st.floats(allow_nan=False, min_value=-4, max_value=4),
    st.sampled_from([float(2**53), float("inf"), float("-inf"), -0.0]),
)
_TEXT = st.text(alphabet="ab\u00e9\U0001f600", max_size=2)


@st.composite
def _keys(draw: st.DrawFn) -> tuple[list[st.SearchStrategy[Any]], list[tuple[Any, ...]]]:
    shape = draw(st.lists(st.sampled_from([_NUMBER, _TEXT]), min_size=1, max_size=3))
    key = st.tuples(*shape)
    return [key], draw(st.lists(key, max_size=25))


@settings(max_examples=200, deadline=None)
@given(drawn=_keys(), data=st.data())
def test_updates_equal_a_stable_sort(drawn: Any, data: st.DataObject) -> None:
    """Rounds of re-keys, arrivals and removals leave exactly ``sorted`` of the list as the last
    round left it, plus the arrivals."""
    assert native is not None
    (key,), initial = drawn
    reqs = _reqs(len(initial))
    key_of = {id(r): k for r, k in zip(reqs, initial, strict=True)}
    order = native.StableOrder()
    order.reset(reqs, initial)
    listed = sorted(reqs, key=lambda r: key_of[id(r)])
    assert order.reqs == listed
    for rnd in range(data.draw(st.integers(0, 5))):
        for i in data.draw(st.lists(st.integers(0, 60), max_size=3)):
            if listed:
                gone = listed.pop(i % len(listed))
                assert order.remove(gone)
        changed = {}
        for i, k in data.draw(st.lists(st.tuples(st.integers(0, 60), key), max_size=8)):
            if listed:
                r = listed[i % len(listed)]
                key_of[id(r)] = k
                changed[id(r)] = r
        new = [SimpleNamespace(rid=f"n{rnd}.{j}") for j in range(data.draw(st.integers(0, 4)))]
        for r in new:
            key_of[id(r)] = data.draw(key)
        mirror = [*listed, *new]
        order.update(
            [(r, key_of[id(r)]) for r in changed.values()],
            [(r, key_of[id(r)]) for r in new],
            mirror,
        )
        listed = sorted([*listed, *new], key=lambda r: key_of[id(r)])
        assert order.reqs == listed
        assert mirror == listed


def _hrrn_key(r: Any, processed: int, deferred: set[str]) -> tuple[Any, ...]:
    work = r.fill_len - r.num_matched_prefix_tokens
    if r.rid in deferred:
        ratio = float("inf")
    elif work <= 0:
        ratio = float("-inf")
    else:
        ratio = -(max(processed - r.queue_entry_processed_tokens, 0) / work)
    return (ratio, r.queue_entry_time, r.arrival_time, r.rid)


_HRRN_REQ = st.tuples(
    st.integers(1, 40),
    st.integers(0, 45),
    st.integers(0, 100),
    st.integers(0, 3),
    st.integers(0, 2),
)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(_HRRN_REQ, max_size=40), data=st.data())
def test_hrrn_columns_hand_out_the_sorted_ratios(rows: list[Any], data: st.DataObject) -> None:
    """Each round's order is ``sorted`` by (ratio as Python computes it, entry, arrival, rid)
    with the list order breaking the rest, read lazily or applied to the list."""
    assert native is not None
    reqs = [
        SimpleNamespace(
            rid=f"r{data.draw(st.integers(0, 9))}",
            fill_len=fill,
            num_matched_prefix_tokens=matched,
            queue_entry_processed_tokens=q,
            queue_entry_time=float(entry),
            arrival_time=float(arrival),
        )
        for fill, matched, q, entry, arrival in rows
    ]
    cols = native.HrrnColumns()
    # A request's dedup status is re-read when it arrives or changes (the queue passes the
    # flipped ones as changed): one set for the whole test.
    deferred = {f"r{i}" for i in data.draw(st.lists(st.integers(0, 9), max_size=4))}
    held: list[Any] = []
    pending = list(reqs)
    for _ in range(3):
        arrivals, pending = pending[: len(pending) // 2 + 1], pending[len(pending) // 2 + 1 :]
        changed = [r for r in held if data.draw(st.booleans())]
        for r in changed:
            r.num_matched_prefix_tokens = data.draw(st.integers(0, 45))
        processed = data.draw(st.integers(0, 150))
        rnd = cols.advance(changed, arrivals, frozenset(deferred), processed)
        held += arrivals
        assert cols.reqs == held
        want = sorted(range(len(held)), key=lambda i: _hrrn_key(held[i], processed, deferred))
        if data.draw(st.booleans()):
            reads = data.draw(st.integers(0, len(held)))
            assert [next(rnd) for _ in range(reads)] == want[:reads]
        else:
            cols.apply(rnd)
            held = [held[i] for i in want]
            assert cols.reqs == held
        if held and data.draw(st.booleans()):
            gone = held.pop(data.draw(st.integers(0, len(held) - 1)))
            cols.remove(gone)
            cols.remove(gone)  # not held any more: nothing
            assert cols.reqs == held


def _updated(keys: list[tuple[Any, ...]], moves: dict[int, tuple[Any, ...]]) -> None:
    """``update`` re-keying ``moves`` (index -> new key) leaves ``sorted`` of the list, and the
    mirror the same."""
    assert native is not None
    reqs = _reqs(len(keys))
    order = native.StableOrder()
    order.reset(reqs, keys)
    key_of = {id(r): k for r, k in zip(reqs, keys, strict=True)}
    listed = sorted(reqs, key=lambda r: key_of[id(r)])
    for i, k in moves.items():
        key_of[id(reqs[i])] = k
    mirror = list(listed)
    order.update([(reqs[i], k) for i, k in moves.items()], [], mirror)
    assert order.reqs == mirror == sorted(listed, key=lambda r: key_of[id(r)])


def test_movers_each_move_to_their_place() -> None:
    """Movers that grow and shrink to keys others hold (up and down by one place included),
    a few of them and past a few (duplicates then looked for in a hash set): the stable
    sort's order."""
    keys = [(i % 7, float(i % 3)) for i in range(60)]
    _updated(keys, {i: ((i * 5) % 9, 0.5) for i in range(0, 60, 3)})
    line = [(i,) for i in range(8)]
    _updated(line, {3: (4,), 5: (4,)})  # one grows to its right neighbour's key, one shrinks
    _updated(line, {0: (1,), 7: (6,), 4: (4.5,)})
    _updated([(0,), (0,), (1,), (1,), (2,)], {0: (1,), 1: (1,), 4: (0,), 3: (0,)})


def test_keys_of_other_shapes_update_one_by_one() -> None:
    """Keys whose atoms Python compares (nested tuples: several grow and shrink to keys others
    hold), and keys of several lengths (none a prefix of another: a dfs-weight shape),
    re-keyed as the stable sort orders them."""
    nested = [((i % 3,),) for i in range(12)]
    _updated(nested, {0: ((2,),), 3: ((2,),), 6: ((2,),), 2: ((0,),), 5: ((0,),), 8: ((0,),)})
    _updated([((1, 2),), ((0, 5),), ((1, 1),), ((0, 0),)], {0: ((0, 1),), 3: ((2, 0),)})
    dfs = [(0, 0, -3, 1, 0), (0, 1, -5), (0, 0, -3, 1, 1), (0, 1, -2), (1, 0, -1, 2, 0)]
    _updated(dfs, {1: (0, 0, -4, 2, 0), 2: (1, 1, -9), 4: (0, 1, -7)})


def test_a_duplicate_or_a_stranger_among_the_changed_raises_as_before() -> None:
    """A request listed twice: the first re-keyed out, the second not found (KeyError), as the
    one-by-one update leaves it; a mixed key (a number where a string stood) raises TypeError."""
    assert native is not None
    reqs = _reqs(3)
    order = native.StableOrder()
    order.reset(reqs, [(0,), (1,), (2,)])
    with pytest.raises(KeyError):
        order.update([(reqs[1], (5,)), (reqs[1], (6,))], [])
    assert reqs[1] not in order and order.reqs == [reqs[0], reqs[2]]
    texts = native.StableOrder()
    texts.reset(reqs, [("a",), ("b",), ("c",)])
    with pytest.raises(TypeError):  # raised by the first comparison: nothing moved
        texts.update([(reqs[0], (1,))], [])
    assert reqs[0] in texts and texts.reqs == reqs
    for keys, key in [
        ([(0, 5), (1, "a")], (1, 7)),  # stored: a number and a string at one place
        ([(0, 5), (1, 6)], (1, "z")),  # the new key: a string where numbers stand
    ]:
        mixed = native.StableOrder()
        mixed.reset(reqs[:2], keys)
        with pytest.raises(TypeError):  # raised as it is re-inserted: it left the order
            mixed.update([(reqs[0], key)], [])
        assert reqs[0] not in mixed and mixed.reqs == [reqs[1]]


def test_a_mirror_shorter_than_the_members_is_edited_as_before() -> None:
    """The mirror must list the members first; one that does not is edited index for index
    as the one-by-one update edits it (its deletions past the end do nothing)."""
    assert native is not None
    reqs = _reqs(3)
    order = native.StableOrder()
    order.reset(reqs, [(0,), (1,), (2,)])
    mirror: list[Any] = []
    order.update([(reqs[0], (5,))], [], mirror)
    assert order.reqs == [reqs[1], reqs[2], reqs[0]] and mirror == [reqs[0]]

"""The native decode columns (``_core.DecodeBatch``, ``_native/decode.cpp``) against plain Python
arithmetic on the same rows, and the accelerated scheduler's integrity check catching stale
columns and inconsistent deferred decode state."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.cache.base import IntegrityError
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.request import Req, SamplingParams
from radixsched.sim.simulate import SimConfig

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")


class Row(SimpleNamespace):
    """What DecodeBatch reads of a request."""


def _row(prompt: int, out: int, have: int, max_new: int, ignore: bool, stops: bool) -> Row:
    sampling = SamplingParams(
        max_new_tokens=max_new, ignore_eos=ignore, stop_token_ids=(7,) if stops else ()
    )
    return Row(prompt_ids=[0] * prompt, output_ids=[1] * out, kv_row=[0] * have, sampling=sampling)


def _batch(rows: list[Row], has_eos: bool = False) -> Any:
    b = core().DecodeBatch(has_eos)  # type: ignore[union-attr]
    b.extend(rows)
    return b


# ---- plain Python: what the columns must give -------------------------------------------------
def _fill(r: Row) -> int:
    return len(r.prompt_ids) + len(r.output_ids)


def _need(r: Row, steps: int, page: int) -> int:
    end = _fill(r) + steps - 1
    end = -(-end // page) * page
    return max(end - len(r.kv_row), 0)


def _fits(rows: list[Row], limit: int, room: int, page: int) -> int:
    """The largest k in [1, limit] whose need fits in room, by trying every k (1 if none)."""
    ok = [k for k in range(1, limit + 1) if sum(_need(r, k, page) for r in rows) <= room]
    return max(ok, default=1)


def _to_go(r: Row) -> int:
    return max(r.sampling.max_new_tokens - len(r.output_ids), 0)


rows_st = st.lists(
    st.builds(
        _row,
        prompt=st.integers(1, 40),
        out=st.integers(0, 30),
        have=st.integers(0, 80),
        max_new=st.integers(0, 40),
        ignore=st.booleans(),
        stops=st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(rows=rows_st, has_eos=st.booleans(), page=st.sampled_from([1, 2, 4, 16]))
def test_columns_equal_plain_python(rows: list[Row], has_eos: bool, page: int) -> None:
    b = _batch(rows, has_eos)
    assert len(b) == len(rows) and all(a is r for a, r in zip(b.reqs, rows, strict=True))
    assert b.fill.tolist() == [_fill(r) for r in rows]
    assert b.have.tolist() == [len(r.kv_row) for r in rows]
    stops = [
        bool(r.sampling.stop_token_ids) or (has_eos and not r.sampling.ignore_eos) for r in rows
    ]
    assert b.stops.tolist() == stops and b.can_stop == any(stops)
    for steps in (1, 2, 5):
        assert b.need(steps, page) == [_need(r, steps, page) for r in rows]
        assert b.need_total(steps, page) == sum(_need(r, steps, page) for r in rows)
    for clip in (0, 3, 1 << 40):
        rem = [min(_to_go(r), clip) for r in rows]
        full = sum(x for x, r in zip(rem, rows, strict=True) if r.sampling.ignore_eos)
        assert b.decode_tokens(clip) == (full, sum(rem) - full)
    assert b.progress() == (
        sum(len(r.output_ids) for r in rows),
        sum(r.sampling.max_new_tokens for r in rows),
    )
    assert b.to_go() == [_to_go(r) for r in rows]
    assert b.min_left() == min(r.sampling.max_new_tokens - len(r.output_ids) for r in rows)
    done = [i for i, r in enumerate(rows) if len(r.output_ids) >= r.sampling.max_new_tokens]
    assert b.maybe_finished() == (list(range(len(rows))) if any(stops) else done)


@settings(max_examples=300, deadline=None)
@given(
    rows=rows_st,
    page=st.sampled_from([1, 2, 4]),
    limit=st.integers(1, 60),
    room=st.integers(-20, 400),
)
def test_max_steps_that_fit_is_the_largest_k_that_fits(
    rows: list[Row], page: int, limit: int, room: int
) -> None:
    """Both the page-1 closed form and the binary search give the largest fitting k (when
    one step fits: the scheduler asks only then)."""
    if sum(_need(r, 1, page) for r in rows) > room:
        return
    assert _batch(rows).max_steps_that_fit(limit, room, page) == _fits(rows, limit, room, page)


def test_the_page_1_closed_form_solves_rows_ending_where_their_next_token_goes() -> None:
    rows = [_row(10, 2, 11, 50, True, False), _row(5, 0, 4, 50, True, False)]  # short 0 and 0
    b = _batch(rows)
    # need(k) = 2 * k: room 7 fits k = 3 (need 6), not 4 (need 8).
    assert b.max_steps_that_fit(30, 7, 1) == 3 == _fits(rows, 30, 7, 1)
    assert b.max_steps_that_fit(2, 7, 1) == 2  # the limit
    assert b.max_steps_that_fit(30, 0, 1) == 1


def test_need_rounds_up_to_whole_pages() -> None:
    b = _batch([_row(5, 0, 4, 9, True, False), _row(8, 0, 8, 9, True, False)])
    assert b.need(1, 4) == [4, 0]  # fill 5: positions [0, 5) are two pages, it holds one
    assert b.need(2, 4) == [4, 4]
    assert b.need(1, 1) == [1, 0]


def test_decode_tokens_clip_each_request_and_split_by_ignore_eos() -> None:
    b = _batch([_row(3, 1, 3, 10, True, False), _row(3, 8, 3, 10, False, False)])
    assert b.decode_tokens(4) == (4, 2)  # 9 clipped to 4; 2
    assert b.decode_tokens(100) == (9, 2)
    assert _batch([_row(3, 12, 3, 10, True, False)]).decode_tokens(5) == (0, 0)  # past max


@settings(max_examples=200, deadline=None)
@given(
    rows=rows_st,
    gone=st.lists(st.integers(0, 7), unique=True),
    k=st.integers(1, 9),
    page=st.sampled_from([1, 4]),
)
def test_membership_edits_and_advance_keep_rows_in_order(
    rows: list[Row], gone: list[int], k: int, page: int
) -> None:
    b = _batch(rows)
    fill, have, out = b.fill, b.have, b.out_len
    total = b.need_total(k, page)
    needs = b.need(k, page)
    assert b.advance(k, page) == total
    assert b.fill.tolist() == (fill + k).tolist()
    assert b.out_len.tolist() == (out + k).tolist()
    assert b.have.tolist() == (have + np.array(needs)).tolist()
    positions = sorted(i for i in gone if i < len(rows))
    assert b.positions_of([rows[i] for i in reversed(positions)]) == positions
    keep = [i for i in range(len(rows)) if i not in positions]
    before = b.fill.tolist()
    b.remove_at(positions)
    assert [id(r) for r in b.reqs] == [id(rows[i]) for i in keep]
    assert b.fill.tolist() == [before[i] for i in keep]
    more = _row(4, 0, 4, 3, False, True)
    b.extend([more])
    assert b.reqs[-1] is more and b.can_stop and b.fill.tolist()[-1] == 4
    b.remove_at([len(b) - 1])
    assert b.can_stop == any(rows[i].sampling.stop_token_ids for i in keep)


def test_owed_is_what_the_columns_are_ahead_of_the_requests() -> None:
    a, c = _row(4, 1, 4, 20, True, False), _row(6, 0, 8, 20, True, False)
    b = _batch([a, c])
    b.advance(3, 4)  # a: fill 5 -> 8, KV [0, 7): 2 pages, it has 1; c: [0, 8), it has 2
    c.output_ids.append(1)  # c settled one of its tokens already
    reqs, ks, owed, fills, groups = b.owed([0, 1])
    assert reqs == [a, c] and ks == [3, 2] and owed == [4, 0] and fills == [8, 9]
    assert [(idx, sub, pos.tolist()) for idx, sub, pos in groups] == [
        ([0], [a], [[5, 6, 7]]),
        ([1], [c], [[7, 8]]),
    ]


def test_remove_at_refuses_rows_out_of_order() -> None:
    b = _batch([_row(3, 0, 3, 5, True, False)] * 3)
    with pytest.raises(ValueError):
        b.remove_at([2, 1])


# ---- the accelerated scheduler's integrity check -------------------------------------------------
def _scheduler() -> Any:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica

    sim = SimConfig(max_total_tokens=20_000)
    rep = _build_replica(0, SchedulerConfig(), sim, build_cost_model(sim), 20_000)
    sched = rep.sched
    for i, out in enumerate((40, 30)):
        sampling = SamplingParams(max_new_tokens=out, ignore_eos=True)
        sched.add_request(Req(f"r{i}", np.arange(64, dtype=np.int32) + i, sampling), now=0.0)
    while sched.waiting:
        sched.step()
    return sched


def test_a_deferred_jump_passes_the_check_and_settles_to_the_columns() -> None:
    sched = _scheduler()
    sched.step()  # a jump: nothing waits, nothing can stop
    assert sched.unsettled and sched.allocator.reserved_size() > 0
    sched.check_integrity()
    cols = sched.batch.cols
    sched.sync_running()
    assert not sched.unsettled and sched.allocator.reserved_size() == 0
    assert [r.fill_len for r in sched.running] == cols.fill.tolist()
    sched.check_integrity()


def test_integrity_catches_inconsistent_deferred_state() -> None:
    sched = _scheduler()
    sched.step()
    sched.batch.cols.advance(1, sched.page_size)  # a step the log and the pool never saw
    with pytest.raises(IntegrityError, match="deferred decode state inconsistent"):
        sched.check_integrity()


def test_integrity_catches_a_deferred_row_that_is_not_whole_steps_behind() -> None:
    sched = _scheduler()
    sched.step()
    r = sched.running[0]
    r.prompt_ids = np.append(r.prompt_ids, 0)  # ahead in fill but not in output: no step
    with pytest.raises(IntegrityError, match="deferred decode state inconsistent"):
        sched.check_integrity()


def test_integrity_catches_stale_columns() -> None:
    sched = _scheduler()
    sched.step()
    sched.sync_running()
    sched.check_integrity()
    sched.running[-1].output_ids.append(0)  # written without the columns following
    with pytest.raises(IntegrityError, match="stale running-batch columns"):
        sched.check_integrity()


def test_integrity_catches_columns_that_list_other_requests() -> None:
    sched = _scheduler()
    sched.step()
    sched.sync_running()
    sched.batch.cols.remove_at([0])
    with pytest.raises(IntegrityError, match="stale running-batch columns"):
        sched.check_integrity()


# ---- the runner's stand-in tokens, computed natively when settling ------------------------------
@settings(max_examples=300, deadline=None)
@given(
    h=st.integers(0, (1 << 64) - 1),
    first=st.integers(0, 1 << 40),
    count=st.integers(1, 30),
    vocab=st.integers(2, 1 << 31),
)
def test_native_stand_ins_equal_the_runners(h: int, first: int, count: int, vocab: int) -> None:
    from radixsched.sim.cost.runner import _stand_ins

    got = core().stand_ins(h, first, count, vocab)  # type: ignore[union-attr]
    assert got == _stand_ins(h, range(first, first + count), vocab)


class _Overriding(dict[str, int]):
    """A memo whose subscript is its own (the native read must call it, not read the dict)."""

    def __getitem__(self, rid: str) -> int:
        return 777


@pytest.mark.parametrize("kind", ["dict", "overriding", "missing"])
def test_settle_reads_the_rid_memo_as_its_subscript_does(kind: str) -> None:
    """The plain rows' rid hashes are ``memo[rid]``: a dict's entry, a subclass's own
    ``__getitem__``, or the runner's memo's ``__missing__`` (which fills it) on a miss."""
    from radixsched.native import radix as native_radix
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.runner import CostModelRunner, _RidHashes, _stand_ins

    runner = CostModelRunner(build_cost_model(SimConfig()))
    memo: dict[str, int] = {"dict": {"p": 4242}, "overriding": _Overriding(p=4242)}.get(
        kind, _RidHashes(runner.seed)
    )
    pool = native_radix.make_pool(1000, 1)
    req = Req("p", np.arange(5, dtype=np.int32), SamplingParams(max_new_tokens=9, ignore_eos=True))
    b = _batch([req])  # type: ignore[list-item]
    res = b.jump(True, 1000, 1, 0.0, None, runner.native_decode_cost(), pool, print, 0.0, 0.0)
    assert res is not None and res[0] == 9
    vocab = runner.native_tokens()[1]  # type: ignore[index]
    b.settle([0], runner.tokens_at, (memo, vocab), pool)
    h = {"dict": 4242, "overriding": 777}.get(kind, runner.native_tokens()[0]["p"])  # type: ignore[index]
    assert req.output_ids == _stand_ins(h, range(5, 14), vocab)
    assert kind != "missing" or "p" in memo


def test_settle_asks_the_runner_only_for_requests_that_are_not_plain() -> None:
    """A plain request's tokens come from the stand-in recipe, a scripted one's from
    ``tokens_at``: both what the runner gives for them."""
    from radixsched.native import radix as native_radix
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.runner import CostModelRunner

    runner = CostModelRunner(build_cost_model(SimConfig()))
    pool = native_radix.make_pool(1000, 1)
    sampling = SamplingParams(max_new_tokens=9, ignore_eos=True)
    plain = Req("p", np.arange(5, dtype=np.int32), sampling)
    script = np.arange(100, 109, dtype=np.int32)
    scripted = Req("s", np.arange(5, dtype=np.int32), sampling, scripted_output=script)
    b = core().DecodeBatch(False)  # type: ignore[union-attr]
    b.extend([plain, scripted])
    asked: list[list[str]] = []

    def tokens_at(reqs: list[Req], positions: np.ndarray) -> np.ndarray:
        asked.append([r.rid for r in reqs])
        return runner.tokens_at(reqs, positions)

    res = b.jump(True, 1000, 1, 0.0, None, runner.native_decode_cost(), pool, print, 0.0, 0.0)
    assert res is not None and res[0] == 9 and pool.reserved_size() == 2 * 13
    b.settle([0, 1], tokens_at, runner.native_tokens(), pool)
    assert asked == [["s"]] and scripted.output_ids == script.tolist()
    positions = np.arange(5, 14, dtype=np.int64)[None, :]
    assert plain.output_ids == runner.tokens_at([plain], positions).ravel().tolist()
    durations = runner.decode_durations([], np.array([5, 5]), 9)
    ends = np.cumsum(np.concatenate([[0.0], durations]))[1:].tolist()  # from t0 = 0.0
    assert res[1] == ends[-1]
    for r in (plain, scripted):
        assert r.kv_len == 13 and len(r.kv_row) == 13 and r.times.token_times == ends


def test_settle_asks_the_runner_for_requests_with_stop_ids() -> None:
    """A request with stop ids is not plain (its row ``stops``): its tokens are asked of
    ``tokens_at``, a plain one's computed natively, after a one-step jump of the batch."""
    from radixsched.native import radix as native_radix
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.runner import CostModelRunner

    runner = CostModelRunner(build_cost_model(SimConfig()))
    pool = native_radix.make_pool(1000, 1)
    plain = Req(
        "p", np.arange(5, dtype=np.int32), SamplingParams(max_new_tokens=9, ignore_eos=True)
    )
    stops = SamplingParams(max_new_tokens=9, ignore_eos=True, stop_token_ids=[3])
    stopper = Req("t", np.arange(5, dtype=np.int32), stops)
    b = core().DecodeBatch(False)  # type: ignore[union-attr]
    b.extend([plain, stopper])
    assert b.can_stop and b.stops.tolist() == [False, True]
    asked: list[list[str]] = []

    def tokens_at(reqs: list[Req], positions: np.ndarray) -> np.ndarray:
        asked.append([r.rid for r in reqs])
        return runner.tokens_at(reqs, positions)

    res = b.jump(True, 1000, 1, 0.0, None, runner.native_decode_cost(), pool, print, 0.0, 0.0)
    assert res is not None and res[0] == 1  # a row can stop: one step
    b.settle([0, 1], tokens_at, runner.native_tokens(), pool)
    assert asked == [["t"]]
    for r in (plain, stopper):
        want = runner.tokens_at([r], np.array([[5]], dtype=np.int64)).ravel().tolist()
        assert r.output_ids == want and r.kv_len == 5


@pytest.mark.parametrize("page", [1, 4])
def test_jump_returns_the_fills_before_its_steps_as_int64_bytes(page: int) -> None:
    """``jump``'s fills are the column as it stood (bytes of int64, read with np.frombuffer),
    and the columns advance by the steps, each row's slots by its own whole pages."""
    from radixsched.native import radix as native_radix
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.cost.runner import CostModelRunner

    runner = CostModelRunner(build_cost_model(SimConfig()))
    pool = native_radix.make_pool(4000, page)
    rows = [_row(5, 0, 4, 9, True, False), _row(30, 2, 32, 6, True, False)]
    b = _batch(rows)
    fill0, have0 = b.fill.tolist(), b.have.tolist()
    res = b.jump(True, 4000, page, 0.0, None, runner.native_decode_cost(), pool, print, 0.0, 0.0)
    assert res is not None and isinstance(res[4], bytes)
    k = res[0]
    assert k == 4  # the second row's tokens to go
    assert np.frombuffer(res[4], dtype=np.int64).tolist() == fill0
    assert b.fill.tolist() == [f + k for f in fill0]
    want = [h + _need(r, k, page) for r, h in zip(rows, have0, strict=True)]
    assert b.have.tolist() == want and pool.reserved_size() == sum(want) - sum(have0)


# ---- the retraction order: running.py's, natively -------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 3), st.sampled_from([None, -1, 0, 2])),
        min_size=1,
        max_size=9,
    ),
    policy=st.sampled_from(["length", "priority", "newest"]),
    sign=st.sampled_from([1, -1]),
)
def test_native_retraction_order_is_the_references(
    shape: list[tuple[int, int, int | None]], policy: str, sign: int
) -> None:
    """Ties on every key (few distinct lengths and priorities) keep the rows' order, as
    Python's stable ``sorted(..., reverse=True)`` does."""
    from radixsched.running import retraction_order

    rows = [_row(p, o, 0, 9, True, False) for p, o, _ in shape]
    for r, (_, _, prio) in zip(rows, shape, strict=True):
        r.priority = prio
    want = retraction_order(rows, [len(r.output_ids) for r in rows], policy, sign)  # type: ignore[arg-type]
    got = _batch(rows).retraction_order(policy, sign)
    assert [id(r) for r in got] == [id(r) for r in want]


def test_native_retraction_order_declines_what_python_must_decide() -> None:
    """A priority past int64 and an unknown policy: None (the batch then sorts in Python); a
    priority at int64's ends is exact (no overflow in ``prio * -sign``)."""
    from radixsched.native.scheduler import NativeRunningBatch

    rows = [_row(2, 1, 0, 9, True, False) for _ in range(3)]
    for r, prio in zip(rows, [-(1 << 63), 1 << 70, (1 << 63) - 1], strict=True):
        r.priority = prio
    b = _batch(rows)
    assert b.retraction_order("priority", 1) is None and b.retraction_order("oldest", 1) is None
    fast = NativeRunningBatch(False, lambda rows: None)
    fast.extend(rows)  # type: ignore[arg-type]
    ids = [id(r) for r in rows]

    def order(got: list[Any]) -> list[int]:
        return [ids.index(id(r)) for r in got]

    assert order(fast.retraction_order("priority", 1)) == [0, 2, 1]  # low first, pop the high
    rows[1].priority = 5
    assert order(_batch(rows).retraction_order("priority", 1)) == [0, 1, 2]
    assert order(_batch(rows).retraction_order("priority", -1)) == [2, 1, 0]
    with pytest.raises(KeyError):
        fast.retraction_order("oldest", 1)


@settings(max_examples=200, deadline=None)
@given(rows=rows_st, gone=st.sets(st.integers(0, 7)))
def test_remove_at_keeps_every_column_of_the_kept_rows(rows: list[Row], gone: set[int]) -> None:
    """Each column squeezed run by run: the kept rows' values, in order, in all six."""
    b = _batch(rows, has_eos=True)
    cols = ("fill", "have", "out_len", "max_new", "ignore_eos", "stops")
    before = {c: getattr(b, c).tolist() for c in cols}
    positions = sorted(i for i in gone if i < len(rows))
    keep = [i for i in range(len(rows)) if i not in positions]
    b.remove_at(positions)
    for c in cols:
        assert getattr(b, c).tolist() == [before[c][i] for i in keep], c
    assert b.can_stop == any(before["stops"][i] for i in keep)


@pytest.mark.parametrize("bad", [[3], [-1], [0, 0], [1, 3], [0, 2, 1]])
def test_remove_at_refuses_bad_rows_and_changes_nothing(bad: list[int]) -> None:
    rows = [_row(3, i, 3, 5, i == 1, i == 2) for i in range(3)]
    b = _batch(rows)
    with pytest.raises(ValueError):
        b.remove_at(bad)
    assert b.out_len.tolist() == [0, 1, 2] and b.stops.tolist() == [False, False, True]
    assert len(b) == 3 and b.can_stop


@pytest.mark.parametrize("stops", [False, True])
def test_a_decode_rounds_tokens_read_later_are_the_ones_written(stops: bool) -> None:
    """``JumpOutcome.pending`` of both shapes: a jump's (requests, runner, fills, steps), its
    tokens asked of the runner when read; eager steps' (requests, tokens), where a request can
    stop (stop ids: every step written at once). Read after the batch changed (``sync``)."""
    sched = _scheduler()
    if stops:
        sched.running[1].sampling = SamplingParams(max_new_tokens=30, stop_token_ids=(-1,))
        sched.batch.cols = None  # rebuilt from the requests: the row can stop
    reqs = list(sched.running)
    before = [len(r.output_ids) for r in reqs]
    out = sched.decode_round()
    assert out is not None and out.pending is not None and len(out.pending) == (2 if stops else 4)
    sched.sync_running()
    sched.batch.remove([reqs[0]])
    got = out.new_tokens
    assert [r for r, _ in got] == reqs and out.pending is None
    for (r, toks), had in zip(got, before, strict=True):
        assert toks == r.output_ids[had:] and len(toks) == out.num_steps
    assert out.new_tokens is got  # paired once


# ---- fair's decode charges ------------------------------------------------------------------------
_ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=500, deadline=None)
@given(c=_ANY_FLOAT, none=_ANY_FLOAT, inc=_ANY_FLOAT, n=st.integers(0, 64))
def test_repeat_add_is_pythons_float_additions(c: float, none: float, inc: float, n: int) -> None:
    want = c
    for _ in range(n):
        want = want + none + inc
    got = core().repeat_add(c, none, inc, n)
    assert struct.pack("<d", got) == struct.pack("<d", want) or (want != want and got != got)


_RATIOS = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.sampled_from(
    [0.0, -0.0, 0.7, 0.1, 0.0999999, 1.0]
)


@settings(max_examples=300, deadline=None)
@given(cur=_RATIOS, dec=_RATIOS, lo=_RATIOS, n=st.integers(0, 300))
def test_decay_ratio_is_the_trackers_float_steps(cur: float, dec: float, lo: float, n: int) -> None:
    """``NativeScheduler._decay``'s native steps against ``NewTokenRatioTracker.decay_steps``:
    the floor's stop, ``max``'s tie and NaN rule, signed zeros, a negative decay."""
    from radixsched.ratio import NewTokenRatioTracker

    t = NewTokenRatioTracker(SchedulerConfig())
    t.current, t.decay, t.min = cur, dec, lo
    t.decay_steps(n)
    got = core().decay_ratio(cur, dec, lo, n)
    want = t.current
    assert struct.pack("<d", got) == struct.pack("<d", want) or (want != want and got != got)


def _decaying(ratio: Any) -> Any:
    from radixsched.native.scheduler import NativeScheduler

    s = SimpleNamespace(ratio=ratio, _decay_ratio=core().decay_ratio)
    NativeScheduler._decay(s, 40)  # type: ignore[arg-type]
    return ratio


def test_decay_runs_natively_on_the_trackers_floats_only() -> None:
    """Floats: the native steps (the tracker's own method is not called); an int value or a
    tracker of another class: its ``decay_steps``."""
    from radixsched.ratio import NewTokenRatioTracker

    class Counting(NewTokenRatioTracker):
        calls = 0

        def decay_steps(self, n: int = 1) -> None:
            type(self).calls += 1
            super().decay_steps(n)

    cfg = SchedulerConfig()
    want = NewTokenRatioTracker(cfg)
    want.decay_steps(40)
    assert _decaying(NewTokenRatioTracker(cfg)).current == want.current
    sub = _decaying(Counting(cfg))
    assert Counting.calls == 1 and sub.current == want.current
    ints = NewTokenRatioTracker(cfg)
    ints.current, ints.decay, ints.min = 1, 0, 0  # ints: Python's steps (stays an int)
    assert type(_decaying(ints).current) is int


def _charged(prefill_weight: float, decode_weight: float, start: dict[str, Any]) -> dict:
    """``NativeScheduler._charge_decode`` of requests of tenants a, a, b, a for 5 tokens."""
    from radixsched.native.scheduler import NativeScheduler
    from radixsched.policies import VirtualTokenCounter

    fair = VirtualTokenCounter(prefill_weight, decode_weight, dict(start))
    mod = core()
    assert mod is not None
    s = SimpleNamespace(
        queue=SimpleNamespace(fair=fair),
        _repeat_add=mod.repeat_add,
        _tenant_counts=mod.tenant_counts,
    )
    reqs = [SimpleNamespace(tenant_key=t) for t in "aaba"]
    NativeScheduler._charge_decode(s, reqs, 5)  # type: ignore[arg-type]
    return fair.counters


def test_fair_decode_charges_add_float_by_float() -> None:
    got = _charged(1.0, 0.1, {"b": 0.3})
    want_a = 0.0
    for _ in range(3):
        want_a = want_a + 0.0 + 0.1 * 5
    assert got == {"b": 0.3 + 0.0 + 0.5, "a": want_a}
    assert list(got) == ["b", "a"]  # a new tenant joins the counters after the known ones


def test_fair_decode_charges_keep_integer_weights_exact() -> None:
    """Integer weights and counters add as Python ints (unbounded), not as doubles."""
    got = _charged(1, 3, {"a": 2**60})  # type: ignore[arg-type]
    assert got == {"a": 2**60 + 45, "b": 15.0}
    assert type(got["a"]) is int


# ---- the token times joined for the summary (results/requests.py) ----------------------------------


def test_join_floats_copies_exact_floats_and_declines_the_rest() -> None:
    lib: Any = core()
    out = np.zeros(4)
    assert lib.join_floats([[0.5, -0.0], [], [1e300, float("inf")]], out)
    assert out.tobytes() == np.array([0.5, -0.0, 1e300, float("inf")]).tobytes()
    assert not lib.join_floats([[0.5, 1]], np.zeros(2))  # an int: numpy converts it
    assert not lib.join_floats([[0.5]], np.zeros(2))  # fewer times than the array holds
    assert not lib.join_floats([[0.5, 1.0, 2.0]], np.zeros(2))  # more: nothing past its end
    assert not lib.join_floats([(0.5, 1.0)], np.zeros(2))  # not a list

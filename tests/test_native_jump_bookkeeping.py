"""A decode round's bookkeeping in one native call (``DecodeBatch.jump_round``, behind
``NativeScheduler._jump``) against the Python it replaced (``_reference_round`` below: the
columns' ``jump``, then the clock, the ratio, the statistics, the outcome, fair's charge and the
retire of the rows that may have finished, in that order), on two identical tiny schedulers:
the same state afterwards, floats' and ints' types included, for each branch of the call."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest

from radixsched.cache.base import IntegrityError
from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.native import core, retire
from radixsched.native import scheduler as fast_scheduler
from radixsched.native.scheduler import JumpOutcome
from radixsched.ratio import NewTokenRatioTracker
from radixsched.request import FINISHED_BY_LENGTH, Req, SamplingParams
from radixsched.sim.simulate import SimConfig

pytestmark = pytest.mark.skipif(core() is None, reason="the native core is not built, or is off")

Setup = Callable[[Any], None]


def _scheduler(outs: tuple[int, ...] = (40, 30), policy: str = "lpm") -> Any:
    """A replica's scheduler with ``outs`` requests prefilled (nothing waits)."""
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica

    sim = SimConfig(max_total_tokens=20_000)
    cfg = SchedulerConfig(schedule_policy=policy)
    sched = _build_replica(0, cfg, sim, build_cost_model(sim), 20_000).sched
    for i, out in enumerate(outs):
        sampling = SamplingParams(max_new_tokens=out, ignore_eos=True)
        sched.add_request(Req(f"r{i}", np.arange(64, dtype=np.int32) + i, sampling), now=0.0)
    while sched.waiting:
        sched.step()
    return sched


def _reference_jump(s: Any, cols: Any, free: bool, horizon: float | None) -> Any:
    """``NativeScheduler._jump`` as its Python was (3000ae2)."""
    st, clock, reqs = s.stats, s.clock, list(s.batch.reqs)
    runner = s.runner
    t0 = clock.now()
    timer = runner.native_decode_cost()
    res = cols.jump(
        free,
        s._room(),
        s.page_size,
        t0,
        horizon,
        runner if timer is None else timer,
        s._pool,
        s.cache.evict,
        st.busy_s,
        st.running_x_s,
    )
    if res is None:
        return None
    if res[0] == 0:
        raise s._alloc_failed(res[1])
    k, end, st.busy_s, st.running_x_s, fill0, maybe = res
    if type(clock) is VirtualClock:
        clock.jump_to(end)
    else:
        s._advance_to(end, end - t0)
    s._decay(k)
    st.decode_steps += k
    cap = s.capacity
    st.peak_kv_usage = max(st.peak_kv_usage, (cap - s._room()) / cap)
    out = JumpOutcome("decode", end - t0, len(reqs), k)
    s.unsettled = True
    out.pending = (reqs, runner, fill0, k)
    if s._charges:
        s._charge_decode(reqs, k)
    if maybe:
        s._retire_finished(maybe, out)
    return out


def _reference_round(s: Any, horizon: float | None) -> Any:
    """``decode_round``'s first test and ``_jump``, as their Python was."""
    cols = s.batch.columns()
    if s.defers and not cols.can_stop:
        return _reference_jump(s, cols, s._may_jump(), horizon)
    return None


def _rerun(s: Any, **flags: Any) -> None:
    """``s``'s native round rebuilt with some of its flags (or values) replaced."""
    args: dict[str, Any] = {
        "pool": s._pool,
        "evictable": s._evictable_size,
        "evict": s.cache.evict,
        "capacity": s.capacity,
        "page": s.page_size,
        "vclock": VirtualClock,
        "tracker": NewTokenRatioTracker,
        "outcome": JumpOutcome,
        "by_length": FINISHED_BY_LENGTH,
        "globals": vars(fast_scheduler),
        "retire_fn": retire.retire,
        "plain_outcome": True,
        "defers": s.defers,
        "preempts": s.config.enable_priority_preemption,
        "charges": s._charges,
        "may_jump_here": True,
        "decay_here": True,
        "retire_here": True,
    }
    args.update(flags)
    s._decode_run = cast(Any, core()).DecodeRun(**args)


def _snapshot(s: Any, out: Any) -> Any:
    """What a round leaves, compared by ``repr`` (a float and an int differ)."""
    reqs = list(s._by_rid.values()) + (list(out.finished) if out is not None else [])
    done: Any = None
    if out is not None:
        p = out.pending
        done = (out.mode, repr(out.duration_s), out.batch_size, out.num_steps, out.retracted)
        done += ([r.rid for r in out.finished], [r.rid for r in p[0]], p[2], p[3])
    s.sync_running()
    return (
        repr(vars(s.stats)),
        repr(vars(s.clock)),
        repr(vars(s.ratio)),
        s.batch_is_full,
        [r.rid for r in s.running],
        sorted(s._by_rid),
        s.allocator.available_size(),
        s.cache.evictable_size(),
        [(r.rid, r.output_ids, r.times.token_times, r.kv_len, repr(r.times.finish)) for r in reqs],
        [(r.rid, repr(r.finish)) for r in reqs],
        done,
    )


def _both(setup: Setup, horizon: float | None = None, outs: tuple[int, ...] = (40, 30)) -> Any:
    """The native round and the reference on two identical schedulers after ``setup``: their
    snapshots must agree; returns the native one's (scheduler, outcome)."""
    new, ref = _scheduler(outs), _scheduler(outs)
    for s in (new, ref):
        setup(s)
    got = new._jump(new.batch.columns(), None, horizon)
    want = _reference_round(ref, horizon)
    assert (got is None) == (want is None)
    assert _snapshot(new, got) == _snapshot(ref, want)
    return new, got


def _nothing(s: Any) -> None:
    return None


def test_a_plain_jump_finishes_the_shorter_request_natively() -> None:
    s, out = _both(_nothing)
    assert out.num_steps == 29 and [r.rid for r in out.finished] == ["r1"]
    assert s.stats.decode_steps >= 29 and type(s.stats.peak_kv_usage) is float


def test_a_horizon_cuts_the_jump_and_nothing_finishes() -> None:
    def full(s: Any) -> None:
        s.batch_is_full = True  # kept: nobody finished

    s, out = _both(full, horizon=0.0)
    assert out.num_steps == 1 and not out.finished and s.batch_is_full


def test_a_finished_request_frees_the_batch() -> None:
    def full(s: Any) -> None:
        s.batch_is_full = True

    s, out = _both(full)
    assert out.finished and s.batch_is_full is False


def _clock(make: Callable[[Any], Any]) -> Setup:
    def setup(s: Any) -> None:
        s.clock = make(s.clock.now())

    return setup


class _Subclock(VirtualClock):
    """Not exactly a VirtualClock: moved through its own jump_to (counted)."""

    def jump_to(self, t: float) -> None:
        self.jumps = getattr(self, "jumps", 0) + 1
        super().jump_to(t)


class _Manual:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.mark.parametrize(
    "setup",
    [
        _clock(_Subclock),  # not exactly a VirtualClock: _advance_to (then its jump_to)
        _clock(_Manual),  # another clock: _advance_to, its advance(end - t0)
        _clock(lambda t: VirtualClock(5)),  # an int time: floats from there
        _clock(lambda t: VirtualClock(10**20)),  # an int the end equals: kept, an int
        _clock(lambda t: VirtualClock(1e20)),  # the end is the time: no move
    ],
)
def test_the_clock_moves_as_jump_to_or_advance_to_moves_it(setup: Setup) -> None:
    _both(setup)


def test_a_clock_subclass_moves_through_its_jump_to() -> None:
    s, _ = _both(_clock(_Subclock))
    assert s.clock.jumps == 1


def test_an_int_time_the_end_equals_is_kept() -> None:
    s, out = _both(_clock(lambda t: VirtualClock(10**20)))
    assert type(s.clock._t) is int and out.duration_s == 0.0


class _Counting(NewTokenRatioTracker):
    def decay_steps(self, n: int = 1) -> None:
        self.calls = getattr(self, "calls", 0) + 1
        super().decay_steps(n)


def _ratio(change: Callable[[Any], None]) -> Setup:
    def setup(s: Any) -> None:
        change(s)

    return setup


def _subclassed(s: Any) -> None:
    r = _Counting(s.config)
    r.current = 0.55
    s.ratio = r


@pytest.mark.parametrize(
    "change",
    [
        lambda s: setattr(s.ratio, "current", 0.5),  # floats: natively
        lambda s: setattr(s.ratio, "current", 1),  # an int: its decay_steps
        lambda s: setattr(s.ratio, "min", 0),  # an int floor: its decay_steps
        lambda s: setattr(s.ratio, "decay", 0),  # an int decay: its decay_steps
        _subclassed,  # another class: its decay_steps
    ],
)
def test_the_ratio_decays_as_decay_steps(change: Callable[[Any], None]) -> None:
    _both(_ratio(change))


def test_a_tracker_subclass_decays_through_its_method() -> None:
    s, _ = _both(_subclassed)
    assert s.ratio.calls == 1


def test_an_overridden_decay_is_called() -> None:
    calls: list[int] = []

    def setup(s: Any) -> None:
        _rerun(s, decay_here=False)
        s._decay = lambda k: calls.append(k)  # the instance's: what the call looks up

    new = _scheduler()
    setup(new)
    before = new.ratio.current
    out = new._jump(new.batch.columns(), None, None)
    assert calls == [out.num_steps] and new.ratio.current == before


@pytest.mark.parametrize(
    "setup",
    [
        lambda s: setattr(s.stats, "peak_kv_usage", 1),  # above: kept, an int
        lambda s: setattr(s.stats, "peak_kv_usage", 0),  # below: the float usage
        lambda s: setattr(s.stats, "decode_steps", 1.5),  # a float count adds as a float
        lambda s: setattr(s.stats, "busy_s", 2),  # int sums: floats after
    ],
)
def test_the_statistics_are_the_references(setup: Setup) -> None:
    _both(setup)


def test_a_peak_above_the_usage_stays_the_same_object() -> None:
    s, _ = _both(lambda s: setattr(s.stats, "peak_kv_usage", 1))
    assert type(s.stats.peak_kv_usage) is int


def test_a_capacity_past_exact_doubles_divides_as_python() -> None:
    """The usage's (cap - room) / cap where cap is not an exact double: Python's division."""

    def huge(s: Any) -> None:
        s.capacity = 2**60 + 1  # the reference reads it; the native round holds it
        _rerun(s, capacity=s.capacity)

    s, _ = _both(huge)
    assert 0.99 < s.stats.peak_kv_usage < 1.0
    rooms = [room for room in range(20_000, 22_000) if _doubles(2**60 + 1, room) is not None]
    assert rooms  # some of them round differently as doubles
    for room in [*rooms[:20], 0, 5, 2**60 + 1]:
        _rerun(s, capacity=2**60 + 1, evictable=lambda r=room: r - s._pool.available_size())
        assert s._decode_run.usage() == (2**60 + 1 - room) / (2**60 + 1)


def _doubles(cap: int, room: int) -> float | None:
    """The doubles' quotient where it is not Python's."""
    got = float(cap - room) / float(cap)
    return got if got != (cap - room) / cap else None


@pytest.mark.parametrize("room", [0, 1, 7, 19_999, 20_000, -3])
def test_the_usage_of_exact_doubles_is_their_quotient(room: int) -> None:
    s = _scheduler()
    _rerun(s, evictable=lambda: room - s._pool.available_size())
    got = s._decode_run.usage()
    assert type(got) is float and got == (s.capacity - room) / s.capacity


def _busy(s: Any) -> None:
    s.batch_is_full = True
    s.queue.reqs.append(s.running[0])  # something waits (only its truth is read)


class _Preempting:
    """A config whose ``enable_priority_preemption`` is True (the rest read through)."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg

    enable_priority_preemption = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


@pytest.mark.parametrize(
    ("setup", "preempts", "steps"),
    [
        (lambda s: setattr(s, "chunked_req", s.running[0]), False, 1),  # a chunked request
        (lambda s: s.queue.reqs.append(s.running[0]), False, 1),  # a queue, room in the batch
        (_busy, False, 29),  # a queue, a full batch: no admission
        (_busy, True, 1),  # ... unless it preempts
    ],
)
def test_may_jump_is_asked_in_the_call(setup: Setup, preempts: bool, steps: int) -> None:
    new, ref = _scheduler(), _scheduler()
    for s in (new, ref):
        setup(s)
    if preempts:
        _rerun(new, preempts=True)
        ref.config = _Preempting(ref.config)  # what the reference's _may_jump reads
    got = new._jump(new.batch.columns(), None, None)
    want = _reference_jump(ref, ref.batch.columns(), ref._may_jump(), None)
    assert got.num_steps == want.num_steps == steps


def test_an_overridden_may_jump_is_called() -> None:
    s = _scheduler()
    _rerun(s, may_jump_here=False)
    asked: list[bool] = []

    def no() -> bool:
        asked.append(False)
        return False

    s._may_jump = no
    out = s._jump(s.batch.columns(), None, None)
    assert asked == [False] and out.num_steps == 1


def test_a_given_free_is_not_asked_again() -> None:
    s = _scheduler()
    s._may_jump = lambda: pytest.fail("asked")
    assert s._jump(s.batch.columns(), False, None).num_steps == 1


@pytest.mark.parametrize("why", ["defers", "can_stop"])
def test_no_deferral_or_a_row_that_can_stop_changes_nothing(why: str) -> None:
    s = _scheduler()
    if why == "defers":
        _rerun(s, defers=False)
    else:
        s.running[1].sampling = SamplingParams(max_new_tokens=30, stop_token_ids=(-1,))
        s.batch.cols = None  # rebuilt from the requests: the row can stop
    cols = s.batch.columns()
    before = _snapshot(s, None)
    assert s._jump(cols, True, None) is None
    assert not s.unsettled and _snapshot(s, None) == before


def test_a_step_that_does_not_fit_changes_nothing() -> None:
    def full(s: Any) -> None:
        s.cache.evict(s.cache.evictable_size())
        s._held = s.allocator.alloc(s.allocator.available_size())

    s, out = _both(full)
    assert out is None and not s.unsettled


def test_a_failed_reservation_raises_the_schedulers_error() -> None:
    s = _scheduler()
    s.cache.evict(s.cache.evictable_size())
    s._held = s.allocator.alloc(s.allocator.available_size())
    _rerun(s, evictable=lambda: 10**6, evict=lambda n: None)  # room it does not have
    with pytest.raises(IntegrityError, match="KV allocation of 2 slots failed"):
        s._jump(s.batch.columns(), False, None)  # one step: a slot each


def test_fairs_charge_comes_before_the_retire() -> None:
    seen: list[Any] = []

    def charging(s: Any) -> None:
        _rerun(s, charges=True)
        s._charge_decode = lambda reqs, k: seen.append(([r.rid for r in s.running], k))

    s = _scheduler()
    charging(s)
    out = s._jump(s.batch.columns(), None, None)
    assert seen == [(["r0", "r1"], out.num_steps)] and [r.rid for r in s.running] == ["r0"]


def test_fairs_decode_charges_are_the_references() -> None:
    new, ref = _scheduler(policy="fair"), _scheduler(policy="fair")
    assert new._charges
    got = new._jump(new.batch.columns(), None, None)
    want = _reference_round(ref, None)
    assert _snapshot(new, got) == _snapshot(ref, want)
    assert new.queue.fair.counters == ref.queue.fair.counters


def test_an_overridden_retire_is_called() -> None:
    s = _scheduler()
    _rerun(s, retire_here=False)
    seen: list[list[int]] = []
    s._retire_finished = lambda maybe, out: seen.append(list(maybe))
    out = s._jump(s.batch.columns(), None, None)
    assert seen == [[1]] and not out.finished and len(s.running) == 2


class _Seqs(dict[Any, Any]):
    """Not exactly a dict: the native retire declines, the Python one runs."""


def test_a_declined_retire_falls_back_to_python() -> None:
    def setup(s: Any) -> None:
        s.queue._seq_of = _Seqs(s.queue._seq_of)

    s, out = _both(setup)
    assert [r.rid for r in out.finished] == ["r1"] and [r.rid for r in s.running] == ["r0"]


def test_decode_tokens_without_columns_or_rows() -> None:
    s = _scheduler()
    s.batch.cols = None
    want = s.batch.columns().decode_tokens(2**63 - 1)
    s.batch.cols = None
    assert s.batch.decode_tokens(2**70) == want and s.batch.cols is not None
    assert s.batch.decode_tokens(5) == (10, 0)
    empty = type(s.batch)(False, s.settle)
    assert empty.decode_tokens(5) == (0, 0) and empty.cols is None


def _fields(out: Any) -> list[Any]:
    return [repr(getattr(out, f.name)) for f in dataclasses.fields(out)]


@pytest.mark.parametrize("plain", [True, False])
def test_an_outcome_built_without_its_init_is_the_classs(plain: bool) -> None:
    s = _scheduler()
    _rerun(s, plain_outcome=plain)
    got = s._decode_run.make_outcome(0.25, 3, 7)
    want = JumpOutcome("decode", 0.25, 3, 7)
    assert type(got) is JumpOutcome and _fields(got) == _fields(want)
    assert got.finished is not got.retracted and got.finished is not got._tokens


@dataclasses.dataclass(slots=True)
class _Posted(JumpOutcome):
    def __post_init__(self) -> None:
        self.pending = ("posted",)


@dataclasses.dataclass(slots=True)
class _More(JumpOutcome):
    extra: int = 5


def test_only_the_plain_outcome_class_is_built_without_its_init() -> None:
    from radixsched.native.scheduler import _plain_outcome

    assert _plain_outcome(JumpOutcome)
    assert not _plain_outcome(_Posted) and not _plain_outcome(_More)
    assert not _plain_outcome(SamplingParams) and not _plain_outcome(int)
    s = _scheduler()
    _rerun(s, outcome=_Posted, plain_outcome=_plain_outcome(_Posted))
    assert s._decode_run.make_outcome(0.5, 1, 1).pending == ("posted",)  # its __init__ ran


def test_a_replaced_module_retire_is_called_as_retire_finished_calls_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``native.scheduler.retire`` replaced (a test counting its calls): the jump's retire goes
    through ``_retire_finished`` and it, as the Python did, with the same outcome."""
    seen: list[bool] = []
    real = retire.retire

    def counting(sched: Any, maybe: list[int], out: Any) -> bool:
        got = real(sched, maybe, out)
        seen.append(got)
        return got

    monkeypatch.setattr(fast_scheduler, "retire", counting)
    _, out = _both(_nothing)
    assert seen == [True, True]  # the native round's, then the reference's
    assert [r.rid for r in out.finished] == ["r1"]

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest

from radixsched.cluster.delayer import (
    Compat,
    DelayerConfig,
    DelayReason,
    DelayState,
    LocalAllGather,
    LockstepRunner,
    PrefillDelayer,
    PrefillStatus,
    RankInfo,
    RecentPrefillBatchSizeTracker,
    negotiate,
)

MRR = 8
T0 = 100.0
NOW = 107.5

D = DelayReason


def info(
    prefillable: bool = True,
    wm: bool = False,
    running: int = 0,
    bs: int = 0,
    q: int = 0,
    expired: bool = False,
) -> RankInfo:
    return RankInfo(prefillable, wm, running, bs, q, expired)


# Slot condition: MRR - R < B.
SLOT = info(running=6, bs=4)  # 2 < 4: holds
CALM = info(running=2, bs=4)  # 6 < 4: does not
IDLE = info(prefillable=False)
# Queue condition with ratio 0.5: R=4 -> queue_min = min(2, B=4) = 2; holds when Q < 2.
QUEUE = info(running=4, bs=4, q=1)
QUEUE_OK = info(running=4, bs=4, q=2)

# (case, infos, prev, skip_first, config overrides,
#  radixsched expectation, sglang expectation), expectation = (reason, delayed_count | None,
#  skip_first after). delayed_count is the new state's count (None = state reset).
Expect = tuple[DelayReason, int | None, bool]
CASES: list[tuple[str, list[RankInfo], DelayState | None, bool, dict[str, Any], Expect, Expect]] = [
    # ---- none ----
    ("none", [IDLE, IDLE], None, True, {}, (D.NONE, None, True), (D.NONE, None, True)),
    (
        "none resets a streak without re-arming",
        [IDLE, IDLE],
        DelayState(3, T0),
        False,
        {},
        (D.NONE, None, False),
        (D.NONE, None, False),
    ),
    # ---- all: watermark ----
    (
        "all watermark beats slot",
        [info(wm=True, running=6, bs=4), SLOT],
        None,
        False,
        {},
        (D.TOKEN_WATERMARK, None, False),
        (D.TOKEN_WATERMARK, None, False),
    ),
    (
        "all watermark ends a streak",
        [info(wm=True), SLOT],
        DelayState(3, T0),
        False,
        {},
        (D.TOKEN_WATERMARK, None, True),
        (D.TOKEN_WATERMARK, None, False),
    ),
    # ---- all: no condition ----
    ("all calm", [CALM, CALM], None, False, {}, (D.NO_WAIT, None, False), (D.NO_WAIT, None, False)),
    (
        "all calm after a streak",
        [CALM, CALM],
        DelayState(2, T0),
        False,
        {},
        (D.WAIT_SUCCESS, None, True),
        (D.WAIT_SUCCESS, None, False),
    ),
    # ---- all: slot condition ----
    (
        "all slot, exemption armed",
        [SLOT, CALM],
        None,
        True,
        {},
        (D.NO_WAIT, None, False),
        (D.NO_WAIT, None, False),
    ),
    ("all slot delays", [SLOT, CALM], None, False, {}, (D.DELAY, 1, False), (D.DELAY, 1, False)),
    (
        "all slot, last delay before the pass cap",
        [SLOT, SLOT],
        DelayState(28, T0),
        False,
        {},
        (D.DELAY, 29, False),
        (D.DELAY, 29, False),
    ),
    (
        "all slot, pass cap",
        [SLOT, SLOT],
        DelayState(29, T0),
        False,
        {},
        (D.WAIT_TIMEOUT, None, True),
        (D.WAIT_TIMEOUT, None, False),
    ),
    (
        "all slot, pass cap of 1 never delays",
        [SLOT],
        None,
        False,
        {"max_delay_passes": 1},
        (D.WAIT_TIMEOUT, None, False),
        (D.WAIT_TIMEOUT, None, False),
    ),
    (
        "all slot, ms cap expired",
        [SLOT, info(running=6, bs=4, expired=True)],
        DelayState(3, T0),
        False,
        {},
        (D.WAIT_TIMEOUT, None, True),
        (D.DELAY, 4, False),
    ),
    # ---- all: queue condition ----
    (
        "all queue delays",
        [QUEUE, QUEUE],
        None,
        False,
        {"queue_min_ratio": 0.5},
        (D.DELAY, 1, False),
        (D.DELAY, 1, False),
    ),
    (
        "all queue off without the ratio",
        [QUEUE, QUEUE],
        None,
        False,
        {},
        (D.NO_WAIT, None, False),
        (D.NO_WAIT, None, False),
    ),
    (
        "all queue satisfied",
        [QUEUE_OK, QUEUE_OK],
        DelayState(1, T0),
        False,
        {"queue_min_ratio": 0.5},
        (D.WAIT_SUCCESS, None, True),
        (D.WAIT_SUCCESS, None, False),
    ),
    (
        "all queue, ms cap expired",
        [QUEUE, info(running=4, bs=4, q=1, expired=True)],
        DelayState(3, T0),
        False,
        {"queue_min_ratio": 0.5},
        (D.WAIT_TIMEOUT, None, True),
        (D.WAIT_SUCCESS, None, False),  # sglang: the queue condition is cancelled
    ),
    (
        "all queue, queue_min rounds to 0",
        [info(running=1, bs=4, q=0)],
        None,
        False,
        {"queue_min_ratio": 0.5},
        (D.NO_WAIT, None, False),
        (D.NO_WAIT, None, False),
    ),
    (
        "all queue, nothing running",
        [info(running=0, bs=4, q=0)],
        None,
        False,
        {"queue_min_ratio": 0.5},
        (D.NO_WAIT, None, False),
        (D.NO_WAIT, None, False),
    ),
    (
        "all queue capacity from prefill_max_requests (min 1, Q=1 enough)",
        [info(running=4, bs=4, q=1)],
        None,
        False,
        {"queue_min_ratio": 0.5, "prefill_max_requests": 1},
        (D.NO_WAIT, None, False),
        (D.NO_WAIT, None, False),
    ),
    (
        "all queue capacity from prefill_max_requests (Q=0 delays)",
        [info(running=4, bs=4, q=0)],
        None,
        False,
        {"queue_min_ratio": 0.5, "prefill_max_requests": 1},
        (D.DELAY, 1, False),
        (D.DELAY, 1, False),
    ),
    # ---- mixed ----
    (
        "mixed calm",
        [CALM, IDLE],
        None,
        False,
        {},
        (D.NO_WAIT, None, False),
        (D.DELAY, 1, False),
    ),
    (
        "mixed calm after a streak",
        [CALM, IDLE],
        DelayState(4, T0),
        False,
        {},
        (D.WAIT_SUCCESS, None, True),
        (D.DELAY, 5, False),
    ),
    (
        "mixed slot (R from the idle rank)",
        [CALM, info(prefillable=False, running=6)],
        None,
        False,
        {},
        (D.DELAY, 1, False),
        (D.DELAY, 1, False),
    ),
    (
        "mixed slot, exemption armed",
        [SLOT, IDLE],
        None,
        True,
        {},
        (D.NO_WAIT, None, False),
        (D.DELAY, 1, True),  # sglang: exemption not consulted in mixed
    ),
    (
        "mixed watermark",
        [info(wm=True), IDLE],
        DelayState(2, T0),
        False,
        {},
        (D.TOKEN_WATERMARK, None, True),
        (D.TOKEN_WATERMARK, None, False),
    ),
    (
        "mixed, pass cap, calm",
        [CALM, IDLE],
        DelayState(29, T0),
        False,
        {},
        (D.WAIT_SUCCESS, None, True),
        (D.WAIT_TIMEOUT, None, False),
    ),
    (
        "mixed, pass cap, slot",
        [SLOT, IDLE],
        DelayState(29, T0),
        False,
        {},
        (D.WAIT_TIMEOUT, None, True),
        (D.WAIT_TIMEOUT, None, False),
    ),
    (
        "mixed slot, ms cap expired",
        [SLOT, info(prefillable=False, expired=True)],
        DelayState(3, T0),
        False,
        {},
        (D.WAIT_TIMEOUT, None, True),
        (D.DELAY, 4, False),
    ),
    (
        "mixed, the other rank decodes: wait for it (no exemption)",
        [CALM, info(prefillable=False, running=2)],
        None,
        True,
        {},
        (D.DELAY, 1, True),
        (D.DELAY, 1, True),
    ),
    (
        "mixed, the other rank decodes, pass cap",
        [CALM, info(prefillable=False, running=2)],
        DelayState(29, T0),
        False,
        {},
        (D.WAIT_TIMEOUT, None, True),
        (D.WAIT_TIMEOUT, None, False),
    ),
    (
        "mixed, the other rank decodes, ms cap expired",
        [CALM, info(prefillable=False, running=2, expired=True)],
        DelayState(3, T0),
        False,
        {},
        (D.WAIT_TIMEOUT, None, True),
        (D.DELAY, 4, False),
    ),
    (
        "mixed queue",
        [QUEUE, IDLE],
        None,
        False,
        {"queue_min_ratio": 0.5},
        (D.DELAY, 1, False),
        (D.DELAY, 1, False),
    ),
]


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
@pytest.mark.parametrize(
    ("case", "infos", "prev", "skip", "overrides", "radix", "sglang"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_negotiation_table(
    compat: Compat,
    case: str,
    infos: list[RankInfo],
    prev: DelayState | None,
    skip: bool,
    overrides: dict[str, Any],
    radix: Expect,
    sglang: Expect,
) -> None:
    cfg = DelayerConfig(compat=compat, **overrides)
    d = negotiate(infos, prev, skip, config=cfg, max_running_requests=MRR, now=NOW)
    reason, count, skip_after = radix if compat == "radixsched" else sglang
    v = d.verdict
    assert v.reason is reason, case
    assert v.allow == (reason is not D.DELAY)
    n_pref = sum(i.prefillable for i in infos)
    status = (
        PrefillStatus.NONE
        if n_pref == 0
        else PrefillStatus.ALL
        if n_pref == len(infos)
        else PrefillStatus.MIXED
    )
    assert v.status is status
    assert (None if d.state is None else d.state.delayed_count) == count
    assert d.skip_first is skip_after
    if d.state is not None:
        # A streak keeps its first delayed pass's time.
        assert d.state.start_time == (NOW if prev is None else prev.start_time)
    if v.allow and prev is not None and reason is not D.NONE:
        assert (v.waited_passes, v.waited_s) == (prev.delayed_count, NOW - T0)
    else:
        assert (v.waited_passes, v.waited_s) == (0, 0.0)


def test_negotiate_needs_infos() -> None:
    with pytest.raises(ValueError):
        negotiate([], None, True, config=DelayerConfig(), max_running_requests=8, now=0.0)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        DelayerConfig(max_delay_passes=0)
    with pytest.raises(ValueError):
        DelayerConfig(max_delay_ms=-1)
    with pytest.raises(ValueError):
        DelayerConfig(queue_min_ratio=-0.1)
    assert DelayerConfig().delay_ms_cap == 5000.0
    assert DelayerConfig(max_delay_ms=10).delay_ms_cap == 10


# ---- the delayer over time ------------------------------------------------------------------


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FixedPeers:
    """An all-gather whose other ranks always report the same values."""

    def __init__(self, *peers: RankInfo) -> None:
        self.peers = peers
        self.sent: list[RankInfo] = []

    @property
    def world_size(self) -> int:
        return 1 + len(self.peers)

    def all_gather(self, rank: int, info: RankInfo) -> tuple[RankInfo, ...]:
        self.sent.append(info)
        return (info, *self.peers)


def make(compat: Compat, clock: Clock, gather: Any = None, **cfg: Any) -> PrefillDelayer:
    return PrefillDelayer(
        DelayerConfig(compat=compat, **cfg),
        max_running_requests=MRR,
        clock=clock,
        all_gather=gather,
    )


def run_passes(delayer: PrefillDelayer, clock: Clock, n: int, dt: float = 0.0) -> list[D]:
    out = []
    for _ in range(n):
        out.append(delayer.negotiate(True, 6, 4, 1, 0.9).reason)
        clock.t += dt
    return out


def test_persistent_slot_pressure_sglang_exempts_once() -> None:
    clock = Clock()
    d = make("sglang", clock)
    seq = run_passes(d, clock, 61)
    assert seq[0] is D.NO_WAIT
    assert seq[1:30] == [D.DELAY] * 29 and seq[30] is D.WAIT_TIMEOUT
    assert seq[31:60] == [D.DELAY] * 29 and seq[60] is D.WAIT_TIMEOUT
    assert d.stats.wait_passes == [29, 29]


def test_persistent_slot_pressure_radixsched_rearms_exemption() -> None:
    clock = Clock()
    d = make("radixsched", clock)
    seq = run_passes(d, clock, 62)
    assert seq[0] is D.NO_WAIT
    assert seq[1:30] == [D.DELAY] * 29 and seq[30] is D.WAIT_TIMEOUT
    assert seq[31] is D.NO_WAIT  # re-armed by the release
    assert seq[32:61] == [D.DELAY] * 29 and seq[61] is D.WAIT_TIMEOUT
    assert d.stats.verdicts[D.DELAY] == 58


def test_wall_clock_cap_releases_slot_delay_only_in_radixsched() -> None:
    cases: list[tuple[Compat, int]] = [("radixsched", 4), ("sglang", 30)]
    for compat, expected_release in cases:
        clock = Clock()
        d = make(compat, clock, max_delay_ms=3000)
        seq = run_passes(d, clock, 31, dt=1.0)
        # Pass 0 exempt, delays start at t=1; radixsched releases at t=4 (3 s elapsed).
        assert seq.index(D.WAIT_TIMEOUT) == expected_release, compat
    clock = Clock()
    d = make("radixsched", clock, max_delay_ms=3000)
    run_passes(d, clock, 5, dt=1.0)
    assert d.stats.wait_passes == [3] and d.stats.wait_seconds == [3.0]


def test_timeout_flag_in_local_info() -> None:
    clock = Clock(10.0)
    d = make("radixsched", clock)
    assert not d.local_info(True, 0, 0, 0, 0.5).timeout_expired  # no streak
    d.state = DelayState(1, 10.0)
    clock.t = 14.999
    assert not d.local_info(True, 0, 0, 0, 0.5).timeout_expired
    clock.t = 15.0
    assert d.local_info(True, 0, 0, 0, 0.5).timeout_expired
    s = make("sglang", clock)
    s.state = DelayState(1, 10.0)
    assert not s.local_info(True, 0, 0, 0, 0.5).timeout_expired  # queue trigger off
    q = make("sglang", clock, queue_min_ratio=0.2)
    q.state = DelayState(1, 10.0)
    assert q.local_info(True, 0, 0, 0, 0.5).timeout_expired


def test_watermark_force_only_for_a_prefillable_rank_under_the_mark() -> None:
    d = make("radixsched", Clock(), token_usage_low_watermark=0.3)
    assert d.local_info(True, 0, 0, 0, 0.29).watermark_force
    assert not d.local_info(True, 0, 0, 0, 0.3).watermark_force
    assert not d.local_info(False, 0, 0, 0, 0.1).watermark_force
    assert not make("radixsched", Clock()).local_info(True, 0, 0, 0, 0.0).watermark_force


# ---- the per-pass executor -----------------------------------------------------------------


def test_pass_negotiates_once_and_caches() -> None:
    gather = FixedPeers(CALM)
    d = make("radixsched", Clock(), gather)
    p = d.begin_pass(token_usage=0.5, running_batch=2, waiting_queue_len=3)
    assert p.negotiate(True)
    assert p.negotiate(False)  # cached, no second collective
    assert len(gather.sent) == 1
    assert p.finalize(0) == 3  # estimate: min(max(3, 1), max(8 - 2, 1))
    assert len(gather.sent) == 1
    assert d.tracker.max_bs == 3
    with pytest.raises(RuntimeError):
        p.finalize(1)
    with pytest.raises(RuntimeError):
        p.negotiate(True)


def test_pass_estimate_uses_free_slots_and_actual_size_wins() -> None:
    d = make("radixsched", Clock(), FixedPeers(CALM))
    p = d.begin_pass(token_usage=0.5, running_batch=7, waiting_queue_len=0)
    p.negotiate(True)
    assert p.attempted_bs == 1
    assert p.finalize(5) == 5
    assert d.tracker.max_bs == 5
    p2 = d.begin_pass(token_usage=0.5, running_batch=7, waiting_queue_len=0)
    assert p2.max_prefill_bs == 5


@pytest.mark.parametrize(
    ("compat", "sent"),
    [("sglang", (False, False, 0, 0, 0, False)), ("radixsched", (False, False, 5, 2, 9, False))],
)
def test_finalize_joins_the_collective_when_nobody_negotiated(
    compat: Compat, sent: tuple[Any, ...]
) -> None:
    gather = FixedPeers(IDLE)
    d = make(compat, Clock(), gather)
    d.tracker.observe_attempt(2)
    p = d.begin_pass(token_usage=0.5, running_batch=5, waiting_queue_len=9)
    assert p.finalize(0) == 0
    assert tuple(gather.sent[0]) == sent
    assert p.verdict is not None and p.verdict.reason is D.NONE
    assert d.tracker.max_bs == 2  # nothing observed: the window does not age


def test_vetoed_pass_feeds_the_estimate() -> None:
    d = make("radixsched", Clock(), FixedPeers(SLOT))
    d.skip_first = False
    p = d.begin_pass(token_usage=0.9, running_batch=6, waiting_queue_len=4)
    assert not p.negotiate(True)
    assert p.finalize(0) == 2  # min(4, 8 - 6)
    assert d.tracker.max_bs == 2


def test_tracker() -> None:
    t = RecentPrefillBatchSizeTracker(window=2)
    assert t.max_bs == 0
    assert t.observe_attempt(5) == 5
    assert t.observe_attempt(1) == 5
    assert t.observe_attempt(2) == 2  # 5 aged out
    for bad in (0, -1):
        with pytest.raises(ValueError):
            t.observe_attempt(bad)
    with pytest.raises(ValueError):
        RecentPrefillBatchSizeTracker(window=0)


# ---- in-process all-gather ------------------------------------------------------------------


@pytest.mark.parametrize("compat", ["radixsched", "sglang"])
def test_lockstep_ranks_agree(compat: Compat) -> None:
    world = 3
    gather = LocalAllGather(world, timeout_s=10)
    clock = Clock()
    delayers = [
        PrefillDelayer(
            DelayerConfig(compat=compat),
            max_running_requests=MRR,
            clock=clock,
            all_gather=gather,
            rank=r,
        )
        for r in range(world)
    ]
    # Rank r has work on passes where (pass + r) % 3 != 0; rank 0 runs a busy batch.
    with LockstepRunner(gather) as runner:
        for step in range(40):

            def one(r: int, step: int = step) -> tuple[DelayReason, DelayState | None, bool]:
                d = delayers[r]
                p = d.begin_pass(
                    token_usage=0.8, running_batch=6 if r == 0 else 1, waiting_queue_len=2
                )
                prefillable = (step + r) % 3 != 0
                allowed = p.negotiate(True) if prefillable else False
                p.finalize(2 if allowed and prefillable else 0)
                assert p.verdict is not None
                return p.verdict.reason, d.state, d.skip_first

            results = runner.run([functools.partial(one, r) for r in range(world)])
            assert all(x == results[0] for x in results), (step, results)
            clock.t += 0.01


def test_local_all_gather_orders_by_rank_and_is_reusable() -> None:
    gather = LocalAllGather(2, timeout_s=5)
    with LockstepRunner(gather) as runner:
        for k in range(3):
            out = runner.run(
                [
                    functools.partial(gather.all_gather, 0, info(running=k)),
                    functools.partial(gather.all_gather, 1, info(running=10 + k)),
                ]
            )
            assert out[0] == out[1]
            assert [i.running_batch for i in out[0]] == [k, 10 + k]
    assert LocalAllGather(1).all_gather(0, CALM) == (CALM,)
    with pytest.raises(ValueError):
        LocalAllGather(2).all_gather(2, CALM)


def test_failing_rank_aborts_peers_fast() -> None:
    gather = LocalAllGather(2, timeout_s=30)

    def bad() -> RankInfo:
        raise KeyError("boom")

    start = time.monotonic()
    with LockstepRunner(gather) as runner, pytest.raises(KeyError):
        runner.run([lambda: gather.all_gather(0, CALM)[0], bad])
    assert time.monotonic() - start < 5


def test_all_gather_timeout_and_double_join() -> None:
    gather = LocalAllGather(2, timeout_s=0.05)
    with pytest.raises(RuntimeError, match=r"ranks \[1\]"):
        gather.all_gather(0, CALM)
    g2 = LocalAllGather(2, timeout_s=2)
    errors: list[BaseException] = []

    def join() -> None:
        try:
            g2.all_gather(0, CALM)
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=join)
    t.start()
    time.sleep(0.05)
    with pytest.raises(RuntimeError, match="twice"):
        g2.all_gather(0, CALM)
    g2.all_gather(1, CALM)
    t.join()
    assert not errors


def test_gate_form_arguments_and_gate_for() -> None:
    from radixsched.adder import PrefillGate

    gather = FixedPeers(CALM)
    d = make("radixsched", Clock(), gather)

    class View:
        def __init__(self) -> None:
            self.waiting = [object(), object(), object()]

        def kv_usage(self) -> float:
            return 0.25

        def num_running(self) -> int:
            return 4

    p = d.gate_for(View())
    gate: PrefillGate = p  # the adder's protocol
    assert (p.token_usage, p.running_batch, p.waiting_queue_len) == (0.25, 4, 3)
    # Explicit arguments win over the pass-start snapshot, in the estimate and the collective.
    assert gate.negotiate(True, 7, 5)
    assert p.attempted_bs == 1  # min(max(5, 1), max(8 - 7, 1))
    assert gather.sent[0].running_batch == 7 and gather.sent[0].waiting_queue_len == 5
    assert p.finalize(0) == 1

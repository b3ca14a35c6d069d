"""Open-loop arrivals over co-located replicas: a discrete event loop.

Replicas advance independently (each has its own virtual clock, radix cache, KV pool and
scheduler); the loop always advances whichever replica is furthest behind, and delivers an
arrival (routing it across replicas) as soon as no replica still has a step starting before it:

* a replica steps while its clock is strictly before the next arrival; arrivals at or before a
  replica's clock are delivered first (the same order a real server's loop sees);
* a step is one forward pass, or several decode steps jumped over at once when nothing but
  lengths can change before the next arrival (``Scheduler.step(horizon)``);
* idle replicas jump to the next arrival.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from radixsched.native import core
from radixsched.native.arrive import LeanReads, lean_reads
from radixsched.request import Req
from radixsched.results.series import TimeSeries
from radixsched.scheduler import StepOutcome
from radixsched.sim.deploy.replicas import (
    Replica,
    deliver,
    deliver_batch,
    sample_series,
    step_earliest,
)
from radixsched.sim.workloads.deferred import ArrivingRequests


def run_open_loop(
    replicas: Sequence[Replica],
    reqs: Sequence[Req],
    router: Any,
    series: TimeSeries,
    on_progress: Callable[[int, int], None] | None,
    check_integrity: bool,
) -> None:
    if len(replicas) == 1 and router is None:
        _run_one_replica(replicas[0], reqs, series, on_progress, check_integrity)
        return
    n = len(reqs)
    i = 0
    done = 0
    last_t = 0.0
    while True:
        ta = reqs[i].arrival_time if i < n else math.inf
        stepped = step_earliest(replicas, ta, check_integrity)
        if stepped is not None:
            rep, out, start = stepped
            finished = len(out.finished)
            if router is not None:
                for r in out.finished:
                    router.on_finish(r, rep.idx)
            last_t = max(last_t, start)
            sample_series(series, last_t, replicas)
            if finished and on_progress is not None:
                done += finished
                on_progress(done, n)
            continue
        if i >= n:
            break
        for idle in replicas:
            if idle.sched.is_idle:
                idle.clock.jump_to(ta)
        deliver(reqs[i], replicas, router, ta)
        i += 1
    if on_progress is not None:
        on_progress(n, n)


def _run_one_replica(
    rep: Replica,
    reqs: Sequence[Req],
    series: TimeSeries,
    on_progress: Callable[[int, int], None] | None,
    check_integrity: bool,
) -> None:
    """``run_open_loop`` for one replica without a router (the common case, kept lean: it
    runs once per scheduler step). Steps until the next arrival, then delivers it with every
    later arrival already due (at or before the replica's clock: single deliveries would take
    no step between them, and an idle replica's jump to each would not move its clock)."""
    lean = lean_reads(rep.sched)
    if lean is not None:
        _run_lean(rep, reqs, series, on_progress, check_integrity, lean)
        return
    sched, clock, append = rep.sched, rep.clock, series.append
    arrivals = [r.arrival_time for r in reqs]  # (``_deliver_due``)
    n = len(arrivals)
    done = i = 0
    while True:
        ta = arrivals[i] if i < n else math.inf
        horizon = None if i == n else ta
        while not sched.is_idle:
            start = clock.now()
            if not start < ta:
                break
            out = _step(rep, horizon, check_integrity)
            st = sched.stats  # ``sample_series`` for one replica, inlined
            append(
                start,
                len(sched.waiting),
                sched.num_running(),
                sched.kv_usage(),
                st.cached_prompt_tokens,
                st.prompt_tokens,
            )
            if out.finished and on_progress is not None:
                done += len(out.finished)
                on_progress(done, n)
        if i == n:
            break
        if sched.is_idle:
            clock.jump_to(ta)
        i = _deliver_due(rep, reqs, arrivals, i, clock.now())
    if on_progress is not None:
        on_progress(n, n)


def _run_lean(
    rep: Replica,
    reqs: Sequence[Req],
    series: TimeSeries,
    on_progress: Callable[[int, int], None] | None,
    check_integrity: bool,
    lean: LeanReads,
) -> None:
    """``_run_one_replica`` reading the scheduler's state straight from ``lean`` (the same
    values as its properties: ``native.arrive.lean_reads``), the arrival times from one list
    read before the loop (iterating ``reqs`` builds no deferred prompt; delivering indexes
    it), and sampling the series without its per-sample time check (the replica's clock
    never goes back; ``TimeSeries.checked`` checks them all after). Between two arrivals the
    steps run in one native call (``_core.steps_until``: this loop's reads, calls and samples
    in its order) unless each step's integrity is checked."""
    sched, clock, waiting, running = rep.sched, rep.clock, lean.waiting, lean.running
    arrivals = [r.arrival_time for r in reqs]
    since, n = len(series), len(arrivals)
    steps = _steps_until(rep, series, on_progress, n, lean, check_integrity)
    due, now = _due(reqs), clock.now
    done = i = 0
    while i < n:
        ta = arrivals[i]
        done = steps(ta, ta, done)
        if not (waiting or running or sched.chunked_req is not None):
            clock.jump_to(ta)
        # ``_deliver_due`` inline: arrival ``i`` and the later ones due by the clock, their
        # prompts built through the last (``_due``)
        j, t = i + 1, now()
        while j < n and arrivals[j] <= t:
            j += 1
        deliver_batch(due(i, j), rep)
        i = j
    steps(math.inf, None, done)  # the last arrival's steps: until the replica is idle
    series.checked(since)
    if on_progress is not None:
        on_progress(n, n)


StepsUntil = Callable[[float, float | None, int], int]


def _steps_until(
    rep: Replica,
    series: TimeSeries,
    on_progress: Callable[[int, int], None] | None,
    n: int,
    lean: LeanReads,
    check_integrity: bool,
) -> StepsUntil:
    """``steps(ta, horizon, done)``: the replica steps (each with ``horizon``) while it has
    work and its clock reads before ``ta``, each step sampled into ``series``; after a step
    that finished requests, ``done`` grows by their count and ``on_progress(done, n)`` is
    told. Returns ``done``."""
    sched, clock, st = rep.sched, rep.clock, rep.sched.stats
    waiting, running, free, evictable, cap = lean
    native = core()
    if native is not None and not check_integrity:
        until, step, now, rows = native.steps_until, sched.step, clock.now, series.rows()

        def native_steps(ta: float, horizon: float | None, done: int) -> int:
            stuck, done = until(
                step, now, sched, waiting, running, free, evictable, cap, st, rows, ta,
                horizon, on_progress, done, n,
            )  # fmt: skip
            if stuck:
                raise _cannot_schedule(rep)
            return done

        return native_steps
    sample = series.unchecked()

    def python_steps(ta: float, horizon: float | None, done: int) -> int:
        while waiting or running or sched.chunked_req is not None:  # not ``is_idle``
            start = clock.now()
            if not start < ta:
                break
            out = sched.step(horizon)
            if check_integrity:
                sched.check_integrity()
            if out is None:
                raise _cannot_schedule(rep)
            sample((
                start,
                len(waiting),
                len(running) + (1 if sched.chunked_req is not None else 0),
                (cap - (free() + evictable())) / cap,
                st.cached_prompt_tokens,
                st.prompt_tokens,
            ))  # fmt: skip
            if out.finished and on_progress is not None:
                done += len(out.finished)
                on_progress(done, n)
        return done

    return python_steps


def _step(rep: Replica, horizon: float | None, check_integrity: bool) -> StepOutcome:
    sched = rep.sched
    out = sched.step(horizon)
    if check_integrity:
        sched.check_integrity()
    if out is None:
        raise _cannot_schedule(rep)
    return out


def _cannot_schedule(rep: Replica) -> RuntimeError:
    s = rep.sched
    return RuntimeError(
        f"replica {rep.idx} has work but could not schedule it "
        f"(waiting={len(s.waiting)}, running={len(s.running)})"
    )


def _due(reqs: Sequence[Req]) -> Callable[[int, int], Sequence[Req]]:
    """``due(i, j)``: requests ``i`` to ``j - 1`` (``i < j``) as ``_deliver_due`` reads them,
    ``reqs[j - 1]`` first (a deferred sequence builds the prompts through it:
    ``ArrivingRequests.through``, one call)."""
    if isinstance(reqs, ArrivingRequests):
        return reqs.through

    def sliced(i: int, j: int) -> Sequence[Req]:
        reqs[j - 1]  # indexed for its side effect, as in ``_deliver_due``
        return reqs[i:j]

    return sliced


def _deliver_due(
    rep: Replica, reqs: Sequence[Req], arrivals: list[float], i: int, now: float
) -> int:
    """Deliver arrival ``i`` and the ones after it due by ``now`` (the replica's clock, at or
    past arrival ``i``); returns the next arrival's index. ``arrivals``: ``reqs``' arrival
    times, read once before the loop (indexing a deferred sequence builds prompts: only the
    last request delivered is indexed, so that the prompts through it are built,
    ``sim.workloads.deferred``)."""
    j, n = i + 1, len(arrivals)
    while j < n and arrivals[j] <= now:
        j += 1
    reqs[j - 1]  # indexed for its side effect: a deferred sequence builds through it
    deliver_batch(reqs[i:j], rep)
    return j

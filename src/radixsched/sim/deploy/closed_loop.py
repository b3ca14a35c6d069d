"""Client-side arrivals for the simulator: the per-request fixed latency and closed-loop
clients (``--max-concurrency``).

Per-request fixed latency ``L`` (``--request-latency-ms``: HTTP, tokenization,
detokenization, first-chunk flush): a request reaches the scheduler ``L`` after the client
sent it, and its reported times are the client's: ``arrival`` is the send time, so TTFT and
E2E include ``L``. Splitting ``L`` into a part before the scheduler and a part after it would
change nothing: open-loop arrivals only translate, and a closed-loop client sends its next
request when it sees the previous one finish, which the server sees ``L`` after that finish
either way.

Front end ``s`` (``--request-serial-ms``: HTTP parsing and tokenization, one request at a
time): request ``i`` reaches the scheduler at ``a_i = max(send_i + L, a_(i-1) + s)`` (requests
in send order), so requests sent together arrive ``s`` apart. With ``s = 0`` that is
``send_i + L``.

Closed loop (``--max-concurrency N``), as ``sglang.bench_serving --max-concurrency`` and
GuideLLM's synchronous (``N = 1``) and concurrent modes: requests keep their arrival order and
arrival times (a rate, trace timestamps, or all at t=0); request ``i`` is sent at
``max(arrival_i, the send time of request i-1, the time one of the N slots is free)``, a slot
being freed when its request finishes (or is rejected). Slots are taken in arrival order
(FIFO, like an ``asyncio.Semaphore``)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

from radixsched.request import Req
from radixsched.results.metrics import TimeSeries
from radixsched.sim.deploy.replicas import Replica, deliver, sample_series, step_earliest


def shift_to_scheduler(reqs: Sequence[Req], latency_s: float, serial_s: float = 0.0) -> list[float]:
    """Move every arrival to when it reaches the scheduler (``reqs`` in send order; module
    docstring); return the send times."""
    sends = [r.arrival_time for r in reqs]
    if latency_s > 0 or serial_s > 0:
        for r, t in zip(reqs, scheduler_arrivals(sends, latency_s, serial_s), strict=True):
            r.arrival_time = r.times.arrival = r.queue_entry_time = t
    return sends


def scheduler_arrivals(sends: Sequence[float], latency_s: float, serial_s: float) -> list[float]:
    """When requests sent at ``sends`` (in send order) reach the scheduler."""
    if serial_s <= 0:
        return [t + latency_s for t in sends]
    out: list[float] = []
    last = -math.inf
    for t in sends:
        last = max(t + latency_s, last + serial_s)
        out.append(last)
    return out


def restore_send_times(reqs: Sequence[Req], sends: Sequence[float]) -> None:
    """Report client times: each request's arrival is when it was sent."""
    for r, t in zip(reqs, sends, strict=True):
        r.arrival_time = t
        r.times.arrival = t


def run_closed_loop(
    replicas: Sequence[Replica],
    reqs: Sequence[Req],
    router: Any,
    series: TimeSeries,
    on_progress: Callable[[int, int], None] | None,
    check_integrity: bool,
    *,
    max_concurrency: int,
    latency_s: float,
    serial_s: float = 0.0,
) -> list[float]:
    """Drive the replicas with ``max_concurrency`` closed-loop clients (module docstring).
    ``reqs`` are in arrival order, their ``arrival_time`` the earliest they may be sent.
    Returns each request's send time; arrivals at the scheduler follow the front-end rule."""
    if max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    n = len(reqs)
    earliest = [r.arrival_time for r in reqs]
    sends = list(earliest)
    free: list[float] = [0.0] * min(max_concurrency, max(n, 1))  # times slots became free
    in_flight: dict[int, int] = {}  # id(req) -> index, for requests holding a slot
    last_send = last_arrival = -math.inf
    i = done = 0

    def next_send() -> float:
        return max(earliest[i], last_send, free[0])

    def next_arrival() -> float:
        """When request ``i`` reaches the scheduler, or inf (no request, or no free slot)."""
        if i >= n or not free:
            return math.inf
        return max(next_send() + latency_s, last_arrival + serial_s)

    def release(r: Req, t: float) -> None:
        if in_flight.pop(id(r), None) is not None:
            heapq.heappush(free, t)

    while True:
        ta = next_arrival()
        stepped = step_earliest(replicas, ta, check_integrity, reply_s=latency_s)
        if stepped is not None:
            rep, out, start = stepped
            for r in out.finished:
                if router is not None:
                    router.on_finish(r, rep.idx)
                release(r, r.times.finish if r.times.finish is not None else rep.clock.now())
            sample_series(series, start, replicas if len(replicas) > 1 else (rep,))
            if out.finished and on_progress is not None:
                done += len(out.finished)
                on_progress(done, n)
            continue
        if ta == math.inf:
            if i >= n:
                break
            # No slot is free and nothing runs: a request ended without a step reporting it
            # (aborted in the queue); its slot is free from its finish.
            gone = [r for r in reqs if id(r) in in_flight and r.finished]
            if not gone:
                raise RuntimeError("closed loop: every slot is taken and nothing is running")
            for r in gone:
                release(r, r.times.finish if r.times.finish is not None else 0.0)
            continue
        req = reqs[i]
        t_send = next_send()
        heapq.heappop(free)
        sends[i] = last_send = t_send
        last_arrival = ta
        req.arrival_time = ta
        req.times.arrival = ta
        req.queue_entry_time = ta
        for idle in replicas:
            if idle.sched.is_idle:
                idle.clock.jump_to(ta)
        in_flight[id(req)] = i
        deliver(req, replicas, router, ta)
        if req.finished:  # rejected at the door: the client's slot is free at once
            release(req, ta)
        i += 1
    if on_progress is not None:
        on_progress(n, n)
    return sends

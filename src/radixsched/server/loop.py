"""The scheduler thread and its bridge to asyncio.

One thread owns the ``Scheduler``: nothing else reads or writes it. HTTP handlers talk to it
through a thread-safe inbox (add, abort, call) and get their tokens back on a per-request
``asyncio.Queue``; the thread hands each iteration's answers and tokens to the event loop in
one ``loop.call_soon_threadsafe`` (one wake-up per step, not one per request). The thread steps while there is work
and sleeps on the inbox when idle.

Guarantees:

* every submitted request gets exactly one admission answer, then (if accepted) token deltas
  ending with exactly one delta that carries a ``FinishInfo`` - also when it is aborted by a
  client, by the queue limit, by an out-of-memory retraction, by a failing step or by shutdown;
* a failing step never kills the thread: the requests of the failed batch (recorded by a thin
  proxy around the runner; when the failure came before the forward, every request that is
  not waiting) are aborted with 500 and their KV is discarded, never cached, since it may be
  half written; other requests carry on. If the KV bookkeeping is broken afterwards the engine is marked
  unhealthy and every later request is refused with 503;
* when the thread goes idle it checks KV conservation and that no lock is left.

The same loop runs in the server's process on a thread (the library's and the tests' layout) or
as the main loop of an engine process (``server.process``, what ``radixsched serve`` runs): only
where its posts go differs (``EngineLoop(sink=...)``).

A request's clock starts at its arrival as the HTTP layer stamped it (``submit(req, arrival)``,
on the scheduler's clock): TTFT and e2e latency include HTTP handling, tokenization and the wait
for the step that was running when it came in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from radixsched.clock import Clock
from radixsched.request import FinishReason, FinishState, Req
from radixsched.runner import Batch, ModelRunner, StepResult
from radixsched.scheduler import AdmitResult, Scheduler, StepOutcome
from radixsched.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from radixsched.config import SchedulerConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")

CLIENT_GONE_STATUS = 499  # nginx's "client closed request"; never sent to anyone
# An abort with this status is the server ending a request on a stop string: a normal finish
# ("stop") for clients and metrics, implemented as an abort because the scheduler only knows
# stop token ids.
STOP_STRING_STATUS = 200
IDLE_WAIT_S = 0.5  # seconds: the idle thread wakes at least this often, commands or not


@dataclass(frozen=True)
class FinishInfo:
    reason: FinishReason
    message: str
    status_code: int | None  # set for aborts: the HTTP status the abort maps to
    matched_token: int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    host_cached_tokens: int  # of cached_tokens, those loaded from the host tier
    e2e_latency_s: float


@dataclass(frozen=True)
class TokenDelta:
    """New tokens of one request; ``finish`` is set on the last delta (tokens may be empty)."""

    token_ids: list[int]
    finish: FinishInfo | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What the HTTP layer reads of an engine; fixed once it is built."""

    config: SchedulerConfig
    kv_slots: int
    max_running_requests: int
    context_len: int


class Subscriber(Protocol):
    """Whoever listens for one request's answers: ``RequestHandle`` on a thread's event loop,
    or the engine process's stand-in for a handle in the server's process."""

    req: Req
    rid: str
    arrival: float | None


Post = tuple[Any, AdmitResult | TokenDelta]  # (a Subscriber, what it is sent)
Sink = Callable[[list[Post]], None]  # receives one loop iteration's posts, in order


class Engine(Protocol):
    """What the HTTP layer needs of an engine: ``EngineLoop`` on a thread of this process, or
    ``server.process.EngineProcess`` in a process of its own."""

    healthy: bool

    @property
    def info(self) -> EngineInfo: ...

    @property
    def alive(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def now(self) -> float: ...

    def submit(self, req: Req, arrival: float | None = None) -> RequestHandle: ...

    def abort(
        self, rid: str, message: str = "client disconnected", status_code: int = 499
    ) -> None: ...

    def stop_request(self, rid: str) -> None: ...

    async def flush_cache(self) -> int | None: ...

    async def render_metrics(self) -> bytes: ...


class RequestHandle:
    """The asyncio side of one request. Consume ``admission()`` once, then ``next_delta()``
    until a delta has ``finish`` set."""

    def __init__(
        self, req: Req, aloop: asyncio.AbstractEventLoop, arrival: float | None = None
    ) -> None:
        self.req = req
        self.rid = req.rid
        self.arrival = arrival  # on the scheduler's clock; None: when the thread takes it
        self._aloop = aloop
        self._queue: asyncio.Queue[AdmitResult | TokenDelta] = asyncio.Queue()
        self.finished = False  # set on the asyncio side once the final delta was consumed

    # ---- scheduler thread side --------------------------------------------------------------
    def _post_threadsafe(self, item: AdmitResult | TokenDelta) -> None:
        try:
            self._aloop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            logger.debug("dropped an event for %s: event loop closed", self.rid)

    def _put_on_loop(self, item: AdmitResult | TokenDelta) -> None:
        self._queue.put_nowait(item)

    # ---- asyncio side ------------------------------------------------------------------------
    async def admission(self) -> AdmitResult:
        item = await self._queue.get()
        if not isinstance(item, AdmitResult):
            raise RuntimeError(f"{self.rid}: expected the admission answer first, got {item!r}")
        return item

    async def next_delta(self) -> TokenDelta:
        """Wait for tokens, then merge everything already queued into one delta."""
        first = await self._queue.get()
        if not isinstance(first, TokenDelta):
            raise RuntimeError(f"{self.rid}: unexpected {first!r} after admission")
        ids = list(first.token_ids)
        finish = first.finish
        while finish is None and not self._queue.empty():
            nxt = self._queue.get_nowait()
            assert isinstance(nxt, TokenDelta)
            ids.extend(nxt.token_ids)
            finish = nxt.finish
        if finish is not None:
            self.finished = True
        return TokenDelta(ids, finish)


@dataclass(frozen=True)
class _Add:
    handle: Subscriber


@dataclass(frozen=True)
class Abort:
    """End request ``rid`` (a command here, and the engine process's pipe message)."""

    rid: str
    message: str
    status_code: int


@dataclass(frozen=True)
class _Call:
    fn: Callable[[Scheduler], object]
    future: concurrent.futures.Future[object]


_Command = _Add | Abort | _Call


def _deliver(items: list[tuple[RequestHandle, AdmitResult | TokenDelta]]) -> None:
    """On the event loop: hand out one flush of the scheduler thread's posts, in order."""
    for handle, item in items:
        handle._put_on_loop(item)


def post_to_event_loops(posts: list[Post]) -> None:
    """The thread layout's sink: one ``call_soon_threadsafe`` per event loop per flush."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Post]] = {}
    for handle, item in posts:
        by_loop.setdefault(handle._aloop, []).append((handle, item))
    for aloop, items in by_loop.items():
        try:
            aloop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            logger.debug("dropped %d events: event loop closed", len(items))


def flush_cache(sched: Scheduler) -> int | None:
    """Empty the prefix cache if nothing runs or waits: the tokens freed; None when busy."""
    if not sched.is_idle:
        return None
    n = int(sched.cache.total_size())
    sched.cache.reset()
    return n


class BatchRecorder(ModelRunner):
    """Delegates to the real runner and remembers the batch of the current step, so that a
    failing forward can be pinned on the requests it carried."""

    def __init__(self, inner: ModelRunner) -> None:
        self.inner = inner
        self.supports_multi_step = inner.supports_multi_step
        self.last: Batch | None = None

    def forward(self, batch: Batch) -> StepResult:
        self.last = batch
        return self.inner.forward(batch)

    def eos_token_ids(self) -> tuple[int, ...]:
        return self.inner.eos_token_ids()

    def __getattr__(self, name: str) -> Any:
        # kv_pool_size, max_context_len, a multi-step or offload runner's methods, ...
        return getattr(self.inner, name)


class EngineLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        *,
        metrics: ServerMetrics | None = None,
        clock: Clock | None = None,
        sink: Sink = post_to_event_loops,
        on_unhealthy: Callable[[], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        # The scheduler's clock (thread-safe to read: a wall clock is a function of time).
        self.clock: Clock = clock if clock is not None else scheduler.clock
        if not isinstance(scheduler.runner, BatchRecorder):
            raise TypeError("the scheduler must be built on a BatchRecorder (engine_for_runner)")
        self._recorder = scheduler.runner
        self.metrics = metrics
        self._inbox: deque[_Command] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        # Set (under _cond) once the thread took its last commands: later ones are refused.
        self._closed = False
        self._thread: threading.Thread | None = None
        # Only the scheduler thread touches _handles.
        self._handles: dict[str, Subscriber] = {}
        # Posts of this loop iteration, flushed to the sink once per iteration (not per token).
        self._outbox: list[Post] = []
        self._sink = sink
        self._on_unhealthy = on_unhealthy
        self.healthy = True
        self.steps = 0
        self.step_failures = 0

    # ==== lifecycle ============================================================================
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("engine loop already started")
        self._thread = threading.Thread(target=self._run, name="radixsched-scheduler", daemon=True)
        self._thread.start()

    def run_here(self) -> None:
        """Run the loop in the calling thread until ``stop()`` (an engine process's main)."""
        if self._thread is not None:
            raise RuntimeError("engine loop already started")
        with self._cond:
            self._thread = threading.current_thread()
        self._run()

    @property
    def info(self) -> EngineInfo:
        sched = self.scheduler
        return EngineInfo(
            sched.config, sched.capacity, sched.max_running_requests, sched.context_len
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything in flight (503), then join the thread. Idempotent."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.error("scheduler thread did not stop within %.1f s", timeout)

    def request_stop(self) -> None:
        """``stop`` without waiting: the loop aborts everything in flight (503) and returns."""
        with self._cond:
            self._stopping = True
            if self._thread is None or not self._thread.is_alive():
                self._closed = True
            self._cond.notify()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    # ==== thread-safe API ===========================================================================
    def now(self) -> float:
        """The scheduler's clock, for stamping arrivals."""
        return self.clock.now()

    def submit(self, req: Req, arrival: float | None = None) -> RequestHandle:
        """Queue ``req``, which arrived at ``arrival`` (``now()`` when it came in; None: when
        the scheduler thread takes it); call from a coroutine (the handle feeds that event
        loop)."""
        handle = RequestHandle(req, asyncio.get_running_loop(), arrival)
        if not self.enqueue(handle):
            handle._post_threadsafe(AdmitResult(False, 503, "the server is shutting down"))
        return handle

    def enqueue(self, sub: Subscriber) -> bool:
        """Queue ``sub.req``; its answers go to the sink. False once the loop has stopped."""
        return self._submit(_Add(sub))

    def abort(
        self, rid: str, message: str = "client disconnected", status_code: int = CLIENT_GONE_STATUS
    ) -> None:
        self._submit(Abort(rid, message, status_code))

    def stop_request(self, rid: str) -> None:
        """End a request whose text reached a stop string (counts as finish reason "stop")."""
        self._submit(Abort(rid, "stop string matched", STOP_STRING_STATUS))

    def call(self, fn: Callable[[Scheduler], T]) -> concurrent.futures.Future[T]:
        """Run ``fn(scheduler)`` on the scheduler thread between steps."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if not self._submit(_Call(fn, future)):  # type: ignore[arg-type]
            future.set_exception(RuntimeError("the engine loop is not running"))
        return future

    async def acall(self, fn: Callable[[Scheduler], T]) -> T:
        return await asyncio.wrap_future(self.call(fn))

    async def flush_cache(self) -> int | None:
        """``flush_cache`` between steps: the tokens freed, None while busy."""
        return await self.acall(flush_cache)

    async def render_metrics(self) -> bytes:
        return self.metrics.render() if self.metrics is not None else b""

    def _submit(self, cmd: _Command) -> bool:
        """Queue a command; False once the loop has stopped taking commands."""
        with self._cond:
            if self._closed or self._thread is None:
                return False
            self._inbox.append(cmd)
            self._cond.notify()
            return True

    # ==== the thread ===============================================================================
    def _run(self) -> None:
        sched = self.scheduler
        was_busy = False
        while True:
            with self._cond:
                if not self._inbox and not self._stopping and (sched.is_idle or not self.healthy):
                    self._cond.wait(IDLE_WAIT_S)
                cmds = list(self._inbox)
                self._inbox.clear()
                stopping = self._stopping
                self._closed = stopping
            for cmd in cmds:
                self._handle_command(cmd)
            if stopping:
                self._abort_everything(503, "the server is shutting down")
                self._flush()
                return
            self._flush()
            if not sched.is_idle and self.healthy:
                was_busy = True
                self._step()
                self._flush()
            elif was_busy and sched.is_idle:
                was_busy = False
                self._check_idle()
            if self.metrics is not None:
                self.metrics.sync(sched)

    def _send(self, handle: Subscriber, item: AdmitResult | TokenDelta) -> None:
        self._outbox.append((handle, item))

    def _flush(self) -> None:
        if not self._outbox:
            return
        posts, self._outbox = self._outbox, []
        self._sink(posts)

    def _mark_unhealthy(self) -> None:
        self.healthy = False
        if self._on_unhealthy is not None:
            self._on_unhealthy()

    def _handle_command(self, cmd: _Command) -> None:
        if isinstance(cmd, _Add):
            self._admit(cmd.handle)
        elif isinstance(cmd, Abort):
            if self.scheduler.abort(cmd.rid, cmd.message, cmd.status_code):
                handle = self._handles.get(cmd.rid)
                if handle is not None:
                    self._finish(handle)
        else:
            try:
                cmd.future.set_result(cmd.fn(self.scheduler))
            except Exception as e:  # the caller gets the exception, the loop carries on
                cmd.future.set_exception(e)

    def _admit(self, handle: Subscriber) -> None:
        req = handle.req
        if not self.healthy:
            result = AdmitResult(False, 503, "the engine is unhealthy after an internal error")
        elif req.rid in self._handles:
            result = AdmitResult(False, 400, f"duplicate request id {req.rid!r}")
        else:
            aborted_before = self.scheduler.stats.aborted
            try:
                result = self.scheduler.add_request(req, now=handle.arrival)
            except Exception as e:
                logger.exception("add_request failed for %s", req.rid)
                result = AdmitResult(False, 500, f"internal error while admitting: {e}")
            if self.scheduler.stats.aborted != aborted_before:
                # A queued request was displaced by this one (priority queue limit).
                self._deliver_aborted()
        if result.accepted:
            self._handles[req.rid] = handle
        elif self.metrics is not None and result.status_code is not None:
            self.metrics.on_reject(result.status_code)
        self._send(handle, result)

    def _step(self) -> None:
        sched = self.scheduler
        aborted_before = sched.stats.aborted
        self._recorder.last = None
        try:
            out = sched.step()
        except Exception as e:
            self.step_failures += 1
            logger.exception("scheduler step failed; aborting the requests of the batch")
            self._recover(f"internal error during a forward step: {e}")
            return
        self.steps += 1
        if out is None:
            if sched.num_running() == 0 and sched.num_waiting() > 0:
                # Nothing runs and nothing can be admitted: these requests would wait forever.
                for rid in [r.rid for r in sched.waiting]:
                    sched.abort(rid, "the scheduler cannot admit this request", 503)
                self._deliver_aborted()
            return
        self._dispatch(out)
        if sched.stats.aborted != aborted_before:
            self._deliver_aborted()

    def _dispatch(self, out: StepOutcome) -> None:
        if self.metrics is not None:
            self.metrics.on_step(out)
        for req, toks in out.new_tokens:
            handle = self._handles.get(req.rid)
            if handle is None or handle.req is not req:
                continue
            if req.finished:
                self._finish(handle, toks)
            else:
                self._send(handle, TokenDelta(list(toks)))

    def _finish(self, handle: Subscriber, toks: list[int] | None = None) -> None:
        req = handle.req
        fin = req.finish
        assert fin is not None, req
        del self._handles[req.rid]
        if self.metrics is not None:
            self.metrics.on_finish(req, finish_label(fin))
        self._send(handle, TokenDelta(list(toks or []), finish_info(req, fin)))

    def _deliver_aborted(self) -> None:
        """Finish the handles of requests the scheduler aborted on its own."""
        for handle in [h for h in self._handles.values() if h.req.finished]:
            self._finish(handle)

    def _recover(self, message: str) -> None:
        sched = self.scheduler
        waiting = {id(r) for r in sched.waiting}
        live = {id(r) for r in sched.running}
        if sched.chunked_req is not None:
            live.add(id(sched.chunked_req))
        # Taken off the queue for the failed batch but neither running nor chunked yet.
        victims = [h.req for h in self._handles.values() if id(h.req) not in waiting | live]
        batch = self._recorder.last
        if batch is None:
            victims += [h.req for h in self._handles.values() if id(h.req) in live]
        else:
            victims += [e.req for e in batch.extend] + [d.req for d in batch.decode]
        for req in dict.fromkeys(victims):
            if not req.finished:
                sched.discard(req, 500, message)
        self._deliver_aborted()
        try:
            sched.check_integrity()
        except AssertionError:
            logger.exception("KV bookkeeping is inconsistent after a failed step")
            self._mark_unhealthy()
            self._abort_everything(503, "the engine is unhealthy after an internal error")

    def _check_idle(self) -> None:
        try:
            self.scheduler.check_integrity()
        except AssertionError:
            logger.exception("KV integrity check failed while idle")
            self._mark_unhealthy()

    def _abort_everything(self, status: int, message: str) -> None:
        sched = self.scheduler
        for handle in list(self._handles.values()):
            req = handle.req
            if req.finished:
                continue
            if req in sched.waiting:
                sched.abort(req.rid, message, status)
            else:
                sched.discard(req, status, message)
        self._deliver_aborted()


def finish_label(fin: FinishState) -> str:
    """stop / length / abort, with a stop-string abort counted as "stop"."""
    if fin.reason is FinishReason.ABORT and fin.status_code == STOP_STRING_STATUS:
        return FinishReason.STOP.value
    return fin.reason.value


def finish_info(req: Req, fin: FinishState) -> FinishInfo:
    t = req.times
    end = t.finish if t.finish is not None else t.arrival
    return FinishInfo(
        reason=fin.reason,
        message=fin.message,
        status_code=fin.status_code,
        matched_token=fin.matched_token,
        prompt_tokens=req.prompt_len,
        completion_tokens=req.output_len,
        cached_tokens=req.cached_tokens,
        host_cached_tokens=req.host_cached_tokens,
        e2e_latency_s=max(end - t.arrival, 0.0),
    )


__all__ = [
    "Engine",
    "EngineInfo",
    "EngineLoop",
    "FinishInfo",
    "RequestHandle",
    "Subscriber",
    "TokenDelta",
    "flush_cache",
]

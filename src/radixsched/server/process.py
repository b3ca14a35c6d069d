"""The engine in a process of its own: how ``radixsched serve`` runs.

The server's process runs HTTP, tokenization and detokenization; a child process owns the model,
the KV pool and the ``EngineLoop`` (the layout of SGLang, whose tokenizer manager and scheduler
are separate processes). Nothing the HTTP side does then holds the interpreter lock the engine's
steps need: a step takes as long as its batch, however many streams are being written. On a
2-core machine, with the HTTP side on the same interpreter, a tiny model's decode step took twice
its offline time, and its spread between identical runs was wider than the simulator's error.

One duplex pipe carries pickled messages:

* server -> engine: ``NewRequest``, ``Abort``, ``FlushCache``, ``RenderMetrics``, ``Stop``;
* engine -> server: ``Ready`` (or ``Failed``) once, then ``Posts`` (one loop iteration's
  admission answers and token deltas, in order), ``Reply`` (to a call), ``Unhealthy`` and, last,
  ``Closed``.

Guarantees are ``EngineLoop``'s (every request gets one admission answer and ends with exactly
one finishing delta); in addition, if the engine process dies, every request in flight ends with
503 and ``/health`` turns unhealthy. The engine process exits when the server's process closes
the pipe (also when the server is killed). Both processes share one clock origin (``epoch``, a
``time.perf_counter()`` value: system-wide monotonic time on Linux), so arrivals stamped by the
HTTP side are on the scheduler's clock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Connection
from typing import Any

from radixsched.clock import WallClock
from radixsched.config import SchedulerConfig
from radixsched.request import FinishReason, Req, SamplingParams, TokenArray
from radixsched.scheduler import AdmitResult
from radixsched.server.loop import (
    CLIENT_GONE_STATUS,
    STOP_STRING_STATUS,
    Abort,
    EngineInfo,
    EngineLoop,
    FinishInfo,
    Post,
    RequestHandle,
    Sink,
    TokenDelta,
    flush_cache,
    post_to_event_loops,
)

logger = logging.getLogger(__name__)

# How long the server waits for the engine to answer ``Stop`` before it kills it.
STOP_GRACE_S = 10.0


# ---- what the engine process is built from ------------------------------------------------------


@dataclass(frozen=True)
class EngineSpec:
    """Everything the engine process needs to build its engine (picklable)."""

    model: str
    config: SchedulerConfig
    device: str = "cpu"
    dtype: str | None = None
    kv_slots: int | None = None  # None: as many as fit in ``kv_cache_mb``
    kv_cache_mb: float = 256.0
    context_len: int | None = None
    threads: int = 1
    # CPUs the engine process is bound to (None: wherever the OS puts it).
    cpus: tuple[int, ...] | None = None
    epoch: float = field(default_factory=time.perf_counter)  # the shared clock's origin


# ---- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewRequest:
    """A request's constructor fields (the engine builds its own ``Req``)."""

    rid: str
    prompt_ids: TokenArray
    sampling: SamplingParams
    priority: int | None
    routing_key: str | None
    extra_key: str | None
    cache_salt: str | None
    arrival: float | None

    @classmethod
    def of(cls, req: Req, arrival: float | None) -> NewRequest:
        return cls(**_req_fields(req), arrival=arrival)

    def build(self) -> Req:
        return Req(**_req_fields(self))


def _req_fields(obj: Any) -> dict[str, Any]:
    """``obj``'s values of ``NewRequest``'s fields but ``arrival``: ``Req``'s constructor's."""
    return {f.name: getattr(obj, f.name) for f in fields(NewRequest) if f.name != "arrival"}


@dataclass(frozen=True)
class FlushCache:
    call_id: int


@dataclass(frozen=True)
class RenderMetrics:
    call_id: int


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Ready:
    info: EngineInfo


@dataclass(frozen=True)
class Failed:
    message: str


@dataclass(frozen=True)
class Posts:
    items: list[tuple[str, AdmitResult | TokenDelta]]


@dataclass(frozen=True)
class Reply:
    call_id: int
    value: Any
    error: str | None = None


@dataclass(frozen=True)
class Unhealthy:
    pass


@dataclass(frozen=True)
class Closed:
    pass


class EngineStartError(RuntimeError):
    """The engine process could not build its engine (the message says why)."""


# ---- the engine process ------------------------------------------------------------------------


@dataclass
class _Remote:
    """The engine process's stand-in for a request's handle in the server's process."""

    req: Req
    arrival: float | None
    rid: str = ""

    def __post_init__(self) -> None:
        self.rid = self.req.rid


class _Outlet:
    """The engine process's end of the pipe. Sends come from the scheduler thread (posts,
    replies to calls) and from the command reader (refusals, metrics): one lock orders them."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, msg: object) -> None:
        with self._lock, contextlib.suppress(OSError):  # the server's process is gone
            self.conn.send(msg)

    def posts(self, posts: list[Post]) -> None:
        self.send(Posts([(sub.rid, item) for sub, item in posts]))

    def unhealthy(self) -> None:
        self.send(Unhealthy())


def engine_main(spec: EngineSpec, conn: Connection) -> None:
    """The engine process: build the engine, say ``Ready``, run the loop until ``Stop`` or until
    the server's process closes the pipe."""
    # Ctrl-C reaches the whole process group; the server's process decides when to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.cpus:  # before any thread starts: threads inherit the binding
        os.sched_setaffinity(0, spec.cpus)
    out = _Outlet(conn)
    try:
        loop = build_engine_loop(spec, sink=out.posts, on_unhealthy=out.unhealthy)
    except Exception as e:  # reported to the server, which exits with the message
        out.send(Failed(f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)))
        return
    freeze_startup_heap()
    out.send(Ready(loop.info))
    reader = threading.Thread(
        target=_read_commands, args=(conn, loop, out), name="radixsched-engine-reader", daemon=True
    )
    reader.start()
    loop.run_here()
    out.send(Closed())
    conn.close()


def _read_commands(conn: Connection, loop: EngineLoop, out: _Outlet) -> None:
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the server's process closed the pipe or died
            loop.request_stop()
            return
        if isinstance(msg, NewRequest):
            if not loop.enqueue(_Remote(msg.build(), msg.arrival)):
                out.send(Posts([(msg.rid, AdmitResult(False, 503, "the server is shutting down"))]))
        elif isinstance(msg, Abort):
            loop.abort(msg.rid, msg.message, msg.status_code)
        elif isinstance(msg, FlushCache):
            future = loop.call(flush_cache)
            future.add_done_callback(functools.partial(_send_reply, out, msg.call_id))
        elif isinstance(msg, RenderMetrics):
            body = loop.metrics.render() if loop.metrics is not None else b""
            out.send(Reply(msg.call_id, body))
        elif isinstance(msg, Stop):
            loop.request_stop()
            return
        else:
            logger.error("engine process: unknown message %r", msg)


def _send_reply(out: _Outlet, call_id: int, future: concurrent.futures.Future[Any]) -> None:
    exc = future.exception()
    if exc is not None:
        out.send(Reply(call_id, None, str(exc) or type(exc).__name__))
    else:
        out.send(Reply(call_id, future.result()))


def build_engine_loop(
    spec: EngineSpec,
    *,
    sink: Sink = post_to_event_loops,
    on_unhealthy: Callable[[], None] | None = None,
) -> EngineLoop:
    """The model loaded and put under an (unstarted) ``EngineLoop``, as ``spec`` says: torch
    threads, KV pool (``kv_slots``, else what fits in ``kv_cache_mb``), running-request slots
    (at most one per ``MIN_TOKENS_PER_RUNNING`` pool tokens unless set) and the shared clock."""
    import torch

    from radixsched.engine.build import default_kv_slots, torch_runner
    from radixsched.engine.loader import load_model
    from radixsched.server.build import engine_for_runner

    torch.set_num_threads(spec.threads)
    config = spec.config
    loaded = load_model(spec.model, device=spec.device, dtype=spec.dtype, seed=config.seed)
    kv_slots = spec.kv_slots or default_kv_slots(loaded, spec.kv_cache_mb)
    if config.max_running_requests is None and kv_slots // MIN_TOKENS_PER_RUNNING < 2048:
        config = config.replace(max_running_requests=max(1, kv_slots // MIN_TOKENS_PER_RUNNING))
    runner = torch_runner(loaded, config, kv_slots, context_len=spec.context_len, seed=config.seed)
    return engine_for_runner(
        runner,
        config,
        kv_slots=kv_slots,
        context_len=runner.max_context_len,
        clock=WallClock(epoch=spec.epoch),
        sink=sink,
        on_unhealthy=on_unhealthy,
    )


# A running request holds at least a short prompt and its first tokens: a KV pool is never
# given more running-request slots than it has this many tokens per slot. SGLang's own
# sizing (at least 2,048 slots) is meant for GPU pools of millions of tokens.
MIN_TOKENS_PER_RUNNING = 64


def freeze_startup_heap() -> None:
    """Move everything allocated so far (modules, the model, the app) out of the garbage
    collector's reach: a full collection then scans only what serving allocates. Without it,
    full collections of a serving process took 40-140 ms each (tiny model, 2-core machine),
    stalling every request in flight; vLLM freezes its startup heap for the same reason."""
    gc.collect()
    gc.freeze()


# ---- the server's side -------------------------------------------------------------------------


class EngineProcess:
    """``EngineLoop``'s interface (``server.loop.Engine``) over an engine process.

    ``launch()`` (blocking, before serving) starts the process and waits until the engine is
    built (the process is spawned: it imports the calling script, so a script must launch
    under ``if __name__ == "__main__":``); ``start()`` (on the event loop that serves) begins reading its answers; ``stop()``
    (any thread) ends requests in flight with 503 and the process. Every other method is called
    on the serving event loop."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.clock = WallClock(epoch=spec.epoch)
        self.healthy = True
        self._info: EngineInfo | None = None
        self._proc: Any = None  # multiprocessing's (spawn context) Process
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._handles: dict[str, RequestHandle] = {}
        self._admitted: set[str] = set()
        self._tokens: dict[str, int] = {}  # tokens delivered per request
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._stopping = False
        self._gone = False

    # ==== lifecycle ============================================================================
    def launch(self) -> EngineInfo:
        """Start the engine process and wait for its engine; ``EngineStartError`` if it fails."""
        if self._proc is not None:
            raise RuntimeError("engine process already launched")
        ctx = multiprocessing.get_context("spawn")  # no fork: torch threads, CUDA
        conn, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(
            target=engine_main, args=(self.spec, child), name="radixsched-engine", daemon=True
        )
        self._proc.start()
        child.close()
        self._conn = conn
        while not conn.poll(0.1):
            if not self._proc.is_alive():
                raise EngineStartError(_died_starting(self._proc.exitcode))
        try:
            msg = conn.recv()
        except EOFError:
            self._proc.join(STOP_GRACE_S)
            raise EngineStartError(_died_starting(self._proc.exitcode)) from None
        if isinstance(msg, Failed):
            self._proc.join(STOP_GRACE_S)
            raise EngineStartError(msg.message)
        assert isinstance(msg, Ready), msg
        self._info = msg.info
        return msg.info

    def start(self) -> None:
        """Read the engine's answers on the running event loop (the one that serves)."""
        if self._conn is None:
            self.launch()
        assert self._conn is not None
        if self._aloop is not None:
            raise RuntimeError("engine process already started")
        self._aloop = asyncio.get_running_loop()
        self._aloop.add_reader(self._conn.fileno(), self._on_readable)

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """End requests in flight (503), then the process; idempotent, from any thread."""
        if self._stopping or self._proc is None:
            self._stopping = True
            return
        self._stopping = True
        self._send(Stop())
        self._proc.join(timeout)
        if self._proc.is_alive():
            logger.error("engine process did not stop within %.1f s; killing it", timeout)
            self._proc.kill()
            self._proc.join(timeout)

    @property
    def alive(self) -> bool:
        return (
            self._proc is not None
            and self._proc.is_alive()
            and not self._stopping
            and not self._gone
        )

    @property
    def info(self) -> EngineInfo:
        if self._info is None:
            raise RuntimeError("the engine process has not been launched")
        return self._info

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    # ==== requests ==============================================================================
    def now(self) -> float:
        return self.clock.now()

    def submit(self, req: Req, arrival: float | None = None) -> RequestHandle:
        aloop = asyncio.get_running_loop()
        handle = RequestHandle(req, aloop, arrival)
        if req.rid in self._handles:
            handle._put_on_loop(AdmitResult(False, 400, f"duplicate request id {req.rid!r}"))
        elif not self.alive or not self._send(NewRequest.of(req, arrival)):
            handle._put_on_loop(AdmitResult(False, 503, "the engine is not running"))
        else:
            self._handles[req.rid] = handle
            self._tokens[req.rid] = 0
        return handle

    def abort(
        self, rid: str, message: str = "client disconnected", status_code: int = CLIENT_GONE_STATUS
    ) -> None:
        if rid in self._handles:
            self._send(Abort(rid, message, status_code))

    def stop_request(self, rid: str) -> None:
        self.abort(rid, "stop string matched", STOP_STRING_STATUS)

    async def flush_cache(self) -> int | None:
        value = await self._call_engine(FlushCache)
        return None if value is None else int(value)

    async def render_metrics(self) -> bytes:
        return bytes(await self._call_engine(RenderMetrics))

    async def _call_engine(self, kind: type[FlushCache] | type[RenderMetrics]) -> Any:
        if not self.alive:
            raise RuntimeError("the engine is not running")
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        if not self._send(kind(call_id)):
            self._calls.pop(call_id, None)
            raise RuntimeError("the engine is not running")
        return await future

    def _send(self, msg: object) -> bool:
        conn = self._conn
        if conn is None:
            return False
        try:
            with self._send_lock:
                conn.send(msg)
        except OSError:  # the engine process is gone; the reader notices the closed pipe
            return False
        return True

    # ==== answers ================================================================================
    def _on_readable(self) -> None:
        conn = self._conn
        assert conn is not None
        try:
            while conn.poll():
                self._dispatch(conn.recv())
        except (EOFError, OSError):
            self._engine_gone()

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, Posts):
            for rid, item in msg.items:
                self._deliver_to_handle(rid, item)
        elif isinstance(msg, Reply):
            future = self._calls.pop(msg.call_id, None)
            if future is not None and not future.done():
                if msg.error is not None:
                    future.set_exception(RuntimeError(msg.error))
                else:
                    future.set_result(msg.value)
        elif isinstance(msg, Unhealthy):
            self.healthy = False
        elif isinstance(msg, Closed):
            pass  # EOF follows; the requests still open are ended there
        else:
            logger.error("server: unknown message from the engine process: %r", msg)

    def _deliver_to_handle(self, rid: str, item: AdmitResult | TokenDelta) -> None:
        handle = self._handles.get(rid)
        if handle is None:
            return
        if isinstance(item, AdmitResult):
            if item.accepted:
                self._admitted.add(rid)
            else:
                self._forget(rid)
        else:
            self._tokens[rid] = self._tokens.get(rid, 0) + len(item.token_ids)
            if item.finish is not None:
                self._forget(rid)
        handle._put_on_loop(item)

    def _forget(self, rid: str) -> None:
        self._handles.pop(rid, None)
        self._admitted.discard(rid)
        self._tokens.pop(rid, None)

    def _engine_gone(self) -> None:
        """The pipe closed: end every open request and call with 503."""
        if self._gone:
            return
        self._gone = True
        if self._aloop is not None and self._conn is not None:
            with contextlib.suppress(ValueError, OSError):
                self._aloop.remove_reader(self._conn.fileno())
        if not self._stopping:
            code = None if self._proc is None else self._proc.exitcode
            logger.error("the engine process exited unexpectedly (exit code %s)", code)
            self.healthy = False
        message = "the server is shutting down" if self._stopping else "the engine process exited"
        now = self.now()
        for rid, handle in list(self._handles.items()):
            if rid in self._admitted:
                handle._put_on_loop(
                    TokenDelta([], _gone_finish(handle, message, self._tokens[rid], now))
                )
            else:
                handle._put_on_loop(AdmitResult(False, 503, message))
            self._forget(rid)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(RuntimeError(message))
        self._calls.clear()


def _died_starting(exitcode: int | None) -> str:
    return (
        f"the engine process exited during startup (exit code {exitcode}; its error is printed "
        "above). A script that starts an engine process must do so under "
        '`if __name__ == "__main__":` (the process imports the script)'
    )


def _gone_finish(handle: RequestHandle, message: str, tokens: int, now: float) -> FinishInfo:
    arrival = handle.arrival if handle.arrival is not None else now
    return FinishInfo(
        reason=FinishReason.ABORT,
        message=message,
        status_code=503,
        matched_token=None,
        prompt_tokens=handle.req.prompt_len,
        completion_tokens=tokens,
        cached_tokens=0,
        host_cached_tokens=0,
        e2e_latency_s=max(now - arrival, 0.0),
    )


__all__ = [
    "MIN_TOKENS_PER_RUNNING",
    "EngineProcess",
    "EngineSpec",
    "EngineStartError",
    "build_engine_loop",
    "engine_main",
    "freeze_startup_heap",
]

"""The requests a decode round finished leave the running batch in one native call
(``DecodeBatch.retire``, ``radixsched/_native/decode.cpp``), where that call does exactly what
``NativeScheduler._retire_finished``'s Python does: settle the rows that may have finished, mark
each finished one as ``Scheduler.check_finish`` does, remove their rows from the batch and its
columns, release their KV (``NativeKVManager.release``, caching it) and forget them
(``Scheduler._forget``), in that order.

The call covers a row only when it cannot stop early (no stop ids, no EOS it heeds: its
``check_finish`` is the length test); it declines, changing nothing, on any other row, and for
a scheduler whose finish hooks are not the reference's (a subclass overriding them)."""

from __future__ import annotations

from typing import Any, Protocol

from radixsched.clock import Clock
from radixsched.native.kv import NativeKVManager
from radixsched.queue import WaitingQueue
from radixsched.request import FINISHED_BY_LENGTH, Req
from radixsched.scheduler import Scheduler, StepOutcome


class Retiring(Protocol):
    """What of the accelerated scheduler (``native.scheduler.NativeScheduler``) the call reads and
    sets (spelled out here: that module imports this one)."""

    batch: Any  # NativeRunningBatch: ``cols`` and ``reqs``
    unsettled: bool
    runner: Any
    allocator: Any
    clock: Clock
    _by_rid: dict[str, Req]
    batch_is_full: bool

    @property
    def kv(self) -> NativeKVManager: ...

    @property
    def queue(self) -> WaitingQueue: ...


_HOOKS = ("check_finish", "_release_finished", "_forget")
_covers: dict[tuple[type, type, type], bool] = {}


def reference_hooks(sched: Retiring) -> bool:
    """Whether the native call does what this scheduler's finish hooks do (asked once per
    scheduler, queue and KV manager class)."""
    key = (type(sched), type(sched.queue), type(sched.kv))
    got = _covers.get(key)
    if got is None:
        got = _covers[key] = (
            all(getattr(key[0], h) is getattr(Scheduler, h) for h in _HOOKS)
            and key[1].forget is WaitingQueue.forget
            and key[2] is NativeKVManager
        )
    return got


def retire(sched: Retiring, maybe: list[int], out: StepOutcome) -> bool:
    """``_retire_finished(maybe, out)`` in one native call; False when it declined (nothing
    changed: the Python path runs)."""
    cols = sched.batch.cols
    if cols is None or not reference_hooks(sched):
        return False
    unsettled = sched.unsettled
    tokens_at: Any = None
    stand_in: Any = None
    if unsettled:  # ``settle``'s arguments (the runner is a multi-step one: it jumped)
        runner: Any = sched.runner  # ``sched.jumper`` (a cast), without its property call
        tokens_at, stand_in = runner.tokens_at, runner.native_tokens()
    n = cols.retire(
        maybe,
        unsettled,
        tokens_at,
        stand_in,
        sched.allocator,
        sched.kv.native,
        sched.batch.reqs,
        out.finished,
        FINISHED_BY_LENGTH,
        sched.clock.now,
        sched._by_rid,
        sched.queue._seq_of,
    )
    if n is None:
        return False
    if n:
        sched.batch_is_full = False  # ``_release_finished``'s
    return True

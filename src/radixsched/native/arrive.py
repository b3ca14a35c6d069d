"""The simulator's per-step reads and its arrivals, with fewer Python calls.

- ``add_arrivals`` (``arrivals``: bound to a scheduler once):
  ``Scheduler.add_request(r, now=r.arrival_time)`` of several requests in a row (arrivals the loop delivers back to back, no step between), their matching in one
  native call (``NativeWaitingQueue.add_many``). Nothing an arrival does reads what a later
  arrival's door check writes (the rid table aside, updated in order), and no door check reads
  the queue, so the door checks first, then the queue's adds, give what one request after the
  other gives.
- ``lean_reads``: the lists and counters behind ``is_idle``, ``len(waiting)``,
  ``num_running()`` and ``kv_usage()``, for a scheduler whose properties are the reference's
  over the native core's (the same values, read without a method call each)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from radixsched.native import core
from radixsched.native.queue import NativeWaitingQueue
from radixsched.native.scheduler import NativeScheduler
from radixsched.request import Req
from radixsched.roles import Role
from radixsched.scheduler import Scheduler

_READS = ("waiting", "running", "is_idle", "num_running", "kv_usage")


class LeanReads(NamedTuple):
    """What the reference's reads compute from: ``waiting`` is ``queue.reqs``, ``running``
    is ``batch.reqs`` (neither list is ever rebound), ``is_idle`` is both empty and no chunked
    request (the role has nothing of its own), ``kv_usage()`` is
    ``(capacity - (free() + evictable())) / capacity``."""

    waiting: list[Req]
    running: list[Req]
    free: Callable[[], int]
    evictable: Callable[[], int]
    capacity: int


def lean_reads(sched: Scheduler) -> LeanReads | None:
    """The reads behind ``sched``'s properties where they are the reference's over the native
    core's counters (None otherwise: read the properties)."""
    cls = type(sched)
    if not isinstance(sched, NativeScheduler) or cls._room is not NativeScheduler._room:
        return None
    if any(getattr(cls, a) is not getattr(Scheduler, a) for a in _READS):
        return None
    if type(sched.role).idle is not Role.idle:
        return None
    return LeanReads(
        sched.queue.reqs, sched.batch.reqs, sched._free_size, sched._evictable_size, sched.capacity
    )


def add_arrivals(sched: Scheduler, reqs: Sequence[Req]) -> None:
    """``sched.add_request(r, now=r.arrival_time)`` for each of ``reqs``, in order; their
    matching in one native call where the role queues arrivals in the native queue without a
    limit (``arrivals``)."""
    arrivals(sched)(reqs)


def arrivals(sched: Scheduler) -> Callable[[Sequence[Req]], None]:
    """``add_arrivals`` bound to ``sched``: what it asks of the setup (the classes, the role's
    limit, the door's constants: fixed for the run) asked once, here."""
    queue = sched.queue
    if (
        type(sched).add_request is not Scheduler.add_request
        or type(sched.role).enqueue is not Role.enqueue
        or sched.role.queue_limit is not None
        or not isinstance(queue, NativeWaitingQueue)
        or type(queue).add is not NativeWaitingQueue.add
    ):

        def one_by_one(reqs: Sequence[Req]) -> None:
            for r in reqs:
                sched.add_request(r, now=r.arrival_time)

        return one_by_one
    cfg = sched.config
    prio, default = cfg.enable_priority_scheduling, cfg.default_priority_value
    by_rid, add_many = sched._by_rid, queue.add_many
    p, capacity, max_req_len = _door_constants(sched)
    native = core()
    assert native is not None, "the native queue runs over the native core"
    door_pass = native.door_pass

    def one(r: Req, processed: int, accepted: list[Req]) -> None:
        """``add_request`` of ``r`` up to its enqueue: the plain door (``_door_constants``),
        inline: a new rid, no priority, and the door's arithmetic says it accepts without
        touching the request. Else the door decides."""
        t, rid = r.arrival_time, r.rid
        max_new, n = r.sampling.max_new_tokens, len(r.prompt_ids) + len(r.output_ids)
        if (
            rid in by_rid
            or r.priority is not None
            or max_new < 1
            or n >= max_req_len
            or max_new > min(max_req_len - n - 1, capacity - -(-n // p) * p - p - 1)
        ):
            err = sched._door_check(r)
            if err is not None:
                sched._reject(r, *err)
                return
        if prio and r.priority is None:
            r.priority = default
        r.queue_entry_time = r.arrival_time = r.times.arrival = t
        r.queue_entry_processed_tokens = processed
        by_rid[rid] = r
        accepted.append(r)

    def arrive(reqs: Sequence[Req]) -> None:
        """``one`` of each request in order: natively (``_core.door_pass``, the same reads,
        tests and writes) while each passes the plain door, here where the door decides."""
        accepted: list[Req] = []
        processed, i, n = sched.processed_tokens, 0, len(reqs)
        while i < n:
            i = door_pass(
                reqs, i, accepted, by_rid, processed, p, capacity, max_req_len, prio, default
            )
            if i < n:
                one(reqs[i], processed, accepted)
                i += 1
        add_many(accepted)

    return arrive


def _door_constants(sched: Scheduler) -> tuple[int, int, int]:
    """(page size, capacity, the longest request): the scheduler's constants of the plain
    door (``arrive``): ``_door_check`` accepts a request with a new rid and no priority
    without touching it when it has at least one token to generate and a prompt that fits
    with room for all of them (``max_new >= 1`` there, so ``max_new <= min(longest - n - 1,
    capacity - ceil_page(n) - page - 1)`` also says the prompt fits). Else it decides."""
    capacity = sched.capacity
    return sched.page_size, capacity, min(sched.context_len - 1, capacity - 1)

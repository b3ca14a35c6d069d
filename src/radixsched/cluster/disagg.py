"""Prefill/decode disaggregation: the two split roles a ``Scheduler`` can be built in.

SGLang's ``--disaggregation-mode`` (``SchedulerConfig.disaggregation_mode``) names the role
(``ROLES``), which whoever builds the scheduler passes in (``radixsched.native.build.build_scheduler``
looks it up). Each role overrides the hooks of ``radixsched.roles.Role`` where its side
differs from a co-located scheduler, so the same scheduler loop runs every role and only the
places a request waits at differ. A request of a split deployment has one copy on a prefill
instance and one on a decode instance; whoever drives them (``sim.deploy.disagg``) carries the
handshake and the KV between the two.

Prefill role (``PrefillRole``):

1. ``add_request``: door checks as co-located, then the *bootstrap queue* (the decode side has
   not preallocated its KV yet); its ``max_new_tokens`` becomes 1, so the adder reserves
   nothing for decoding;
2. ``bootstrapped``: the decode side is ready; the request joins the waiting queue and is
   scheduled by the configured policy against this instance's radix cache;
3. its first token finishes it here: its KV is checkpointed into the cache and stays locked
   (*in flight*) until ``transfer_done``, then released into the cache like any finished
   request. The waiting-prefix refresh touches the head of the bootstrap queue (at most
   ``waiting_prefix_refresh_bootstrap_max``) ahead of the waiting queue.

Decode role (``DecodeRole``): no prefix matching (the cache is off), no waiting-prefix refresh,
never a prefill.

1. ``add_request``: door checks, then the *preallocation queue*;
2. ``pop_preallocated``: in order (by priority under priority scheduling), while a request
   slot is free and memory allows, the prompt's KV slots are allocated (*transferring*) and the
   request is returned: its prefill may start. Memory allows when ``pages(prompt) +
   num_reserved_decode_tokens`` fits in free memory less ``num_reserved_decode_tokens`` per
   active request (running, transferring, arrived) and less what offloaded requests need. The
   first request that does not fit stops the pass (it holds the ones behind it back on their
   prefill side); an instance with nothing active takes its head request whatever the
   reservation (the door checked that it fits alone). Between calls only decoding changes
   the pool, which only shrinks this budget, so calling after every step and every arrival
   decides as calling before every decode step would;
3. ``kv_arrived``: the KV and the first token landed; at the next ``step`` the request joins
   the running batch without a forward (its first token is delivered then) and decodes;
4. a request retracted for decode memory is *offloaded* (its KV kept in host memory; the copy
   is not timed) and resumes, ahead of new preallocations, when memory allows. The runner
   keeps it (``KVOffloadRunner``): a decode instance is built only on a runner that can.

Ownership (``Scheduler.check_integrity``): an in-flight prefill request holds its lock and its
page tail; a transferring or arrived decode request owns its row; bootstrap, preallocation
and offloaded requests hold nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, cast

import numpy as np

from radixsched.cache.base import IntegrityError, ceil_page
from radixsched.config import SchedulerConfig
from radixsched.kv import row_capacity
from radixsched.request import Req, SlotArray
from radixsched.roles import CoLocated, Role
from radixsched.running import prio_value
from radixsched.scheduler import Scheduler, StepOutcome


class PrefillRole(Role):
    """The prefill side's bootstrap queue and in-flight transfers (see the module docstring)."""

    mode = "prefill"

    def __init__(self, sched: Scheduler) -> None:
        super().__init__(sched)
        sched.queue.ahead = self.refresh_head
        self.bootstrap: dict[str, Req] = {}  # rid -> request, in arrival order
        self.inflight: dict[str, Req] = {}  # rid -> prefilled request whose KV is being sent
        self.bootstrap_tokens = 0  # prompt tokens bootstrapping (a router's load reads it)

    @property
    def queue_limit(self) -> int | None:
        return None  # as in SGLang: only a co-located scheduler has a queue limit

    def enqueue(self, req: Req) -> None:
        req.sampling = dataclasses.replace(req.sampling, max_new_tokens=1)
        self.bootstrap[req.rid] = req
        self.bootstrap_tokens += req.prompt_len

    def bootstrapped(self, rid: str, now: float | None = None) -> bool:
        """The decode side holds KV for ``rid``: it joins the waiting queue at ``now`` (default:
        the scheduler's clock). False when ``rid`` is not bootstrapping here."""
        req = self.bootstrap.pop(rid, None)
        if req is None:
            return False
        self.bootstrap_tokens -= req.prompt_len
        s = self.sched
        req.queue_entry_time = s.clock.now() if now is None else now
        req.queue_entry_processed_tokens = s.processed_tokens
        s.queue.add(req)
        return True

    def prefilled(self, req: Req) -> None:
        """``req`` produced its first token: its KV goes into the cache and stays locked
        until the transfer is done."""
        self.sched.kv.checkpoint(req, req.kv_len)
        self.inflight[req.rid] = req

    def transfer_done(self, rid: str) -> bool:
        """``rid``'s KV reached the decode side: its slots and lock are released (the prompt
        stays cached)."""
        req = self.inflight.pop(rid, None)
        if req is None:
            return False
        s = self.sched
        s.kv.release(req, cache_kv=True)
        s._forget(req)
        return True

    def refresh_head(self) -> list[Req]:
        """Bootstrapping requests the waiting-prefix refresh touches first (oldest first)."""
        n = self.sched.config.waiting_prefix_refresh_bootstrap_max
        if not n or not self.bootstrap:
            return []
        out: list[Req] = []
        for r in self.bootstrap.values():
            if len(out) == n:
                break
            out.append(r)
        return out

    def drop(self, req: Req, *, cache_kv: bool) -> bool:
        """Take ``req`` out of this role's queues, releasing what it holds."""
        if self.bootstrap.pop(req.rid, None) is not None:
            self.bootstrap_tokens -= req.prompt_len
            return True
        if self.inflight.pop(req.rid, None) is not None:
            self.sched.kv.release(req, cache_kv=cache_kv)
            return True
        return False

    def holders(self) -> list[Req]:
        return list(self.inflight.values())

    def check_integrity(self) -> None:
        if self.bootstrap_tokens != sum(r.prompt_len for r in self.bootstrap.values()):
            raise IntegrityError(f"bootstrap token count {self.bootstrap_tokens} drifted")
        for r in self.bootstrap.values():
            if r.lock_node is not None or len(r.kv_row):
                raise IntegrityError(f"bootstrapping request {r.rid} holds a lock or KV slots")
        for r in self.inflight.values():
            if r.kv_len < r.prompt_len or (r.lock_node is None and r.cache_protected_len):
                raise IntegrityError(f"in-flight request {r.rid} lost its prompt's KV")


class KVOffloadRunner(Protocol):
    """What a decode instance's runner adds to ``ModelRunner``: it retracts a request by
    keeping its KV in host memory, since it cannot prefill the request again."""

    def offload_kv(self, req: Req, slots: SlotArray) -> None:
        """Copy ``req``'s KV held in ``slots`` (positions ``0 .. len(slots) - 1``) to host
        memory before the scheduler frees them; a runner whose KV has content keeps it until
        ``reload_kv``."""

    def reload_kv(self, req: Req, slots: SlotArray) -> None:
        """Write back the KV ``offload_kv`` kept for ``req`` into ``slots`` (new slots, the
        same positions) and forget the host copy."""


class DecodeRole(Role):
    """The decode side's preallocation, transfer, arrival and offload queues."""

    mode = "decode"
    prefills = False
    sched: Scheduler

    def __init__(self, sched: Scheduler) -> None:
        super().__init__(sched)
        runner = sched.runner
        if not all(callable(getattr(runner, m, None)) for m in ("offload_kv", "reload_kv")):
            raise TypeError(
                f"a decode instance needs a runner that keeps retracted KV in host memory "
                f"(offload_kv, reload_kv); {type(runner).__name__} has none"
            )
        self.runner = cast(KVOffloadRunner, runner)
        self.prealloc: list[Req] = []  # waiting for memory (their prefill waits too)
        self.transferring: dict[str, Req] = {}  # rid -> request whose KV slots are allocated
        self.arrived: list[Req] = []  # KV landed (or reloaded): join at the next step
        self.offloaded: list[Req] = []  # retracted, KV in host memory
        # What a router's load reads, kept as the queues change: KV tokens asked for (prompts
        # waiting for memory, offloaded requests) and decode tokens to come outside the batch.
        self.queued_kv = 0
        self.pending_decode = 0

    @classmethod
    def configure(cls, config: SchedulerConfig) -> SchedulerConfig:
        """A decode instance matches no prefix (its cache is off, its queue fcfs: requests
        arrive with their KV) and refreshes none."""
        return (
            super()
            .configure(config)
            .replace(
                schedule_policy="fcfs",
                disable_radix_cache=True,
                enable_waiting_prefix_refresh=False,
            )
        )

    @property
    def queue_limit(self) -> int | None:
        return None  # as in SGLang: only a co-located scheduler has a queue limit

    @property
    def idle(self) -> bool:
        return not self.arrived

    def enqueue(self, req: Req) -> None:
        self.prealloc.append(req)
        self.queued_kv += req.prompt_len
        self.pending_decode += req.remaining_new_tokens

    def _budget(self) -> tuple[int, int]:
        """(free KV tokens after the reservations, free request slots)."""
        s = self.sched
        reserve = s.config.num_reserved_decode_tokens
        active = len(s.running) + len(self.transferring) + len(self.arrived)
        budget = s.allocator.available_size() + s.cache.evictable_size() - reserve * active
        return budget, s.max_running_requests - active

    def pop_preallocated(self) -> list[Req]:
        """Resume offloaded requests, then preallocate new ones (module docstring); returns
        the newly preallocated requests, whose prefill may start now."""
        s = self.sched
        page, reserve = s.page_size, s.config.num_reserved_decode_tokens
        budget, slots = self._budget()
        empty = slots == s.max_running_requests  # nothing active: the head may take it all

        def fits(need: int) -> bool:
            # An empty instance waives the reservation for its head request (the door
            # checked that it fits alone), so no request can wait forever.
            return need + reserve <= budget or (empty and need <= s._room())

        while self.offloaded and slots > 0:
            r = self.offloaded[0]
            need = ceil_page(r.fill_len - 1, page)
            if not fits(need):
                break
            self.offloaded.pop(0)
            self.queued_kv -= r.fill_len
            self._allocate_row(r, need, r.fill_len - 1)
            self.runner.reload_kv(r, r.kv_row[: r.kv_len])
            self.arrived.append(r)
            budget -= need + reserve
            slots -= 1
            empty = False
        budget -= sum(ceil_page(r.fill_len - 1, page) + reserve for r in self.offloaded)
        empty = empty and not self.offloaded
        if not self.prealloc or slots <= 0:
            return []
        if s.config.enable_priority_scheduling:
            sign = s.config.priority_sign
            self.prealloc.sort(key=lambda r: sign * prio_value(r, sign))
        taken = 0
        for r in self.prealloc:
            need = ceil_page(r.prompt_len, page)
            if taken == slots or not fits(need):
                break
            self._allocate_row(r, need, 0)
            self.queued_kv -= r.prompt_len
            self.transferring[r.rid] = r
            budget -= need + reserve
            taken += 1
            empty = False
        out, self.prealloc = self.prealloc[:taken], self.prealloc[taken:]
        return out

    def _allocate_row(self, r: Req, slots: int, computed: int) -> None:
        """``r`` owns ``slots`` fresh KV slots, of which the first ``computed`` hold KV."""
        buf = np.empty(max(row_capacity(r), slots), dtype=self.sched.kv.row_dtype)
        if slots:
            buf[:slots] = self.sched.kv.alloc(slots)
        r.kv_buf, r.kv_row = buf, buf[:slots]
        r.kv_len = r.prefix_len = r.extend_end = computed
        r.cache_protected_len = r.cache_inserted_len = 0
        r.lock_node = r.last_node = None

    def kv_arrived(self, rid: str, first_token: int) -> bool:
        """The prompt's KV and the first token landed in the preallocated slots."""
        r = self.transferring.pop(rid, None)
        if r is None:
            return False
        self.pending_decode -= r.remaining_new_tokens
        r.output_ids.append(first_token)
        self.pending_decode += r.remaining_new_tokens
        r.kv_len = r.prefix_len = r.extend_end = r.prompt_len
        self.arrived.append(r)
        return True

    def join(self, now: float) -> tuple[list[Req], list[Req]]:
        """Arrived requests join the running batch (a prebuilt batch: no forward); a first
        token is delivered now. Returns (requests whose first token was delivered, those
        of them finished by it)."""
        s = self.sched
        joined, self.arrived = self.arrived, []
        delivered, finished, running = [], [], []
        for r in joined:
            self.pending_decode -= r.remaining_new_tokens
            t = r.times
            if not t.token_times:  # a first token, not a reload
                t.token_times.append(now)
                t.first_token = now
                delivered.append(r)
                s.check_finish(r)
            if r.finished:
                s.kv.release(r, cache_kv=False)
                s._forget(r)
                finished.append(r)
            else:
                running.append(r)
        s.batch.extend(running)
        return delivered, finished

    def step(self, horizon: float | None = None) -> StepOutcome | None:
        """The instance's step: arrived requests join the running batch (their first token is
        delivered now), then one decode round (never a prefill)."""
        s = self.sched
        delivered, done = self.join(s.clock.now())
        # A request done at its first token freed memory the preallocation may use: one
        # decode step, so that it is tried again right after (as between single steps).
        out = s.decode_round(s.clock.now() if done else horizon)
        if out is None:
            if not delivered:
                return None
            out = StepOutcome("decode", 0.0, 0, num_steps=0)
        out.finished[:0] = done
        out._tokens[:0] = [(r, [r.output_ids[0]]) for r in delivered]
        return out

    def retracting(self, req: Req) -> None:
        """Its KV goes to host memory (the instance cannot prefill it again)."""
        self.runner.offload_kv(req, req.kv_row[: req.kv_len])

    def requeue(self, reqs: list[Req]) -> None:
        """Retracted requests keep their KV in host memory until they fit again."""
        self.offloaded.extend(reqs)
        self.queued_kv += sum(r.fill_len for r in reqs)
        self.pending_decode += sum(r.remaining_new_tokens for r in reqs)

    def drop(self, req: Req, *, cache_kv: bool) -> bool:
        if req in self.prealloc:
            self.prealloc.remove(req)
            self.queued_kv -= req.prompt_len
        elif req in self.offloaded:
            self.offloaded.remove(req)
            self.queued_kv -= req.fill_len
        elif self.transferring.pop(req.rid, None) is not None or req in self.arrived:
            if req in self.arrived:
                self.arrived.remove(req)
            self.sched.kv.release(req, cache_kv=False)
        else:
            return False
        self.pending_decode -= req.remaining_new_tokens
        return True

    def holders(self) -> list[Req]:
        return [*self.transferring.values(), *self.arrived]

    def check_integrity(self) -> None:
        queued = sum(r.prompt_len for r in self.prealloc) + sum(r.fill_len for r in self.offloaded)
        pending = sum(
            r.remaining_new_tokens
            for r in (*self.prealloc, *self.transferring.values(), *self.arrived, *self.offloaded)
        )
        if (queued, pending) != (self.queued_kv, self.pending_decode):
            raise IntegrityError(
                f"decode load counters drifted: {self.queued_kv} queued KV tokens and "
                f"{self.pending_decode} pending decode tokens, the queues hold {queued} and "
                f"{pending}"
            )
        for r in (*self.prealloc, *self.offloaded):
            if r.lock_node is not None or len(r.kv_row):
                raise IntegrityError(f"queued decode request {r.rid} holds a lock or KV slots")
        for r in self.transferring.values():
            if r.lock_node is not None or r.kv_len or len(r.kv_row) < r.prompt_len:
                raise IntegrityError(f"transferring request {r.rid} lacks its prompt's slots")
        for r in self.arrived:
            if r.lock_node is not None or r.kv_len != r.fill_len - 1 or len(r.kv_row) < r.kv_len:
                raise IntegrityError(f"arrived request {r.rid} lacks the slots of its KV")


# ``disaggregation_mode`` -> the role a scheduler of that mode is built with.
ROLES: dict[str, type[Role]] = {r.mode: r for r in (CoLocated, PrefillRole, DecodeRole)}


def prefill_role(sched: Scheduler) -> PrefillRole:
    """The role of a scheduler built as a prefill instance."""
    role = sched.role
    assert isinstance(role, PrefillRole), "not a prefill instance"
    return role


def decode_role(sched: Scheduler) -> DecodeRole:
    """The role of a scheduler built as a decode instance."""
    role = sched.role
    assert isinstance(role, DecodeRole), "not a decode instance"
    return role


__all__ = ["ROLES", "DecodeRole", "KVOffloadRunner", "PrefillRole", "decode_role", "prefill_role"]

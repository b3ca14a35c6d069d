"""The event loop of a split prefill/decode deployment (``sim.deploy.disagg``).

Events, each on one request's ``Leg``: the handshake reaching the prefill instance (BOOT), the
prefilled KV being ready to send (READY: the links serve transfers in the order they become
ready), and the KV landing (LAND). Arrivals come from the workload.

The loop always steps the instance furthest behind, and delivers the earliest event once no
busy instance still has a step starting before it (the co-located loop's rule). A step may
run several decode steps or middle chunks at once up to a *horizon*: the earliest time an
event could reach that instance, counting events not created yet:

- every instance: the next arrival (routing reads every instance's load);
- a decode instance: its pending landings; its pending READY and BOOT events plus the link
  latency (a landing follows them); busy prefill instances' clocks plus the link latency (their
  next prefills land no earlier); blocked prefill instances' next events plus the latency
  (they resume only then). A handshake a decode instance has yet to send starts a prefill
  whose KV lands on that instance only: an idle prefill instance then prefills nothing else,
  a busy one is bounded by its clock, and a blocked one admits nothing it could not before;
- a prefill instance: its pending handshakes and landings (they release memory), its READY
  events plus the latency; decode instances with requests waiting for memory, from their
  clock or next event, plus the bootstrap latency.

Every event is then seen by the instances it concerns before they step past it, whatever the
grouping: the accelerated schedulers give the reference's single-step schedule bit for bit
(tests/test_disagg_sim.py)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

from radixsched.cluster.disagg import decode_role, prefill_role
from radixsched.request import Req
from radixsched.results.series import TimeSeries

BOOT, READY, LAND = 0, 1, 2


class Cluster:
    """One run's instances, routers, links, legs and pending events."""

    def __init__(
        self,
        instances: Sequence[Any],
        links: Any,
        router: Any,
        decode_router: Any,
        *,
        check: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        from radixsched.sim.deploy.legs import DECODE, PREFILL

        self.instances = list(instances)
        self.pre = [i for i in instances if i.role == PREFILL]
        self.dec = [i for i in instances if i.role == DECODE]
        self.links = links
        self.latency = links.link.latency_s
        self.bootstrap = links.link.bootstrap_s
        self.router = router
        self.decode_router = decode_router
        self.check = check
        self.on_progress = on_progress
        self.series = TimeSeries()
        self.legs: dict[str, Any] = {}
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        # Per instance: (time it matters from, event seq) of the pending events concerning it.
        self.concerns: dict[int, list[tuple[float, int]]] = {i.idx: [] for i in self.instances}
        self.live: set[int] = set()
        self.done = 0
        self.total = 0

    # ---- events ---------------------------------------------------------------------------------
    def push(self, t: float, kind: int, leg: Any) -> None:
        seq = self.seq
        self.seq += 1
        heapq.heappush(self.events, (t, seq, kind, leg))
        self.live.add(seq)
        pi, di = self.pre[leg.p], self.dec[leg.d]
        if kind == LAND:
            self._concern(pi.idx, t, seq)
            self._concern(di.idx, t, seq)
        elif kind == BOOT:
            self._concern(pi.idx, t, seq)
            self._concern(di.idx, t + self.latency, seq)
        else:  # READY: its landing, no earlier than the links allow now
            landing = self.links.earliest_landing(leg.p, leg.d, t, leg.pre.prompt_len)
            self._concern(pi.idx, landing, seq)
            self._concern(di.idx, landing, seq)

    def _concern(self, idx: int, t: float, seq: int) -> None:
        heapq.heappush(self.concerns[idx], (t, seq))

    def next_concern(self, inst: Any) -> float:
        """When the earliest pending event concerning ``inst`` matters to it (inf: none)."""
        heap = self.concerns[inst.idx]
        while heap and heap[0][1] not in self.live:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    # ---- horizons ---------------------------------------------------------------------------------
    def horizon(self, inst: Any, next_arrival: float) -> float:
        """The earliest time an event could reach ``inst`` (module docstring)."""
        t = min(next_arrival, self.next_concern(inst))
        if inst.role == "decode":
            for x in self.pre:
                if x.blocked:
                    t = min(t, self.next_concern(x) + self.latency)
                elif not x.sched.is_idle:
                    t = min(t, x.clock.now() + self.latency)
            return t
        for x in self.dec:
            if decode_role(x.sched).prealloc:
                start = self.next_concern(x)
                if not x.sched.is_idle:
                    start = min(start, x.clock.now())
                t = min(t, start + self.bootstrap)
        return t

    @staticmethod
    def furthest_behind(instances: Sequence[Any], before: float) -> Any:
        """The busy instance with the earliest clock before ``before`` (the first on a tie)."""
        first = None
        for x in instances:
            if x.blocked or x.sched.is_idle or x.clock.now() >= before:
                continue
            if first is None or x.clock.now() < first.clock.now():
                first = x
        return first

    def pick(self, next_arrival: float, next_event: float) -> tuple[Any, float]:
        """The instance to step and its horizon, or (None, inf) when the next event is due.
        A prefill instance that can step before anything could reach it goes first, however
        far ahead: its clock bounds the decode instances' horizons, which it thus widens.
        Otherwise the instance furthest behind steps (always safe: nothing can reach it
        before its clock)."""
        due = min(next_arrival, next_event)
        p = self.furthest_behind(self.pre, due)
        if p is not None:
            h = self.horizon(p, next_arrival)
            if p.clock.now() < h:
                return p, h
        x = self.furthest_behind(self.instances, due)
        if x is None:
            return None, math.inf
        return x, self.horizon(x, next_arrival)

    # ---- the loop ---------------------------------------------------------------------------------
    def run(self, reqs: Sequence[Req]) -> None:
        n = self.total = len(reqs)
        i = 0
        last_t = 0.0
        while True:
            ta = reqs[i].arrival_time if i < n else math.inf
            te = self.events[0][0] if self.events else math.inf
            inst, h = self.pick(ta, te)
            if inst is not None:
                start = inst.clock.now()
                self.step(inst, None if h == math.inf else h)
                last_t = max(last_t, start)
                self.sample(last_t)
                if self.check:
                    self.check_conservation()
                continue
            if ta == te == math.inf:
                break
            if te <= ta:
                t, seq, kind, leg = heapq.heappop(self.events)
                self.live.discard(seq)
                (self.bootstrapped, self.ready, self.landed)[kind](leg, t)
            else:
                self.arrive(reqs[i])
                i += 1
            if self.check:
                self.check_conservation()
        stuck = [x for x in self.instances if x.blocked or not x.sched.is_idle]
        if stuck:
            x = stuck[0]
            raise RuntimeError(
                f"{x.role} instance {x.local} stalled with {len(x.sched.waiting)} waiting requests"
            )
        if self.on_progress is not None:
            self.on_progress(n, n)

    def step(self, inst: Any, horizon: float | None) -> None:
        out = inst.sched.step(horizon)
        if self.check:
            inst.sched.check_integrity()
        if out is None:
            self.stalled(inst)
            return
        if inst.role == "prefill":
            for copy in out.finished:  # prefilled: the KV is ready to send
                self.router.on_finish(copy, inst.local)
                ready = copy.times.first_token
                assert ready is not None
                self.push(ready, READY, self.legs[copy.rid])
            return
        for r in out.finished:
            self.decode_router.on_finish(r, inst.local)
        if out.finished:
            self.report_finished(len(out.finished))
        self.preallocate(inst)

    def stalled(self, inst: Any) -> None:
        """A step that ran nothing: a prefill instance whose memory is held by in-flight KV
        waits for its next event; anything else is a scheduler bug."""
        if inst.role == "prefill" and prefill_role(inst.sched).inflight:
            inst.blocked = True
            return
        s = inst.sched
        raise RuntimeError(
            f"{inst.role} instance {inst.local} has work but could not schedule it "
            f"(waiting={len(s.waiting)}, running={len(s.running)})"
        )

    @staticmethod
    def wake(inst: Any, t: float) -> None:
        """An event reaches ``inst`` at ``t``: an idle or blocked instance resumes then."""
        if inst.blocked or inst.sched.is_idle:
            inst.clock.jump_to(t)
        inst.blocked = False

    # ---- deliveries -------------------------------------------------------------------------------
    def arrive(self, req: Req) -> None:
        from radixsched.sim.deploy.legs import Leg, decode_load, prefill_load
        from radixsched.sim.deploy.replicas import clone_request

        t = req.arrival_time
        p = self.router.route(req, [prefill_load(x) for x in self.pre], t)
        d = self.decode_router.route(req, [decode_load(x) for x in self.dec], t)
        pi, di = self.pre[p], self.dec[d]
        copy = clone_request(req)
        pi.reqs.append(copy)
        if pi.sched.is_idle and not pi.blocked:
            pi.clock.jump_to(t)
        if not pi.sched.add_request(copy, now=t).accepted:
            req.finish = copy.finish
            self.report_finished(1)
            return
        di.reqs.append(req)
        self.wake(di, t)
        if not di.sched.add_request(req, now=t).accepted:
            message = req.finish.message if req.finish is not None else "rejected"
            pi.sched.abort(copy.rid, message, 400)
            self.report_finished(1)
            return
        self.legs[req.rid] = Leg(req, copy, p, d)
        self.preallocate(di)

    def preallocate(self, di: Any) -> None:
        now = di.clock.now()
        for r in decode_role(di.sched).pop_preallocated():
            self.push(now + self.bootstrap, BOOT, self.legs[r.rid])

    def bootstrapped(self, leg: Any, t: float) -> None:
        pi = self.pre[leg.p]
        self.wake(pi, t)
        leg.bootstrapped_s = t
        prefill_role(pi.sched).bootstrapped(leg.pre.rid, now=t)

    def ready(self, leg: Any, t: float) -> None:
        start, landing = self.links.send(leg.p, leg.d, t, leg.pre.prompt_len)
        leg.sent_s = start
        self.push(landing, LAND, leg)

    def landed(self, leg: Any, t: float) -> None:
        pi, di = self.pre[leg.p], self.dec[leg.d]
        prefill_role(pi.sched).transfer_done(leg.pre.rid)
        if pi.blocked:
            self.wake(pi, t)
        leg.landed_s = t
        req, copy = leg.req, leg.pre
        req.times.first_scheduled = copy.times.first_scheduled
        req.cached_tokens = copy.cached_tokens
        req.host_cached_tokens = copy.host_cached_tokens
        req.computed_prefill_tokens = copy.computed_prefill_tokens
        self.wake(di, t)
        decode_role(di.sched).kv_arrived(req.rid, copy.output_ids[0])

    def report_finished(self, k: int) -> None:
        self.done += k
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)

    # ---- observation ------------------------------------------------------------------------------
    def sample(self, t: float) -> None:
        """Waiting = not yet prefilled (bootstrapping or queued on a prefill instance);
        running = on a decode instance; KV usage = the mean over every instance."""
        waiting = running = cached = prompt = 0
        kv = 0.0
        for x in self.pre:
            s = x.sched
            waiting += len(s.waiting) + len(prefill_role(s).bootstrap)
            kv += s.kv_usage()
            cached += s.stats.cached_prompt_tokens
            prompt += s.stats.prompt_tokens
        for x in self.dec:
            running += x.sched.num_running()
            kv += x.sched.kv_usage()
        self.series.append(t, waiting, running, kv / len(self.instances), cached, prompt)

    def check_conservation(self) -> None:
        """Every admitted, unfinished request's KV is on exactly one instance or in flight:

        - until its prefill ends, on its prefill instance only (waiting, chunked, prefilling),
          its decode copy holding at most empty preallocated slots;
        - in flight: locked on its prefill instance, preallocated on its decode instance;
        - landed: on its decode instance only (arrived, running, or offloaded to host memory).

        Raises ``IntegrityError`` naming the request."""
        from radixsched.cache.base import IntegrityError

        where: dict[str, list[str]] = {}
        for x in self.instances:
            for r in x.sched.holders():
                where.setdefault(r.rid, []).append(f"{x.role}{x.local}")
        for rid, leg in self.legs.items():
            req = leg.req
            held = where.get(rid, [])
            if req.finished:
                if held:
                    raise IntegrityError(f"{rid} finished but {held} still hold its KV")
                continue
            pre, dec = f"prefill{leg.p}", f"decode{leg.d}"
            if any(h not in (pre, dec) for h in held) or len(held) != len(set(held)):
                raise IntegrityError(f"{rid}: KV on instances {held}, not only {pre} and {dec}")
            prole = prefill_role(self.pre[leg.p].sched)
            drole = decode_role(self.dec[leg.d].sched)
            inflight = rid in prole.inflight
            if leg.landed_s is not None:
                if pre in held or inflight:
                    raise IntegrityError(f"{rid} landed on {dec} but {pre} still holds its KV")
                if not (req in drole.offloaded or dec in held):
                    raise IntegrityError(f"{rid} landed on {dec} but no instance holds its KV")
            elif inflight and rid not in drole.transferring:
                raise IntegrityError(f"{rid} is in flight without preallocated slots on {dec}")
            elif req.kv_len:
                raise IntegrityError(f"{rid}: {dec} holds KV that was never sent")

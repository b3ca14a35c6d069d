"""Prefill/decode disaggregation in the simulator (``simulate --disaggregation``).

A split deployment: ``--prefill-instances`` prefill instances and ``--decode-instances``
decode instances, each a ``Scheduler`` built in its role (``radixsched.cluster.disagg``) with
its own virtual clock, KV pool and cost model (``--prefill-gpu/--prefill-tp``, ``--decode-gpu/
--decode-tp``; prefill instances have their own radix caches and run the configured policy,
decode instances match nothing). One request's life (``Leg``), SGLang's and Mooncake's:

1. arrival: the router (``--router``, cache-aware by default) picks the prefill instance from
   the prefill loads, the decode router (``--decode-router``, least-load) the decode instance;
   both copies are admitted at the door (either may reject it);
2. the decode instance preallocates the prompt's KV when memory allows (``pop_preallocated``);
   the handshake reaches the prefill instance ``--disaggregation-bootstrap-ms`` later
   (``bootstrapped``); until then the request waits in the prefill side's bootstrap queue,
   so a full decode instance holds its requests back on their prefill instances;
3. the prefill instance schedules and prefills it; its first token finishes it there, its KV
   stays locked while in flight;
4. the transfer (``KVLinks``) starts when the prefill instance's egress and the decode
   instance's ingress are free, takes ``tokens x per-GPU KV bytes / bandwidth`` on them and
   lands ``latency`` later: the prefill instance releases the KV (``transfer_done``, the prompt
   stays in its cache), the decode instance receives it (``kv_arrived``) and delivers the
   first token when the request joins its running batch at its next step.

TTFT is therefore bootstrap wait + prefill queue wait + prefill + transfer + decode queue
wait, each reported by role (``disagg_stats``), with TPOT and every instance's utilisation.

The event loop (``sim.deploy.disagg_loop``) is the co-located one's, each instance stepping up to its
own horizon: the earliest time an event could still reach it. A prefill instance whose waiting
requests cannot be admitted while its memory is held by in-flight KV waits for its next event.
The simulator path never imports torch."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.request import FinishReason, Req
from radixsched.results.stats import JSONValue, Stats
from radixsched.sim.deploy.legs import DECODE, PREFILL, Instance, Leg
from radixsched.sim.deploy.run import SimRun, assemble, end_run
from radixsched.sim.settings.deployment import check_disaggregation, role_specs
from radixsched.sim.settings.simconfig import SimConfig

DEFAULT_DECODE_ROUTER = "least-load"


# ---- the KV transfer model -----------------------------------------------------------------------


@dataclass(frozen=True)
class LinkModel:
    """The link the KV goes over: per-GPU bandwidth (bytes/s, may be inf), fixed latency per
    transfer, and the handshake latency."""

    name: str
    bandwidth: float
    latency_s: float
    bootstrap_s: float

    @classmethod
    def of(cls, sim: SimConfig, gpu_link_bw: float | None = None) -> LinkModel:
        """The link ``sim`` names, its overrides applied. Over NVLink the GPUs' own link is
        the bandwidth (``gpu_link_bw``: the slower side's ``GPUSpec.link_bw``) when given."""
        from radixsched.sim.cost.hardware import get_link

        link = get_link(sim.disaggregation_link)
        bw = sim.disaggregation_link_bandwidth_gb_s
        lat = sim.disaggregation_link_latency_ms
        latency = link.latency_s if lat is None else lat / 1e3
        boot = sim.disaggregation_bootstrap_ms
        bandwidth = link.bandwidth
        if link.name == "nvlink" and gpu_link_bw is not None:
            bandwidth = gpu_link_bw
        return cls(
            link.name,
            bandwidth if bw is None else bw * 1e9,
            latency,
            latency if boot is None else boot / 1e3,
        )

    @classmethod
    def between(cls, sim: SimConfig, pre_cost: Any, dec_cost: Any) -> LinkModel:
        """The link between a prefill and a decode instance of these cost models."""
        gpu_bw = min(float(pre_cost.gpu.link_bw), float(dec_cost.gpu.link_bw))
        return cls.of(sim, gpu_bw)

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "link": self.name,
            "bandwidth_gb_s": self.bandwidth / 1e9 if math.isfinite(self.bandwidth) else None,
            "latency_ms": self.latency_s * 1e3,
            "bootstrap_ms": self.bootstrap_s * 1e3,
        }


def kv_bytes_per_token_per_gpu(cost: Any) -> float:
    """KV bytes of one token that one GPU of an instance holds (its share of the heads)."""
    base = getattr(cost, "base", cost)
    return float(base.kv_bytes_per_token_per_gpu)


class KVLinks:
    """Every prefill instance's egress and decode instance's ingress, each busy with one
    transfer at a time (store and forward, first come first served). Every GPU of an instance
    has its own link, so a transfer moves the larger of the two sides' per-GPU shares of the
    KV: ``tokens x max(per-GPU bytes) / bandwidth`` of busy time, then ``latency``."""

    def __init__(
        self, link: LinkModel, prefill_bytes: float, decode_bytes: float, n_pre: int, n_dec: int
    ) -> None:
        self.link = link
        self.bytes_per_token = max(prefill_bytes, decode_bytes)
        self.egress = [0.0] * n_pre
        self.ingress = [0.0] * n_dec

    def busy_s(self, tokens: int) -> float:
        bw = self.link.bandwidth
        return 0.0 if math.isinf(bw) else tokens * self.bytes_per_token / bw

    def send(self, p: int, d: int, ready: float, tokens: int) -> tuple[float, float]:
        """(start, landing) of a transfer of ``tokens`` tokens' KV ready at ``ready``; the
        links are taken until it has left."""
        start = max(ready, self.egress[p], self.ingress[d])
        busy = self.busy_s(tokens)
        self.egress[p] = self.ingress[d] = start + busy
        return start, start + busy + self.link.latency_s

    def earliest_landing(self, p: int, d: int, ready: float, tokens: int) -> float:
        """No earlier than this can a transfer ready at ``ready`` land (links only get busier)."""
        start = max(ready, self.egress[p], self.ingress[d])
        return start + self.busy_s(tokens) + self.link.latency_s


# ---- metrics by role -----------------------------------------------------------------------------


STAGES: tuple[tuple[str, str], ...] = (
    ("bootstrap_wait_s", "arrival until the handshake reached the prefill instance"),
    ("prefill_queue_wait_s", "handshake until the prefill was first scheduled"),
    ("prefill_s", "prefill start until the first token (chunks included)"),
    ("transfer_s", "first token until the KV landed (link queueing included)"),
    ("link_wait_s", "first token until the link was free (part of transfer_s)"),
    ("decode_queue_wait_s", "KV landed until the request joined the decode batch"),
)


def _stage_samples(legs: Sequence[Leg]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k, _ in STAGES}
    abort = FinishReason.ABORT
    for g in legs:
        r, t = g.req, g.req.times
        if r.finish is None or r.finish.reason is abort or t.first_token is None:
            continue
        first = g.pre.times.first_scheduled
        if g.bootstrapped_s is None or first is None or g.prefilled_s is None:
            continue
        assert g.landed_s is not None and g.sent_s is not None
        out["bootstrap_wait_s"].append(g.bootstrapped_s - t.arrival)
        out["prefill_queue_wait_s"].append(first - g.bootstrapped_s)
        out["prefill_s"].append(g.prefilled_s - first)
        out["transfer_s"].append(g.landed_s - g.prefilled_s)
        out["link_wait_s"].append(g.sent_s - g.prefilled_s)
        out["decode_queue_wait_s"].append(t.first_token - g.landed_s)
    return out


def instance_summary(inst: Instance, makespan: float) -> dict[str, JSONValue]:
    st = inst.sched.stats
    return {
        "role": inst.role,
        "index": inst.local,
        "gpu": inst.gpu,
        "tp": inst.tp,
        "kv_capacity_tokens": inst.capacity,
        "num_requests": len(inst.reqs),
        "busy_s": st.busy_s,
        "utilisation": st.busy_s / makespan if makespan > 0 else 0.0,
        "peak_kv_usage": st.peak_kv_usage,
        "hit_rate": st.cached_prompt_tokens / st.prompt_tokens if st.prompt_tokens else 0.0,
        "prefill_tokens_computed": st.prefill_tokens_computed,
        "prefill_steps": st.prefill_steps,
        "decode_steps": st.decode_steps,
        "retractions": st.retractions,
    }


def disagg_stats(
    sim: SimConfig,
    link: LinkModel,
    instances: Sequence[Instance],
    legs: Sequence[Leg],
    makespan: float,
) -> dict[str, JSONValue]:
    """The ``disaggregation`` entry of a result: the deployment, every stage's latency
    distribution, and every instance's utilisation (busy time over the makespan)."""
    pre = next(i for i in instances if i.role == PREFILL)
    dec = next(i for i in instances if i.role == DECODE)
    samples = _stage_samples(legs)
    per = [instance_summary(i, makespan) for i in instances]

    def mean_util(role: str) -> float:
        us = [float(x["utilisation"]) for x in per if x["role"] == role]  # type: ignore[arg-type]
        return sum(us) / len(us) if us else 0.0

    out: dict[str, JSONValue] = {
        "prefill_instances": sim.prefill_instances,
        "decode_instances": sim.decode_instances,
        "prefill": {"gpu": pre.gpu, "tp": pre.tp, "kv_capacity_tokens": pre.capacity},
        "decode": {"gpu": dec.gpu, "tp": dec.tp, "kv_capacity_tokens": dec.capacity},
        "link": link.to_json(),
    }
    for key, _ in STAGES:
        out[key] = Stats.of(samples[key]).to_json()
    out["prefill_utilisation"] = mean_util(PREFILL)
    out["decode_utilisation"] = mean_util(DECODE)
    out["instances"] = list[JSONValue](per)
    return out


def stats_shape() -> dict[str, JSONValue]:
    """The keys of a ``disaggregation`` entry, every value zero (the metric names a sweep
    may plot or judge by)."""
    zero = Stats.of([]).to_json()
    out: dict[str, JSONValue] = {
        "prefill_instances": 0,
        "decode_instances": 0,
        "prefill": {"gpu": "", "tp": 0, "kv_capacity_tokens": 0},
        "decode": {"gpu": "", "tp": 0, "kv_capacity_tokens": 0},
        "link": {"link": "", "bandwidth_gb_s": 0.0, "latency_ms": 0.0, "bootstrap_ms": 0.0},
    }
    for key, _ in STAGES:
        out[key] = dict(zero)
    out["prefill_utilisation"] = out["decode_utilisation"] = 0.0
    out["instances"] = []
    return out


# ---- the run -----------------------------------------------------------------------------------------


def _build(
    sched_cfg: SchedulerConfig, sim: SimConfig, accelerate: bool, runner_factory: Any
) -> tuple[list[Instance], Any, Any]:
    from radixsched.sim.cost.build import build_cost_model
    from radixsched.sim.deploy.replicas import _build_replica

    pre_spec, dec_spec = role_specs(sim)
    out: list[Instance] = []
    costs = []
    for role, spec, n, mode in (
        (PREFILL, pre_spec, sim.prefill_instances, "prefill"),
        (DECODE, dec_spec, sim.decode_instances, "decode"),
    ):
        role_sim = spec.sim_config(sim, host_tier=role == PREFILL)
        cost = build_cost_model(role_sim)
        capacity = int(cost.kv_capacity_tokens())
        cfg = sched_cfg.replace(disaggregation_mode=mode)
        costs.append(cost)
        for local in range(n):
            rep = _build_replica(
                len(out),
                cfg,
                role_sim,
                cost,
                capacity,
                accelerate=accelerate,
                clock=VirtualClock(),
                runner_factory=runner_factory,
            )
            out.append(Instance(rep, role, local, cost, capacity))
    return out, costs[0], costs[1]


def run_disaggregated(
    reqs: list[Req],
    sched_cfg: SchedulerConfig,
    sim_cfg: SimConfig,
    *,
    optimal_hit_rate: float,
    on_progress: Callable[[int, int], None] | None = None,
    check_integrity: bool = False,
    accelerate: bool = True,
    runner_factory: Any = None,
) -> SimRun:
    """Run ``reqs`` (fresh copies, in arrival order) on a split deployment: the same
    ``SimRun`` as co-located replicas, whose result's ``extra`` has a ``disaggregation`` entry
    (``disagg_stats``). Arrivals reach the routers the cost model's request latency after they
    are sent; reported times are the client's."""
    from radixsched.cluster.routers import DEFAULT_ROUTER, create_router
    from radixsched.sim.deploy.closed_loop import shift_to_scheduler
    from radixsched.sim.deploy.disagg_loop import Cluster

    if errors := check_disaggregation(sim_cfg):
        raise ValueError("; ".join(errors))
    instances, pre_cost, dec_cost = _build(sched_cfg, sim_cfg, accelerate, runner_factory)
    link = LinkModel.between(sim_cfg, pre_cost, dec_cost)
    pre = [i for i in instances if i.role == PREFILL]
    dec = [i for i in instances if i.role == DECODE]
    per_gpu = kv_bytes_per_token_per_gpu(pre_cost), kv_bytes_per_token_per_gpu(dec_cost)
    links = KVLinks(link, *per_gpu, len(pre), len(dec))
    cluster = Cluster(
        instances,
        links,
        create_router(sim_cfg.router or DEFAULT_ROUTER, seed=sched_cfg.seed),
        create_router(sim_cfg.decode_router or DEFAULT_DECODE_ROUTER, seed=sched_cfg.seed),
        check=check_integrity,
        on_progress=on_progress,
    )
    described = pre_cost.describe()
    latency = float(described.get("request_latency_s", 0.0))
    sends = shift_to_scheduler(reqs, latency, float(described.get("request_serial_s", 0.0)))
    started = time.perf_counter()
    cluster.run(reqs)
    end_run(instances, reqs, sends)
    legs = list(cluster.legs.values())
    finishes = [r.times.finish for r in reqs if r.times.finish is not None]
    makespan = max(finishes) - reqs[0].arrival_time if finishes and reqs else 0.0
    split = disagg_stats(sim_cfg, link, instances, legs, makespan)
    return assemble(
        sched_cfg.schedule_policy, reqs, instances, cluster.series, sim_cfg,
        optimal_hit_rate=optimal_hit_rate, started=started, capacity=dec[0].capacity,
        extra={"disaggregation": split},
        replica_of={g.req.rid: dec[g.d].idx for g in legs},
        cost_model={**described, "decode": dec_cost.describe()},
    )  # fmt: skip

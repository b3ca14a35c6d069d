"""The accelerated core against the reference core over random configurations.

``test_equivalence.py`` compares both cores on chosen shapes. Here hypothesis draws the shape
*and* the settings together: a small workload (shared system prompts, multi-turn chats, trees
of thought, few-shot, random lengths; stop tokens, priorities, tenants), a scheduler
configuration (every policy, both compat modes, page sizes, chunking, batch and running caps,
mixed chunks, priority preemption, starvation bounds, dedup thresholds, eviction policies, a
disabled cache, a bounded queue) and a simulated system (a tight KV pool, replicas, dp-attention
lockstep with the prefill delayer, a host tier, prefill/decode disaggregation; closed-loop
clients; SGLang's or vLLM's engine defaults). Both cores must give the same per-request
tokens and times, the same replica summaries and the same metrics, with integrity checks after
every step of the accelerated run; a configuration one core rejects, the other rejects with the
same message.

``RADIXSCHED_FUZZ_EXAMPLES=N`` runs a longer campaign (the default run draws 60).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import golden
from radixsched.config import SchedulerConfig
from radixsched.native import core
from radixsched.sim.deploy.run import SimRun
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload, load_workload
from simcases import random_lengths

EXAMPLES = int(os.environ.get("RADIXSCHED_FUZZ_EXAMPLES", "60"))


# ---- workloads ----------------------------------------------------------------------------------


@st.composite
def _spec(draw: st.DrawFn) -> str:
    """A generated workload, small enough to simulate in well under a second."""
    kind = draw(st.sampled_from(["shared-prefix", "multi-turn", "tree-of-thought", "few-shot"]))
    i = st.integers
    if kind == "shared-prefix":
        args = {
            "groups": draw(i(1, 8)),
            "prompts": draw(i(1, 12)),
            "system_len": draw(i(8, 700)),
            "question_len": draw(i(1, 90)),
            "output_len": draw(i(1, 70)),
            "shuffle": draw(st.sampled_from(["true", "false"])),
        }
    elif kind == "multi-turn":
        args = {
            "conversations": draw(i(1, 6)),
            "turns": draw(i(1, 8)),
            "first_len": draw(i(8, 600)),
            "turn_len": draw(i(1, 120)),
            "output_len": draw(i(1, 50)),
            "think_time_s": draw(st.sampled_from([0.0, 0.05, 0.5])),
        }
    elif kind == "tree-of-thought":
        args = {
            "trees": draw(i(1, 4)),
            "depth": draw(i(1, 3)),
            "branching": draw(i(1, 3)),
            "root_len": draw(i(8, 500)),
            "step_len": draw(i(1, 80)),
            "output_len": draw(i(1, 40)),
            "think_time_s": draw(st.sampled_from([0.0, 0.2])),
        }
    else:
        args = {
            "questions": draw(i(4, 80)),
            "shots": draw(i(1, 4)),
            "shot_len": draw(i(4, 120)),
            "question_len": draw(i(1, 60)),
            "output_len": draw(i(1, 8)),
            "num_subjects": draw(i(1, 5)),
        }
    args["vocab"] = draw(st.sampled_from([50, 32_000]))  # a small vocabulary collides often
    return kind + ":" + ",".join(f"{k}={v}" for k, v in args.items())


def _decorate(w: Workload, seed: int, stops: bool, priorities: bool, tenants: int) -> Workload:
    """Stop ids that end some outputs early, priorities, tenants: each request its own draw."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i, r in enumerate(w.requests):
        kw: dict[str, Any] = {}
        n = r.sampling.max_new_tokens
        if stops and n > 2:
            out = (np.arange(n, dtype=np.int32) % 97) + 100
            if rng.random() < 0.5:
                out[int(rng.integers(0, n))] = 7
            kw["sampling"] = dataclasses.replace(r.sampling, stop_token_ids=(7,))
            kw["scripted_output"] = out
        if priorities:
            kw["priority"] = int(rng.integers(-3, 4))
        if tenants:
            kw["tenant"] = f"t{i % tenants}"
        reqs.append(dataclasses.replace(r, **kw) if kw else r)
    return dataclasses.replace(w, requests=reqs)


@dataclasses.dataclass(frozen=True)
class WorkloadDraw:
    """What to build (a readable falsifying example): a generator spec or ``random-lengths``,
    its arrival rate and seed, and the decorations."""

    spec: str
    n: int
    rate: float | None
    seed: int
    stops: bool
    priorities: bool
    tenants: int

    def build(self) -> Workload:
        if self.spec == "random-lengths":
            w = random_lengths(self.seed, self.n)
        else:
            w = load_workload(self.spec, request_rate=self.rate, seed=self.seed)
        return _decorate(w, self.seed, self.stops, self.priorities, self.tenants)


@st.composite
def workloads(draw: st.DrawFn) -> WorkloadDraw:
    random = draw(st.integers(0, 5)) == 0
    return WorkloadDraw(
        spec="random-lengths" if random else draw(_spec()),
        n=draw(st.integers(1, 120)) if random else 0,
        rate=None if random else draw(st.sampled_from([None, 4.0, 30.0, 300.0])),
        seed=draw(st.integers(0, 2**16)),
        stops=draw(st.booleans()),
        priorities=draw(st.booleans()),
        tenants=draw(st.sampled_from([0, 0, 2, 3])),
    )


# ---- configurations ------------------------------------------------------------------------------


@st.composite
def sched_configs(draw: st.DrawFn) -> dict[str, Any]:
    page = draw(st.sampled_from([1, 1, 4, 16]))
    chunk = draw(st.sampled_from([None, -1, 64, 256, 1024]))
    kw: dict[str, Any] = {
        "schedule_policy": draw(st.sampled_from(golden.POLICIES)),
        "compat": draw(st.sampled_from(["radixsched", "sglang"])),
        "page_size": page,
        "chunked_prefill_size": chunk if chunk in (None, -1) else max(page, chunk // page * page),
        "seed": draw(st.integers(0, 3)),
        # Hits in whole blocks (vLLM) over pages: 1 (off) or a multiple of the page.
        "cache_block_size": draw(st.sampled_from([1, 1, 1, 16 // page * page, 32])),
    }
    optional = {
        "max_prefill_tokens": st.sampled_from([128, 1024, 16384]),
        "prefill_max_requests": st.integers(1, 8),
        "max_running_requests": st.integers(1, 16),
        "schedule_conservativeness": st.sampled_from([0.0, 0.3, 1.0, 1.7]),
        "enable_mixed_chunk": st.booleans(),
        "clip_max_new_tokens": st.sampled_from([8, 64, 4096]),
        "enable_priority_scheduling": st.booleans(),
        "schedule_low_priority_values_first": st.booleans(),
        "priority_scheduling_preemption_threshold": st.sampled_from([0, 2, 10]),
        "disable_priority_preemption": st.booleans(),
        "max_prefix_match_queue": st.sampled_from([1, 4, 64]),
        "in_batch_prefix_check_threshold": st.sampled_from([0, 8, 32, 512]),
        "in_batch_prefix_deprioritize_threshold": st.sampled_from([0, 8, 32, 512]),
        "lpm_max_wait_s": st.sampled_from([0.0, 0.05, 1.0]),
        "lpm_max_wait_tokens": st.sampled_from([0, 500, 5000]),
        "enable_waiting_prefix_refresh": st.booleans(),
        "retraction_policy": st.sampled_from(["length", "priority", "newest"]),
        "radix_eviction_policy": st.sampled_from(["lru", "lfu", "fifo", "filo", "mru", "priority"]),
        "disable_radix_cache": st.booleans(),
        "max_queued_requests": st.integers(1, 30),
        "new_token_ratio_decay_steps": st.sampled_from([5, 600]),
        "retract_decode_steps": st.sampled_from([1, 20]),
    }
    for name in draw(st.sets(st.sampled_from(sorted(optional)), max_size=6)):
        kw[name] = draw(optional[name])
    return kw


@st.composite
def sim_configs(draw: st.DrawFn) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_total_tokens": draw(st.sampled_from([1500, 3000, 6000, 12_000]))}
    topology = draw(
        st.sampled_from(["one", "one", "replicas", "lockstep", "host-tier", "disaggregated"])
    )
    if topology == "replicas":
        kw["dp"] = draw(st.integers(2, 3))
        kw["router"] = draw(st.sampled_from(["round-robin", "cache-aware", "least-load"]))
    elif topology == "lockstep":
        kw.update(dp=2, enable_dp_attention=True, enable_prefill_delayer=draw(st.booleans()))
    elif topology == "host-tier":
        kw.update(enable_hierarchical_cache=True, hicache_size=draw(st.sampled_from([0.2, 1.0])))
    elif topology == "disaggregated":
        kw.update(
            disaggregation=True,
            prefill_instances=draw(st.integers(1, 2)),
            decode_instances=draw(st.integers(1, 2)),
        )
    if topology not in ("lockstep", "disaggregated") and draw(st.booleans()):
        kw["max_concurrency"] = draw(st.integers(1, 6))  # closed loop
    if draw(st.booleans()):
        kw["engine_mode"] = "vllm"
    return kw


# ---- the property --------------------------------------------------------------------------------


def _run(w: Workload, accelerate: bool, sched: dict[str, Any], sim: dict[str, Any]) -> SimRun:
    if accelerate and core() is None:  # build_scheduler would give the reference: no comparison
        pytest.skip(NO_NATIVE)
    return simulate(
        w,
        SchedulerConfig(**sched),
        SimConfig(**sim),
        accelerate=accelerate,
        check_integrity=accelerate,
    )


def _outcome(w: Workload, accelerate: bool, sched: dict[str, Any], sim: dict[str, Any]) -> Any:
    """The run's observable results, or the error that rejected its settings."""
    try:
        run = _run(w, accelerate, sched, sim)
    except ValueError as e:  # invalid settings (ConfigError and friends)
        return ("rejected", type(e).__name__, str(e))
    obs = golden.observe(run)
    return (obs["trace"], obs["finished"], obs["replicas"], obs["lockstep"], golden.comparable(obs))


NO_NATIVE = "the accelerated core runs over the native core, which is not built or is off"


@pytest.mark.slow
@pytest.mark.skipif(core() is None, reason=NO_NATIVE)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(wl=workloads(), sched=sched_configs(), sim=sim_configs())
def test_accelerated_core_equals_reference_on_random_configurations(
    wl: WorkloadDraw, sched: dict[str, Any], sim: dict[str, Any]
) -> None:
    note(f"workload {wl}\nsched {sched}\nsim {sim}")  # pytest's report elides big arguments
    w = wl.build()
    assert _outcome(w, True, sched, sim) == _outcome(w, False, sched, sim)

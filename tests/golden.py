"""Golden schedules: simulations whose every observable result was recorded from release 0.1.0
(commit 9e8bc27, before the scheduling core was rebuilt) and must not change.

Each case is a small simulation (a workload shape x policy x compat mode x page size x budget
settings). What is recorded per case:

- ``trace``: a SHA-256 digest of every request's output tokens, token times (exact floats),
  first-scheduled / first-token / finish times, finish reason, cached and computed prefill
  tokens, retractions and preemptions;
- ``replicas``: each replica's summary (hit rate, computed prefill, retractions, busy time);
- ``result``: the headline metrics of the run (hit rate, TTFT/TPOT percentiles, ...).

Record (only ever from the release above): ``PYTHONPATH=<that checkout>/src python
tests/golden.py --record``. ``tests/test_golden.py`` replays every case on the current code.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
GOLDEN = HERE / "data" / "golden.json"
SAMPLE = HERE / "data" / "mooncake_sample.jsonl"

POLICIES = (
    "fcfs",
    "lof",
    "random",
    "routing-key",
    "lpm",
    "dfs-weight",
    "hrrn",
    "shortest-prefill-first",
    "fair",
)
# Per-replica summaries every release has.
REPLICA_FIELDS = (
    "num_requests",
    "hit_rate",
    "prefill_tokens_computed",
    "retractions",
    "prompt_tokens",
    "host_hit_rate",
    "busy_s",
)
RESULT_FIELDS = (
    "num_requests",
    "hit_rate",
    "optimal_hit_rate",
    "throughput_tok_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "retractions",
    "preemptions",
    "peak_queue_len",
    "mean_running",
    "peak_kv_usage",
)


# ---- workloads ----------------------------------------------------------------------------------


def _tmp() -> Path:
    d = Path(tempfile.gettempdir()) / "radixsched-golden"
    d.mkdir(exist_ok=True)
    return d


@cache
def _shared_block_trace(n: int) -> str:
    """The first ``n`` Mooncake sample requests with one 512-token block shared by all of
    them prepended (a system prompt every request starts with)."""
    out = _tmp() / f"mooncake_shared_{n}.jsonl"
    lines = SAMPLE.read_text().splitlines()[:n]
    top = 1 + max(max(json.loads(line)["hash_ids"]) for line in lines)
    with out.open("w") as f:
        for line in lines:
            rec = json.loads(line)
            rec["hash_ids"] = [top, *rec["hash_ids"]]
            rec["input_length"] += 512
            f.write(json.dumps(rec) + "\n")
    return str(out)


@cache
def _random_trace(n: int, seed: int, *, tenants: int = 3, priorities: bool = False) -> str:
    """Random lengths, a few prefix groups of random depth, routing keys and tenants."""
    rng = np.random.default_rng(seed)
    out = _tmp() / f"random_{n}_{seed}_{tenants}_{int(priorities)}.jsonl"
    t = 0.0
    with out.open("w") as f:
        for _ in range(n):
            t += float(rng.exponential(0.05))
            length = int(rng.integers(16, 1600))
            rec: dict[str, Any] = {
                "input_length": length,
                "output_length": int(rng.integers(1, 96)),
                "arrival_time": round(t, 6),
                "routing_key": f"k{int(rng.integers(0, 4))}",
                "tenant": f"t{int(rng.integers(0, tenants))}",
            }
            if rng.random() < 0.7:
                rec["prefix_group"] = int(rng.integers(0, 5))
                rec["prefix_length"] = int(rng.integers(1, length + 1))
            if priorities:
                rec["priority"] = int(rng.integers(0, 40))
            f.write(json.dumps(rec) + "\n")
    return str(out)


WORKLOADS: dict[str, Callable[[], tuple[str, float | None, int | None]]] = {
    # name -> (spec, request rate, first N requests)
    "distinct": lambda: (f"mooncake:{SAMPLE}", None, 40),
    "shared-block": lambda: (f"mooncake:{_shared_block_trace(40)}", None, None),
    "shared-prefix": lambda: (
        "shared-prefix:groups=6,prompts=5,system_len=700,question_len=90,output_len=40",
        200.0,
        None,
    ),
    # Everything at t=0: every tie of (queue entry, arrival) falls to the list order.
    "burst": lambda: (
        "shared-prefix:groups=4,prompts=6,system_len=700,question_len=90,output_len=40",
        float("inf"),
        None,
    ),
    "multi-turn": lambda: (
        "multi-turn:conversations=6,turns=4,first_len=400,turn_len=120,output_len=48,"
        "think_time_s=0.05",
        200.0,
        None,
    ),
    "tree-of-thought": lambda: (
        "tree-of-thought:trees=3,depth=3,branching=3,root_len=300,step_len=60,output_len=24,"
        "think_time_s=0.02",
        300.0,
        None,
    ),
    "few-shot": lambda: (
        "few-shot:questions=40,shots=3,shot_len=100,question_len=40,output_len=4,num_subjects=5",
        float("inf"),
        None,
    ),
    "random": lambda: (f"jsonl:{_random_trace(48, 7)}", None, None),
    "priority": lambda: (f"jsonl:{_random_trace(48, 11, priorities=True)}", None, None),
}


@cache
def _load(name: str) -> Any:
    from radixsched.sim.workloads.load import load_workload

    spec, rate, n = WORKLOADS[name]()
    return load_workload(spec, request_rate=rate, num_requests=n)


# ---- cases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    workload: str
    sched: dict[str, Any]
    sim: dict[str, Any] = field(default_factory=dict)


def _grid() -> Iterator[Case]:
    # Every policy x compat x page size on three prefix shapes, chunked small and with a KV pool
    # small enough to retract.
    shapes = {
        "distinct": ({"chunked_prefill_size": 4096}, {"max_total_tokens": 60_000}),
        "shared-block": ({"chunked_prefill_size": 2048}, {"max_total_tokens": 50_000}),
        "multi-turn": ({"chunked_prefill_size": 256}, {"max_total_tokens": 5_000}),
        "random": ({"chunked_prefill_size": 512}, {"max_total_tokens": 12_000}),
    }
    for wl, (sched, sim) in shapes.items():
        for policy in POLICIES:
            for compat in ("radixsched", "sglang"):
                for page in (1, 16):
                    yield Case(
                        f"{wl}/{policy}/{compat}/p{page}",
                        wl,
                        {**sched, "schedule_policy": policy, "compat": compat, "page_size": page},
                        sim,
                    )


def _shapes() -> Iterator[Case]:
    # The other prefix shapes, every policy, default budgets, both modes.
    kv = {"shared-prefix": 6_000, "burst": 6_000, "tree-of-thought": 4_000, "few-shot": 3_000}
    for wl, tokens in kv.items():
        for policy in POLICIES:
            for compat in ("radixsched", "sglang"):
                yield Case(
                    f"{wl}/{policy}/{compat}",
                    wl,
                    {"schedule_policy": policy, "compat": compat, "chunked_prefill_size": 512},
                    {"max_total_tokens": tokens},
                )


def _switches() -> Iterator[Case]:
    small = {"max_total_tokens": 12_000}
    rnd = "random"
    for compat in ("radixsched", "sglang"):
        c = {"compat": compat}
        yield Case(
            f"unchunked/lpm/{compat}",
            rnd,
            {**c, "schedule_policy": "lpm", "chunked_prefill_size": -1},
            small,
        )
        yield Case(
            f"mixed/fcfs/{compat}",
            rnd,
            {
                **c,
                "schedule_policy": "fcfs",
                "enable_mixed_chunk": True,
                "chunked_prefill_size": 512,
            },
            small,
        )
        yield Case(
            f"mixed/lpm/{compat}",
            rnd,
            {
                **c,
                "schedule_policy": "lpm",
                "enable_mixed_chunk": True,
                "chunked_prefill_size": 512,
            },
            small,
        )
        yield Case(
            f"no-cache/fcfs/{compat}",
            rnd,
            {
                **c,
                "schedule_policy": "fcfs",
                "disable_radix_cache": True,
                "chunked_prefill_size": 512,
            },
            small,
        )
        yield Case(
            f"no-cache/lpm/{compat}",
            rnd,
            {**c, "schedule_policy": "lpm", "disable_radix_cache": True},
            small,
        )
        yield Case(
            f"prefill-max-requests/lpm/{compat}",
            rnd,
            {**c, "schedule_policy": "lpm", "prefill_max_requests": 2, "chunked_prefill_size": 512},
            small,
        )
        yield Case(
            f"max-prefill-tokens/hrrn/{compat}",
            rnd,
            {
                **c,
                "schedule_policy": "hrrn",
                "max_prefill_tokens": 700,
                "chunked_prefill_size": 512,
            },
            small,
        )
        yield Case(
            f"queue-limit/fcfs/{compat}",
            rnd,
            {**c, "schedule_policy": "fcfs", "max_queued_requests": 6},
            small,
        )
        yield Case(
            f"max-running/lpm/{compat}",
            rnd,
            {**c, "schedule_policy": "lpm", "max_running_requests": 3},
            small,
        )
        yield Case(
            f"cap/lpm/{compat}",
            rnd,
            {
                **c,
                "schedule_policy": "lpm",
                "max_prefix_match_queue": 4,
                "chunked_prefill_size": 512,
            },
            small,
        )
        yield Case(
            f"conservative/dfs-weight/{compat}",
            rnd,
            {**c, "schedule_policy": "dfs-weight", "schedule_conservativeness": 0.3},
            small,
        )
        yield Case(
            f"dedup-off/lpm/{compat}",
            rnd,
            {**c, "schedule_policy": "lpm", "in_batch_prefix_check_threshold": -1},
            small,
        )
        yield Case(
            f"dedup-wide/spf/{compat}",
            rnd,
            {
                **c,
                "schedule_policy": "shortest-prefill-first",
                "in_batch_prefix_check_threshold": 4096,
                "in_batch_prefix_deprioritize_threshold": 8,
            },
            small,
        )
        yield Case(
            f"no-refresh/fcfs/{compat}",
            rnd,
            {**c, "schedule_policy": "fcfs", "enable_waiting_prefix_refresh": False},
            small,
        )
        for ev in ("lfu", "fifo", "filo", "mru", "priority"):
            yield Case(
                f"evict-{ev}/lpm/{compat}",
                rnd,
                {
                    **c,
                    "schedule_policy": "lpm",
                    "radix_eviction_policy": ev,
                    "chunked_prefill_size": 512,
                },
                small,
            )
        for policy in ("fcfs", "lof"):
            for low in (False, True):
                yield Case(
                    f"priority/{policy}/low{int(low)}/{compat}",
                    "priority",
                    {
                        **c,
                        "schedule_policy": policy,
                        "enable_priority_scheduling": True,
                        "schedule_low_priority_values_first": low,
                        "priority_scheduling_preemption_threshold": 5,
                        "chunked_prefill_size": 512,
                    },
                    small,
                )
        yield Case(
            f"priority-retract/fcfs/{compat}",
            "priority",
            {
                **c,
                "schedule_policy": "fcfs",
                "enable_priority_scheduling": True,
                "retraction_policy": "priority",
                "disable_priority_preemption": True,
            },
            {"max_total_tokens": 8_000},
        )
        yield Case(
            f"priority-queue-limit/fcfs/{compat}",
            "priority",
            {
                **c,
                "schedule_policy": "fcfs",
                "enable_priority_scheduling": True,
                "max_queued_requests": 5,
                "default_priority_value": 3,
            },
            small,
        )
        for bound in ({"lpm_max_wait_s": 0.3}, {"lpm_max_wait_tokens": 3000}):
            key = next(iter(bound))
            yield Case(
                f"starvation-{key}/lpm/{compat}",
                rnd,
                {**c, "schedule_policy": "lpm", **bound},
                small,
            )
        yield Case(
            f"hicache/lpm/{compat}",
            "distinct",
            {**c, "schedule_policy": "lpm"},
            {"max_total_tokens": 60_000, "enable_hierarchical_cache": True, "hicache_size": 0.05},
        )
        for router in ("round-robin", "cache-aware"):
            yield Case(
                f"dp2-{router}/lpm/{compat}",
                "shared-block",
                {**c, "schedule_policy": "lpm", "chunked_prefill_size": 2048},
                {"max_total_tokens": 50_000, "dp": 2, "router": router},
            )
        for policy in ("fcfs", "lpm"):
            yield Case(
                f"lockstep/{policy}/{compat}",
                "shared-prefix",
                {**c, "schedule_policy": policy},
                {
                    "max_total_tokens": 6_000,
                    "dp": 2,
                    "enable_dp_attention": True,
                    "router": "round-robin",
                },
            )
        yield Case(
            f"lockstep-nodelay/lpm/{compat}",
            "random",
            {**c, "schedule_policy": "lpm", "chunked_prefill_size": 512},
            {
                "max_total_tokens": 12_000,
                "dp": 2,
                "enable_dp_attention": True,
                "enable_prefill_delayer": False,
            },
        )


# The cost model's constants of release 0.1.0, which later releases' uncalibrated defaults
# replaced (the GPU's prefill curve, the engine mode's front-end latency): the schedules were
# recorded with these, so every case gives them explicitly.
RELEASE_CONSTANTS: dict[str, Any] = {
    "mfu": 0.55,
    "prefill_eff_tokens": 0.0,
    "request_latency_ms": 0.0,
}


def cases() -> list[Case]:
    return [
        dataclasses.replace(c, sim={**RELEASE_CONSTANTS, **c.sim})
        for c in (*_grid(), *_shapes(), *_switches())
    ]


# ---- what a run shows -----------------------------------------------------------------------------


def run_case(case: Case) -> dict[str, Any]:
    from radixsched.config import SchedulerConfig
    from radixsched.sim.simulate import SimConfig, simulate

    run = simulate(_load(case.workload), SchedulerConfig(**case.sched), SimConfig(**case.sim))
    return observe(run)


def request_trace(r: Any) -> list[Any]:
    t = r.times
    return [
        r.rid,
        list(r.output_ids),
        list(t.token_times),
        t.first_scheduled,
        t.first_token,
        t.finish,
        None if r.finish is None else r.finish.reason.value,
        r.cached_tokens,
        r.computed_prefill_tokens,
        r.retraction_count,
        r.preemption_count,
    ]


def trace_digest(reqs: Any) -> str:
    rows = sorted((request_trace(r) for r in reqs), key=lambda row: row[0])
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def observe(run: Any) -> dict[str, Any]:
    res = run.result.to_json()
    return {
        "trace": trace_digest(run.requests),
        "replicas": [{k: getattr(s, k) for k in REPLICA_FIELDS} for s in run.replicas],
        "result": {k: res[k] for k in RESULT_FIELDS if k in res},
        "lockstep": None if run.lockstep is None else run.lockstep.to_json(),
        "finished": sum(r.finish is not None for r in run.requests),
    }


# With several replicas these come from the driver's time series, sampled once per ``step()``
# call: how an accelerator groups forward passes into steps changes them, not the schedule.
SAMPLED_FIELDS = ("peak_queue_len", "mean_running", "peak_kv_usage")


def comparable(obs: dict[str, Any]) -> dict[str, Any]:
    """The result fields a run must reproduce exactly."""
    res = dict(obs["result"])
    if len(obs["replicas"]) > 1:
        for k in SAMPLED_FIELDS:
            res.pop(k, None)
    return {k: res[k] for k in RESULT_FIELDS if k in res}


def recorded_part(got: Any, want: Any) -> Any:
    """``got`` limited to the keys ``want`` has, at every level: statistics gain keys (p95,
    std) that the release recorded before them does not have."""
    if isinstance(got, dict) and isinstance(want, dict):
        return {k: recorded_part(got[k], v) for k, v in want.items() if k in got}
    return got


def same_as_recorded(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether a run's comparable results are the recorded ones (keys added since ignored)."""
    recorded = comparable(want)
    return bool(recorded_part(comparable(got), recorded) == recorded)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--record", action="store_true", help="write tests/data/golden.json")
    ap.add_argument("--only", default="", help="substring of the case names to run")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    for case in cases():
        if args.only and args.only not in case.name:
            continue
        try:
            out[case.name] = run_case(case)
        except Exception as e:  # a release that crashes on a case records the crash
            out[case.name] = {"error": f"{type(e).__name__}: {e}"}
        print(case.name, out[case.name].get("trace", out[case.name].get("error")), flush=True)
    if args.record:
        GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(out)} cases to {GOLDEN}", file=sys.stderr)


if __name__ == "__main__":
    main()


def count_calls(mp: Any, owner: Any, name: str) -> dict[str, int]:
    """``owner.name`` replaced (through the monkeypatch ``mp``) by a wrapper counting its calls
    in the returned ``{"calls": n}``."""
    seen = {"calls": 0}
    real = getattr(owner, name)

    def counting(*a: Any) -> Any:
        seen["calls"] += 1
        return real(*a)

    mp.setattr(owner, name, counting)
    return seen

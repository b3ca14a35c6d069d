"""Regenerate the result-file fixtures: ``python tests/data/calibration/make_fixtures.py``.

A "server" whose truth is the simulator with known constants (``TRUTH``, tiny-random on the
CPU preset) is measured the way three client tools measure, and each tool's result file is
written in that tool's documented layout (``radixsched.sim.calibrate.measured``):

- ``sglang_bench_serving.jsonl``: ``python -m sglang.bench_serving --dataset-name random
  --output-file F --output-details`` appends one line per run (synchronous via
  ``--max-concurrency 1``, all-at-once, two Poisson rates, and ``--max-concurrency 4``);
- ``guidellm_benchmarks.json``: ``guidellm benchmark --profile sweep --output-path F``
  (synchronous, throughput, two Poisson rates, concurrent@4);
- ``vllm_benchmark_serving.json``: ``benchmark_serving.py --save-result --save-detailed``
  (one run at ``--max-concurrency 4``).

Prompts are request-unique (those tools' random datasets share no prefix).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from radixsched.config import SchedulerConfig
from radixsched.request import Req, SamplingParams
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads.load import Workload

HERE = Path(__file__).parent
TRUTH = {
    "mfu_pct": 7.0,
    "prefill_eff_tokens": 64.0,
    "step_overhead_ms": 1.4,
    "sched_per_req_ms": 0.15,
    "sched_per_prefill_ms": 1.0,
    "request_latency_ms": 5.0,
}
N = 48
EPOCH = 1_754_000_000.0  # GuideLLM records epoch seconds


def requests(seed: int) -> list[Req]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(N):
        n_in = int(rng.integers(64, 256))
        n_out = int(rng.integers(16, 48))
        out.append(
            Req(
                rid=f"r{i}",
                prompt_ids=rng.integers(0, 500, n_in, dtype=np.int32),
                sampling=SamplingParams(max_new_tokens=n_out, ignore_eos=True),
            )
        )
    return out


def run(rate: float, conc: int | None, seed: int) -> list[Req]:
    reqs = requests(seed)
    if math.isfinite(rate):
        gaps = np.random.default_rng(seed + 1000).exponential(1 / rate, N)
        for r, t in zip(reqs, np.concatenate([[0.0], np.cumsum(gaps[:-1])]), strict=True):
            r.arrival_time = float(t)
    sim = SimConfig(
        model="tiny-random",
        gpu="cpu",
        mfu=TRUTH["mfu_pct"] / 100,
        prefill_eff_tokens=TRUTH["prefill_eff_tokens"],
        step_overhead_ms=TRUTH["step_overhead_ms"],
        sched_per_req_ms=TRUTH["sched_per_req_ms"],
        sched_per_prefill_ms=TRUTH["sched_per_prefill_ms"],
        request_latency_ms=TRUTH["request_latency_ms"],
        max_total_tokens=131072,
        context_length=4096,
        max_concurrency=conc,
    )
    wl = Workload("random", {}, reqs, has_timestamps=True)
    return simulate(wl, SchedulerConfig(), sim, optimal_hit_rate=0.0).requests


STAGES = [  # (label, rate, max concurrency)
    ("synchronous", math.inf, 1),
    ("throughput", math.inf, None),
    ("poisson 40", 40.0, None),
    ("poisson 80", 80.0, None),
    ("concurrent 4", math.inf, 4),
]


def sglang_line(reqs: list[Req], rate: float, conc: int | None) -> dict[str, object]:
    ttfts = [round(r.times.first_token - r.times.arrival, 7) for r in reqs]
    itls = [[round(float(g), 7) for g in np.diff(r.times.token_times)] for r in reqs]
    e2e = [r.times.finish - r.times.arrival for r in reqs]
    dur = max(r.times.finish for r in reqs) - min(r.times.arrival for r in reqs)
    return {
        "tag": None,
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": rate,  # json.dumps writes inf as Infinity, as sglang's file has it
        "max_concurrency": conc,
        "random_input_len": 256,
        "random_output_len": 48,
        "random_range_ratio": 0.25,
        "server_info": {"model_path": "tiny-random", "version": "0.5.2"},
        "duration": dur,
        "completed": len(reqs),
        "total_input_tokens": sum(r.prompt_len for r in reqs),
        "total_output_tokens": sum(r.output_len for r in reqs),
        "request_throughput": len(reqs) / dur,
        "mean_e2e_latency_ms": float(np.mean(e2e)) * 1e3,
        "mean_ttft_ms": float(np.mean(ttfts)) * 1e3,
        "concurrency": float(np.sum(e2e) / dur),
        "input_lens": [r.prompt_len for r in reqs],
        "output_lens": [r.output_len for r in reqs],
        "ttfts": ttfts,
        "itls": itls,
        "generated_texts": ["" for _ in reqs],
        "errors": ["" for _ in reqs],
    }


def guidellm_benchmark(reqs: list[Req], label: str, rate: float, conc: int | None) -> dict:
    if label == "synchronous":
        strategy: dict[str, object] = {"type_": "synchronous"}
    elif label == "throughput":
        strategy = {"type_": "throughput", "max_concurrency": None}
    elif conc is not None:
        strategy = {"type_": "concurrent", "streams": conc}
    else:
        strategy = {"type_": "poisson", "rate": rate, "random_seed": 42}
    successful = [
        {
            "type_": "generative_text_response",
            "request_id": r.rid,
            "request_type": "text_completions",
            "prompt": "",
            "output": "",
            "prompt_tokens": r.prompt_len,
            "output_tokens": r.output_len,
            "start_time": round(EPOCH + r.times.arrival, 6),
            "end_time": round(EPOCH + r.times.finish, 6),
            "first_token_time": round(EPOCH + r.times.first_token, 6),
            "last_token_time": round(EPOCH + r.times.token_times[-1], 6),
        }
        for r in reqs
    ]
    return {
        "type_": "generative_benchmark",
        "args": {"strategy": strategy, "max_number": N},
        "worker": {
            "type_": "generative_requests_worker",
            "backend_type": "openai_http",
            "backend_model": "tiny-random",
        },
        "requests": {"successful": successful, "errored": [], "incomplete": []},
    }


def main() -> None:
    lines, benches = [], []
    for k, (label, rate, conc) in enumerate(STAGES):
        reqs = run(rate, conc, seed=k)
        lines.append(json.dumps(sglang_line(reqs, rate, conc)))
        benches.append(guidellm_benchmark(reqs, label, rate, conc))
    (HERE / "sglang_bench_serving.jsonl").write_text("\n".join(lines) + "\n")
    (HERE / "guidellm_benchmarks.json").write_text(json.dumps({"benchmarks": benches}) + "\n")
    reqs = run(math.inf, 4, seed=9)
    vllm = {
        "date": "20260101-120000",
        "backend": "vllm",
        "model_id": "tiny-random",
        "tokenizer_id": "tiny-random",
        "num_prompts": N,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 4,
        **{
            k: v
            for k, v in sglang_line(reqs, math.inf, 4).items()
            if k
            in (
                "duration",
                "completed",
                "input_lens",
                "output_lens",
                "ttfts",
                "itls",
                "generated_texts",
                "errors",
            )
        },
    }
    (HERE / "vllm_benchmark_serving.json").write_text(json.dumps(vllm) + "\n")


if __name__ == "__main__":
    main()

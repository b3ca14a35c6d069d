"""Uncalibrated defaults from public measurements: each GPU preset's prefill efficiency
curve (``hardware.PREFILL_CURVES``) and each engine mode's per-request front-end latency
(``engine_modes.FRONTEND_LATENCY_S``); flags and calibration files still win."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, ExtendEntry
from radixsched.sim.cost.build import load_cost_model
from radixsched.sim.cost.roofline import CostModel
from radixsched.sim.settings.engine_modes import scheduler_defaults


def _cost(**kw: object) -> CostModel:
    c = load_cost_model(model="llama-3.1-8b", **kw)  # type: ignore[arg-type]
    assert isinstance(c, CostModel)
    return c


def test_each_gpu_has_its_curve_and_each_engine_mode_its_front_end() -> None:
    h100 = _cost(gpu="H100", engine_mode="vllm")
    assert (h100.mfu, h100.prefill_eff_tokens, h100.request_latency_s) == (0.68, 64.0, 0.010)
    assert _cost(gpu="A100", engine_mode="sglang").mfu == 0.74
    assert _cost(gpu="H200", engine_mode="sglang").request_latency_s == 0.0085
    # A GPU without a published measurement keeps the generic constants; no mode, no front end.
    b200 = _cost(gpu="B200")
    assert (b200.mfu, b200.prefill_eff_tokens, b200.request_latency_s) == (0.55, 0.0, 0.0)


def test_flags_and_calibration_files_win_over_the_defaults(tmp_path: Path) -> None:
    given = _cost(gpu="H100", engine_mode="vllm", mfu=0.5, request_latency_s=0.002)
    assert (given.mfu, given.request_latency_s, given.prefill_eff_tokens) == (0.5, 0.002, 64.0)
    cal = tmp_path / "cal.json"
    doc = {
        "format": "radixsched-calibration",
        "version": 2,
        "constants": {"mfu": 0.61, "prefill_eff_tokens": 10.0, "request_latency_s": 0.003},
    }
    cal.write_text(json.dumps(doc))
    fitted = _cost(gpu="H100", engine_mode="vllm", calibration=cal)
    assert (fitted.mfu, fitted.prefill_eff_tokens, fitted.request_latency_s) == (0.61, 10.0, 0.003)


def _prefill_s(cost: CostModel, n: int) -> float:
    r = Req("r", np.zeros(n, dtype=np.int32), SamplingParams(max_new_tokens=1))
    empty = np.zeros(0, dtype=np.int64)
    ids = np.zeros(n, dtype=np.int32)
    return cost.step_time(Batch([ExtendEntry(r, 0, ids, empty, empty, True)], []))


def test_large_prefills_on_h100_are_faster_than_with_the_old_constant() -> None:
    new, old = _cost(gpu="H100"), _cost(gpu="H100", mfu=0.55, prefill_eff_tokens=0.0)
    # 4,096 tokens: 0.68 * 4096/4224 = 0.66 of peak against 0.55: ~17% less time.
    assert _prefill_s(new, 4096) / _prefill_s(old, 4096) == pytest.approx(0.55 / 0.6594, rel=0.02)
    # A 200-token prefill loses tiles and waves: slower than the flat constant said.
    assert _prefill_s(new, 200) > _prefill_s(old, 200)


def test_the_front_end_is_in_ttft_at_zero_load() -> None:
    from radixsched.config import SchedulerConfig
    from radixsched.sim.settings.simconfig import SimConfig
    from radixsched.sim.simulate import simulate
    from radixsched.sim.workloads.load import Workload

    def ttft(**sim: object) -> float:
        r = Req("a", np.arange(500, dtype=np.int32), SamplingParams(max_new_tokens=4))
        r.arrival_time = r.times.arrival = 0.0
        wl = Workload("one", {}, [r], has_timestamps=True, arrivals="at 0")
        cfg = SimConfig(gpu="H100", engine_mode="vllm", **sim)  # type: ignore[arg-type]
        run = simulate(wl, SchedulerConfig(), cfg, optimal_hit_rate=0.0)
        t = run.requests[0].times
        return (t.first_token or 0.0) - t.arrival

    assert ttft() - ttft(request_latency_ms=0.0) == pytest.approx(0.010, abs=1e-9)


@pytest.mark.parametrize(
    ("gpu", "budget", "seqs"),
    [("H100", 8192, 1024), ("H200", 8192, 1024), ("MI300X", 8192, 1024), ("A100", 2048, 256),
     ("A100-40G", 2048, 256), ("L40S", 2048, 256), ("not-a-gpu", 2048, 256)],
)  # fmt: skip
def test_vllm_mode_takes_vllm_serve_batch_defaults_for_the_gpu(
    gpu: str, budget: int, seqs: int
) -> None:
    """vLLM V1's ``vllm serve`` defaults: max_num_batched_tokens 8192 and max_num_seqs 1024 on
    GPUs of 70 GiB or more that are not A100s, 2048 and 256 on the others; a flag wins."""
    got = scheduler_defaults("vllm", set(), gpu)
    assert (got["chunked_prefill_size"], got["max_prefill_tokens"]) == (budget, budget)
    assert got["max_running_requests"] == seqs
    assert "max_running_requests" not in scheduler_defaults("vllm", {"max_running_requests"}, gpu)
    assert "max_running_requests" not in scheduler_defaults("sglang", set(), gpu)


def test_a_run_config_gets_the_batch_defaults_of_its_gpu() -> None:
    from radixsched.sim.settings.runconfig import resolve

    h100 = resolve({"engine_mode": "vllm", "gpu": "H100"}).scheduler_config()
    a100 = resolve({"engine_mode": "vllm", "gpu": "A100"}).scheduler_config()
    given = resolve({"engine_mode": "vllm", "gpu": "H100", "max_running_requests": 64})
    assert (h100.max_running_requests, a100.max_running_requests) == (1024, 256)
    assert given.scheduler_config().max_running_requests == 64

"""Engine benchmarks: ``TorchRunner`` throughput, the time prefix hits save, and a GPU check.

Part ``throughput``. Workload (deterministic, numpy ``default_rng(0)``): ``batch`` requests of
``--prompt-len`` random token ids (0..255, valid for every model). Prefill: all requests in one
extend step; tokens/s = batch * prompt_len / step time (the step's measured ``duration_s``,
sampling included). Decode: then ``--decode-steps`` steps of one token per request (greedy);
tokens/s = batch / median step time. One untimed warm-up prefill + decode per model first.

Part ``prefix``. The shared-prefix workload (``--prefix-workload``, a
``radixsched.sim.workloads.load`` spec, default per model in ``PREFIX_WORKLOADS``; token ids taken modulo the model's vocabulary, all requests
arriving at once) through ``Engine`` (the scheduler loop, greedy, ``ignore_eos``) with the radix
cache on (``--prefix-policy``, default lpm) and disabled (fcfs, which is what a cache-aware policy
falls back to without a cache). Reported per run: cache hit rate (cached / prompt tokens),
prefill tokens computed, prefill seconds (steps that ran prefill tokens), wall seconds; and per
model the savings of the cached run: prefill tokens, prefill seconds and wall seconds. The
prefill saving should track the hit rate; the wall saving is diluted by decode time. One
untimed warm-up run per model first; ``--prefix-repeats`` runs of each, the fastest reported.

Run: ``.venv/bin/python bench/engine_bench.py [--parts throughput prefix] [--json PATH]
[--models tiny-random smollm2-135m] [--batches 1 8 32] [--prompt-len 64] [--decode-steps 8]
[--prefix-workload SPEC] [--prefix-policy lpm] [--threads N] [--device cpu] [--dtype float32]``.
``--threads`` sets ``torch.set_num_threads`` (default: torch's choice; on a busy 2-core box 1
thread is often faster than 2).

``--gpu-check``: one prepared script for a CUDA machine (a few minutes on an H100/H200).
Random-weight ``llama-3.1-8b`` shapes (``--gpu-model``) in bf16 on ``--gpu-device`` (cuda):

1. exactness at bf16 tolerance: logits of the last ``GPU_EXACT_SUFFIX`` tokens of a
   ``GPU_EXACT_LEN``-token prompt whose prefix is read from the KV pool equal those of a full
   prefill (relative RMS error <= max(``--bf16-tol``, twice the error between our full prefill
   and ``transformers``' on the same weights: the bf16 noise between two implementations)), and
   a control whose prefix slots hold another prompt's KV must exceed four times that bound;
2. prefill tokens/s per batch (``GPU_PREFILL``) and model FLOP utilisation against the bf16
   dense peak (989 TFLOP/s on H100/H200 SXM; ``--peak-tflops``);
3. decode tokens/s per batch (``GPU_DECODE_BATCHES`` at context ``GPU_DECODE_CTX``) and the
   bandwidth that implies (weights + KV read per step) against the memory bandwidth (H200
   4.8 TB/s, H100 SXM 3.35 TB/s; ``--peak-bw-gbs``);
4. the same prefill and decode shapes through ``transformers`` (its own forward and
   ``generate``, sdpa attention, same weights) as the baseline;
5. the shared-prefix workload through ``Engine`` with the cache on and off.

Without CUDA it exits with status 2 and a one-line message. For a dry run of the same code on
CPU: ``--gpu-check --gpu-device cpu --gpu-model tiny-random --gpu-small``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from radixsched.config import SchedulerConfig
from radixsched.engine.config import ModelConfig
from radixsched.engine.loader import LoadedModel, load_model
from radixsched.engine.offline import Engine
from radixsched.engine.runner import TorchRunner
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, DecodeEntry, ExtendEntry
from radixsched.scheduler import StepOutcome
from radixsched.sim.workloads.load import load_workload, optimal_hit_rate

# Per model: large enough that compute, not per-step overhead, dominates, small enough for about
# a minute on one CPU thread (other models get the SmolLM2 size).
PREFIX_WORKLOADS = {
    "tiny-random": "shared-prefix:groups=8,prompts=8,system_len=1024,question_len=64,output_len=8",
    "smollm2-135m": "shared-prefix:groups=4,prompts=4,system_len=256,question_len=32,output_len=8",
}
DEFAULT_PREFIX_WORKLOAD = PREFIX_WORKLOADS["smollm2-135m"]
EMPTY = np.zeros(0, dtype=np.int64)

# ---- throughput -------------------------------------------------------------------------------


class Row(NamedTuple):
    model: str
    batch: int
    prompt_len: int
    prefill_ms: float
    prefill_tok_s: float
    decode_ms_per_step: float
    decode_tok_s: float


def run_one(
    runner: TorchRunner, batch: int, prompt_len: int, steps: int, rng: np.random.Generator
) -> tuple[float, float]:
    """(prefill seconds, median decode step seconds) for one batch size."""
    span = prompt_len + steps
    reqs = [
        Req(
            f"b{i}",
            rng.integers(0, 256, size=prompt_len, dtype=np.int32),
            SamplingParams(max_new_tokens=steps, ignore_eos=True),
        )
        for i in range(batch)
    ]
    rows = [np.arange(1 + i * span, 1 + (i + 1) * span, dtype=np.int64) for i in range(batch)]
    prefill = runner.forward(
        Batch(
            [
                ExtendEntry(r, 0, r.prompt_ids, EMPTY, row[:prompt_len], True)
                for r, row in zip(reqs, rows, strict=True)
            ],
            [],
        )
    )
    last = dict(prefill.next_tokens)
    times: list[float] = []
    for step in range(steps):
        pos = prompt_len + step
        res = runner.forward(
            Batch(
                [],
                [
                    DecodeEntry(r, last[r.rid], pos, row[: pos + 1])
                    for r, row in zip(reqs, rows, strict=True)
                ],
            )
        )
        last = dict(res.next_tokens)
        times.append(res.duration_s)
    return prefill.duration_s, statistics.median(times)


def bench_model(loaded: LoadedModel, batches: list[int], prompt_len: int, steps: int) -> list[Row]:
    rng = np.random.default_rng(0)
    runner = TorchRunner(loaded, max(batches) * (prompt_len + steps))
    run_one(runner, 1, prompt_len, 2, rng)  # warm-up
    rows: list[Row] = []
    for b in batches:
        prefill_s, step_s = run_one(runner, b, prompt_len, steps, rng)
        rows.append(
            Row(
                model=loaded.name,
                batch=b,
                prompt_len=prompt_len,
                prefill_ms=prefill_s * 1e3,
                prefill_tok_s=b * prompt_len / prefill_s,
                decode_ms_per_step=step_s * 1e3,
                decode_tok_s=b / step_s,
            )
        )
    return rows


def throughput_table(rows: Sequence[Row], title: str) -> Table:
    table = Table(title=title)
    for col in ("model", "batch", "prefill ms", "prefill tok/s", "decode ms/step", "decode tok/s"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        table.add_row(
            r.model,
            str(r.batch),
            f"{r.prefill_ms:,.1f}",
            f"{r.prefill_tok_s:,.0f}",
            f"{r.decode_ms_per_step:,.1f}",
            f"{r.decode_tok_s:,.1f}",
        )
    return table


# ---- prefix hits -------------------------------------------------------------------------------


class PrefixRun(NamedTuple):
    model: str
    cache: bool
    policy: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float
    prefill_tokens: int  # computed (prompt tokens minus cache hits, plus any recomputation)
    prefill_s: float  # runner time of steps that ran prefill tokens
    wall_s: float  # Engine.generate, scheduler included
    output_tokens: int


class PrefixSaving(NamedTuple):
    model: str
    hit_rate: float
    optimal_hit_rate: float
    prefill_tokens_saved: float  # 1 - on / off
    prefill_s_saved: float
    wall_s_saved: float


def prefix_requests(spec: str, vocab: int) -> list[Req]:
    """Fresh requests of ``spec`` (all at t=0), token ids taken modulo ``vocab``: ids that are
    equal stay equal, so shared prefixes stay shared."""
    workload = load_workload(spec, request_rate=math.inf)
    return [
        Req(r.rid, r.prompt_ids % vocab, r.sampling, arrival_time=0.0) for r in workload.requests
    ]


def run_prefix_once(
    loaded: LoadedModel, spec: str, config: SchedulerConfig, kv_slots: int
) -> PrefixRun:
    page = config.page_size
    runner = TorchRunner(loaded, (kv_slots // page + 1) * page - 1)
    engine = Engine(runner, config, kv_slots=kv_slots)
    reqs = prefix_requests(spec, loaded.config.vocab_size)
    steps: list[StepOutcome] = []
    start = time.perf_counter()
    outs = engine.generate(reqs, on_step=steps.append)
    wall = time.perf_counter() - start
    stats = engine.scheduler.stats
    if stats.aborted or stats.rejected or not all(o.admit.accepted for o in outs):
        raise RuntimeError(f"{loaded.name}: requests were rejected or aborted: {stats}")
    return PrefixRun(
        model=loaded.name,
        cache=not config.disable_radix_cache,
        policy=config.schedule_policy,
        requests=len(reqs),
        prompt_tokens=stats.prompt_tokens,
        cached_tokens=stats.cached_prompt_tokens,
        hit_rate=stats.cached_prompt_tokens / max(stats.prompt_tokens, 1),
        prefill_tokens=stats.prefill_tokens_computed,
        prefill_s=sum(s.duration_s for s in steps if s.prefill_tokens),
        wall_s=wall,
        output_tokens=sum(len(o.output_ids) for o in outs),
    )


def bench_prefix(
    loaded: LoadedModel, spec: str, policy: str, repeats: int
) -> tuple[PrefixRun, PrefixRun, PrefixSaving]:
    """(cache on, cache off, savings); each run the fastest of ``repeats``."""
    reqs = prefix_requests(spec, loaded.config.vocab_size)
    # Room for every request at once: hits come from reuse, never from a lack of eviction.
    kv_slots = sum(r.prompt_len + r.max_new_tokens + 1 for r in reqs)
    on_cfg = SchedulerConfig(schedule_policy=policy)
    off_cfg = SchedulerConfig(schedule_policy="fcfs", disable_radix_cache=True)
    warm = "shared-prefix:groups=1,prompts=2,system_len=16,question_len=4,output_len=2"
    run_prefix_once(loaded, warm, on_cfg, 256)

    def fastest(cfg: SchedulerConfig) -> PrefixRun:
        return min(
            (run_prefix_once(loaded, spec, cfg, kv_slots) for _ in range(repeats)),
            key=lambda r: r.wall_s,
        )

    on, off = fastest(on_cfg), fastest(off_cfg)
    saving = PrefixSaving(
        model=loaded.name,
        hit_rate=on.hit_rate,
        optimal_hit_rate=optimal_hit_rate(reqs),
        prefill_tokens_saved=1 - on.prefill_tokens / off.prefill_tokens,
        prefill_s_saved=1 - on.prefill_s / off.prefill_s,
        wall_s_saved=1 - on.wall_s / off.wall_s,
    )
    return on, off, saving


def prefix_table(runs: Sequence[tuple[PrefixRun, PrefixRun, PrefixSaving]], title: str) -> Table:
    table = Table(title=title)
    cols = ("model", "cache", "requests", "hit rate", "prefill tokens", "prefill s", "wall s")
    for col in cols:
        left = col in ("model", "cache")
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    for on, off, saving in runs:
        for r in (off, on):
            table.add_row(
                r.model,
                f"on ({r.policy})" if r.cache else "off",
                str(r.requests),
                f"{r.hit_rate:.1%}",
                f"{r.prefill_tokens:,}",
                f"{r.prefill_s:.2f}",
                f"{r.wall_s:.2f}",
            )
        table.add_row(
            saving.model,
            "[bold]saved[/]",
            "",
            f"(optimal {saving.optimal_hit_rate:.1%})",
            f"[bold]{saving.prefill_tokens_saved:.1%}[/]",
            f"[bold]{saving.prefill_s_saved:.1%}[/]",
            f"[bold]{saving.wall_s_saved:.1%}[/]",
            end_section=True,
        )
    return table


# ---- GPU check ---------------------------------------------------------------------------------

# Shapes of the GPU check (``--gpu-small`` shrinks them for a CPU dry run).
GPU_EXACT_LEN, GPU_EXACT_SUFFIX = 1024, 256
GPU_PREFILL = ((1, 2048), (8, 1024), (16, 2048))  # (batch, prompt tokens)
GPU_DECODE_BATCHES, GPU_DECODE_CTX, GPU_DECODE_STEPS = (1, 16, 64), 1024, 16
GPU_PREFIX_WORKLOAD = (
    "shared-prefix:groups=4,prompts=8,system_len=1024,question_len=64,output_len=16"
)
SMALL_EXACT_LEN, SMALL_EXACT_SUFFIX = 96, 32
SMALL_PREFILL = ((1, 64), (4, 64))
SMALL_DECODE_BATCHES, SMALL_DECODE_CTX, SMALL_DECODE_STEPS = (1, 4), 64, 4
SMALL_PREFIX_WORKLOAD = "shared-prefix:groups=2,prompts=3,system_len=48,question_len=8,output_len=4"

# bf16 dense TFLOP/s and memory GB/s by device-name fragment (first match wins).
GPU_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989.0, 4800.0),
    ("H100 PCIe", 756.0, 2000.0),
    ("H100 NVL", 835.0, 3900.0),
    ("H100", 989.0, 3350.0),
    ("A100", 312.0, 2039.0),
)


class GpuUnavailable(Exception):
    pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


def matmul_params(c: ModelConfig) -> tuple[int, int]:
    """(linear-layer weights per token through the decoder, LM-head weights)."""
    q = c.num_heads * c.head_dim
    kv = c.num_kv_heads * c.head_dim
    per_layer = (
        c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    )
    return c.num_layers * per_layer, c.hidden_size * c.vocab_size


def prefill_flops(c: ModelConfig, batch: int, tokens: int) -> float:
    """Model FLOPs of a batch of causal prefills (one logits row per sequence)."""
    body, head = matmul_params(c)
    attn = 2.0 * c.num_layers * tokens * tokens * c.num_heads * c.head_dim  # QK^T + AV, causal
    return batch * (2.0 * body * tokens + attn + 2.0 * head)


def decode_bytes(c: ModelConfig, dtype_bytes: int, batch: int, ctx: int) -> float:
    """Bytes a decode step must read: every weight once plus each request's KV."""
    body, head = matmul_params(c)
    return float((body + head) * dtype_bytes + batch * ctx * c.kv_bytes_per_token(dtype_bytes))


def rel_rms(got: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (got.float() - ref.float()).pow(2).mean().sqrt()
    return float(diff / ref.float().pow(2).mean().sqrt().clamp_min(1e-12))


def exactness(loaded: LoadedModel, hf: Any, length: int, suffix: int, tol: float) -> dict[str, Any]:
    """Cached-prefix logits vs full prefill (and vs transformers), plus a wrong-KV control."""
    rng = np.random.default_rng(1)
    vocab = loaded.config.vocab_size
    ids = rng.integers(0, vocab, size=length, dtype=np.int64)
    other = rng.integers(0, vocab, size=length, dtype=np.int64)
    k = length - suffix
    runner = TorchRunner(loaded, 3 * length)
    full_slots = np.arange(1, 1 + length, dtype=np.int64)
    cached_slots = np.arange(1 + length, 1 + 2 * length, dtype=np.int64)
    other_slots = np.arange(1 + 2 * length, 1 + 3 * length, dtype=np.int64)

    def extend(
        rid: str, tokens: np.ndarray, start: int, prefix: np.ndarray, new: np.ndarray
    ) -> torch.Tensor:
        req = Req(rid, tokens, SamplingParams(max_new_tokens=1))
        entry = ExtendEntry(req, start, tokens[start:].astype(np.int32), prefix, new, True)
        return runner.forward_logits(Batch([entry], []), all_tokens=True)[rid]

    full = extend("full", ids, 0, EMPTY, full_slots)[k:]
    extend("head", ids[:k], 0, EMPTY, cached_slots[:k])
    cached = extend("tail", ids, k, cached_slots[:k], cached_slots[k:])
    extend("other", other[:k], 0, EMPTY, other_slots[:k])
    wrong = extend("wrong", ids, k, other_slots[:k], other_slots[k:])
    out: dict[str, Any] = {
        "prompt_len": length,
        "cached_prefix_len": k,
        "tolerance_rel_rms": tol,
        "cached_vs_full_rel_rms": rel_rms(cached, full),
        "cached_vs_full_max_abs": float((cached - full).abs().max()),
        "cached_vs_full_top1_agree": float((cached.argmax(-1) == full.argmax(-1)).float().mean()),
        "control_wrong_kv_rel_rms": rel_rms(wrong, full),
    }
    if hf is not None:
        with torch.no_grad():
            ref = hf(torch.from_numpy(ids)[None].to(loaded.model.device)).logits[0, k:].float()
        out["ours_vs_transformers_rel_rms"] = rel_rms(full, ref.cpu())
    # bf16 noise differs by kernel: a cached prefix may differ from a full prefill as much as
    # two independent implementations of the full prefill do (twice that, for slack).
    bound = max(tol, 2 * out.get("ours_vs_transformers_rel_rms", 0.0))
    out["bound_rel_rms"] = bound
    out["passed"] = (
        out["cached_vs_full_rel_rms"] <= bound and out["control_wrong_kv_rel_rms"] > 4 * bound
    )
    return out


def build_hf(loaded: LoadedModel) -> Any:
    """``transformers``' own Llama on the same weights (sdpa attention)."""
    import transformers

    cfg = transformers.AutoConfig.for_model(**loaded.config.to_hf())
    with torch.device(loaded.model.device):
        hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=loaded.model.dtype)
    result = hf.load_state_dict(loaded.model.state_dict(), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"transformers weight mismatch: {result}")
    if loaded.config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def hf_prefill_s(hf: Any, device: torch.device, batch: int, tokens: int, vocab: int) -> float:
    ids = torch.randint(0, vocab, (batch, tokens), device=device)
    with torch.no_grad():
        hf(ids[:, :8])  # warm-up
        seconds, _ = _timed(device, lambda: hf(ids, logits_to_keep=1))
    return seconds


def hf_decode_step_s(
    hf: Any, device: torch.device, batch: int, ctx: int, steps: int, vocab: int
) -> float:
    """Median-free estimate: (generate of ``steps`` tokens - generate of 1) / (steps - 1)."""
    ids = torch.randint(0, vocab, (batch, ctx), device=device)
    mask = torch.ones_like(ids)

    def gen(n: int) -> Any:
        return hf.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )

    with torch.no_grad():
        gen(2)  # warm-up
        one, _ = _timed(device, lambda: gen(1))
        many, _ = _timed(device, lambda: gen(steps))
    return (many - one) / (steps - 1)


def gpu_check(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    device = torch.device(args.gpu_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GpuUnavailable(
            "--gpu-check needs a CUDA device and torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); for a CPU dry "
            "run add --gpu-device cpu --gpu-model tiny-random --gpu-small"
        )
    small = args.gpu_small
    exact_len, exact_suffix = (
        (SMALL_EXACT_LEN, SMALL_EXACT_SUFFIX) if small else (GPU_EXACT_LEN, GPU_EXACT_SUFFIX)
    )
    prefill_shapes = SMALL_PREFILL if small else GPU_PREFILL
    dec_batches, dec_ctx, dec_steps = (
        (SMALL_DECODE_BATCHES, SMALL_DECODE_CTX, SMALL_DECODE_STEPS)
        if small
        else (GPU_DECODE_BATCHES, GPU_DECODE_CTX, GPU_DECODE_STEPS)
    )
    workload = SMALL_PREFIX_WORKLOAD if small else GPU_PREFIX_WORKLOAD

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak_tflops, peak_bw = args.peak_tflops, args.peak_bw_gbs
    for fragment, tflops, bw in GPU_PEAKS:
        if fragment in name:
            peak_tflops = peak_tflops or tflops
            peak_bw = peak_bw or bw
            break
    t0 = time.perf_counter()
    loaded = load_model(args.gpu_model, device=device, dtype=args.gpu_dtype)
    _sync(device)
    c = loaded.config
    itemsize = loaded.model.dtype.itemsize
    report: dict[str, Any] = {
        "device": name,
        "model": loaded.name,
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "params": c.num_params,
        "peak_tflops": peak_tflops,
        "peak_bw_gbs": peak_bw,
        "load_s": time.perf_counter() - t0,
    }
    console.print(f"loaded {loaded.name} on {name} in {report['load_s']:.1f} s")
    hf = build_hf(loaded)
    report["exactness"] = exactness(loaded, hf, exact_len, exact_suffix, args.bf16_tol)
    console.print(f"exactness: {report['exactness']}")

    rng = np.random.default_rng(0)
    pool = max(
        max(b * (t + 1) for b, t in prefill_shapes),
        max(dec_batches) * (dec_ctx + dec_steps),
    )
    runner = TorchRunner(loaded, pool)
    run_one(runner, 1, 16, 2, rng)  # warm-up
    prefill_rows = []
    for batch, tokens in prefill_shapes:
        ours_s, _ = run_one(runner, batch, tokens, 1, rng)
        theirs_s = hf_prefill_s(hf, device, batch, tokens, c.vocab_size)
        flops = prefill_flops(c, batch, tokens)
        prefill_rows.append(
            {
                "batch": batch,
                "prompt_len": tokens,
                "ours_tok_s": batch * tokens / ours_s,
                "ours_tflops": flops / ours_s / 1e12,
                "ours_mfu": None if not peak_tflops else flops / ours_s / 1e12 / peak_tflops,
                "hf_tok_s": batch * tokens / theirs_s,
                "hf_mfu": None if not peak_tflops else flops / theirs_s / 1e12 / peak_tflops,
            }
        )
    report["prefill"] = prefill_rows
    decode_rows = []
    for batch in dec_batches:
        _, ours_step = run_one(runner, batch, dec_ctx, dec_steps, rng)
        theirs_step = hf_decode_step_s(hf, device, batch, dec_ctx, dec_steps, c.vocab_size)
        nbytes = decode_bytes(c, itemsize, batch, dec_ctx + dec_steps // 2)
        decode_rows.append(
            {
                "batch": batch,
                "context": dec_ctx,
                "ours_tok_s": batch / ours_step,
                "ours_ms_per_step": ours_step * 1e3,
                "ours_bw_gbs": nbytes / ours_step / 1e9,
                "ours_bw_frac": None if not peak_bw else nbytes / ours_step / 1e9 / peak_bw,
                "hf_tok_s": batch / theirs_step,
                "hf_ms_per_step": theirs_step * 1e3,
                "hf_bw_frac": None if not peak_bw else nbytes / theirs_step / 1e9 / peak_bw,
            }
        )
    report["decode"] = decode_rows
    del runner
    on, off, saving = bench_prefix(loaded, workload, "lpm", 1)
    report["prefix"] = {
        "workload": workload,
        "on": on._asdict(),
        "off": off._asdict(),
        "saving": saving._asdict(),
    }
    return report


def gpu_tables(report: dict[str, Any]) -> list[Table]:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    pre = Table(
        title=f"prefill, {report['model']} {report['dtype']} on {report['device']} "
        f"(peak {report['peak_tflops']} TFLOP/s)"
    )
    for col in ("batch x tokens", "ours tok/s", "ours TFLOP/s", "ours MFU", "hf tok/s", "hf MFU"):
        pre.add_column(col, justify="right")
    for r in report["prefill"]:
        pre.add_row(
            f"{r['batch']} x {r['prompt_len']}",
            f"{r['ours_tok_s']:,.0f}",
            f"{r['ours_tflops']:,.1f}",
            pct(r["ours_mfu"]),
            f"{r['hf_tok_s']:,.0f}",
            pct(r["hf_mfu"]),
        )
    dec = Table(title=f"decode (peak {report['peak_bw_gbs']} GB/s)")
    for col in ("batch", "ours tok/s", "ours ms/step", "ours GB/s", "ours BW", "hf tok/s", "hf BW"):
        dec.add_column(col, justify="right")
    for r in report["decode"]:
        dec.add_row(
            str(r["batch"]),
            f"{r['ours_tok_s']:,.1f}",
            f"{r['ours_ms_per_step']:,.2f}",
            f"{r['ours_bw_gbs']:,.0f}",
            pct(r["ours_bw_frac"]),
            f"{r['hf_tok_s']:,.1f}",
            pct(r["hf_bw_frac"]),
        )
    return [pre, dec]


# ---- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--parts", nargs="+", choices=["throughput", "prefix"], default=["throughput", "prefix"]
    )
    ap.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument(
        "--prefix-workload",
        default=None,
        help="workload spec for every model (default: per model, see PREFIX_WORKLOADS)",
    )
    ap.add_argument("--prefix-policy", default="lpm")
    ap.add_argument("--prefix-repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", default=None, metavar="PATH")
    gpu = ap.add_argument_group("GPU check")
    gpu.add_argument("--gpu-check", action="store_true", help="run the GPU check only")
    gpu.add_argument("--gpu-model", default="llama-3.1-8b-random")
    gpu.add_argument("--gpu-device", default="cuda")
    gpu.add_argument("--gpu-dtype", default="bfloat16")
    gpu.add_argument("--gpu-small", action="store_true", help="tiny shapes (CPU dry run)")
    gpu.add_argument("--bf16-tol", type=float, default=0.02, help="relative RMS logits error")
    gpu.add_argument("--peak-tflops", type=float, default=None, help="default: by device name")
    gpu.add_argument("--peak-bw-gbs", type=float, default=None, help="default: by device name")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    console = Console()

    if args.gpu_check:
        try:
            report = gpu_check(args, console)
        except GpuUnavailable as e:
            print(f"engine_bench: error: {e}", file=sys.stderr)
            return 2
        for table in gpu_tables(report):
            console.print(table)
        console.print(f"prefix (cache on vs off): {report['prefix']['saving']}")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=2)
        return 0 if report["exactness"]["passed"] else 1

    rows: list[Row] = []
    prefix_runs: list[tuple[PrefixRun, PrefixRun, PrefixSaving]] = []
    prefix_specs: dict[str, str] = {}
    for name in args.models:
        loaded = load_model(name, device=args.device, dtype=args.dtype)
        if "throughput" in args.parts:
            rows.extend(bench_model(loaded, args.batches, args.prompt_len, args.decode_steps))
        if "prefix" in args.parts:
            spec = args.prefix_workload or PREFIX_WORKLOADS.get(name, DEFAULT_PREFIX_WORKLOAD)
            prefix_specs[name] = spec
            prefix_runs.append(bench_prefix(loaded, spec, args.prefix_policy, args.prefix_repeats))

    threads = torch.get_num_threads()
    if rows:
        console.print(
            throughput_table(
                rows,
                f"TorchRunner on {args.device} ({threads} threads), prompt {args.prompt_len} "
                f"tokens, {args.decode_steps} decode steps",
            )
        )
    if prefix_runs:
        console.print(
            prefix_table(
                prefix_runs,
                f"prefix hits through Engine on {args.device} ({threads} threads)",
            )
        )
        for name, spec in prefix_specs.items():
            console.print(f"  {name}: {spec}")
    if args.json:
        meta = {
            "device": args.device,
            "dtype": args.dtype or ("float32" if args.device == "cpu" else "bfloat16"),
            "threads": threads,
            "prompt_len": args.prompt_len,
            "decode_steps": args.decode_steps,
            "prefix_workloads": prefix_specs,
            "prefix_policy": args.prefix_policy,
        }
        doc = {
            "meta": meta,
            "rows": [r._asdict() for r in rows],
            "prefix": [
                {"on": on._asdict(), "off": off._asdict(), "saving": s._asdict()}
                for on, off, s in prefix_runs
            ],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

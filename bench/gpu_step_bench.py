"""Measured step times of Llama-family models on a real GPU, against the roofline's prediction.

What an engine's forward costs, measured the way vLLM and SGLang run it: bf16 weights, one CUDA
graph per shape (no launch overhead), fused-enough kernels (cuBLAS GEMMs, PyTorch's flash
attention through ``scaled_dot_product_attention``), RMSNorm, rotary embedding and SiLU as
PyTorch element-wise ops. Weights are random (timings do not depend on values); the model's
shape comes from radixsched's own preset (``sim.cost.hardware.MODELS``), one tensor-parallel
shard of it when ``tp > 1`` (all-reduces not included: the roofline models them separately).

Per model, ``--layers`` decoder layers are captured and timed, then scaled to the model's depth
(layers are identical), plus the final norm and the LM head (on the last token of a prefill, on
every sequence of a decode):

- prefill: one sequence of ``T`` new tokens, causal attention, no cached prefix;
- prefix prefill: ``T`` new tokens after ``P`` cached ones (attention over the prefix);
- decode: ``B`` sequences of context ``c`` each, one new token each, the KV written in place.

Run on a GPU machine (writes JSON Lines, one row per shape, and prints a table)::

    python bench/gpu_step_bench.py --out gpu_steps.jsonl

then, anywhere, compare with the roofline (no torch needed)::

    python bench/gpu_step_bench.py --compare gpu_steps.jsonl --gpu H100

``--device cpu --quick`` checks the script itself on a CPU (tiny shapes, no graphs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

# (preset, tensor-parallel degree): each model is measured as one shard of that degree.
MODELS = [
    ("llama-3.1-8b", 1),
    ("llama-2-7b", 1),
    ("llama-2-13b", 1),
    ("qwen2.5-7b", 1),
    ("codellama-34b", 2),
    ("llama-2-70b", 4),
    ("llama-3.1-70b", 4),
]
PREFILL_TOKENS = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PREFIX_CASES = [(256, 4096), (1024, 4096), (2048, 8192)]
DECODE_BATCHES = [1, 4, 16, 32, 64, 128, 256]
DECODE_CONTEXTS = [512, 2048]


# ---- the model (torch) -------------------------------------------------------------------------


class Shard:
    """One tensor-parallel shard's weights for ``layers`` decoder layers of a preset."""

    def __init__(self, torch: Any, spec: Any, tp: int, layers: int, device: str) -> None:
        self.t, self.spec = torch, spec
        dt = torch.bfloat16 if device != "cpu" else torch.float32
        self.heads = max(spec.num_heads // tp, 1)
        self.kv = max(spec.num_kv_heads // tp, 1)
        self.hd = spec.head_dim
        self.inter = spec.intermediate_size // tp
        h = spec.hidden_size

        def w(*shape: int) -> Any:
            return torch.randn(*shape, device=device, dtype=dt) * 0.02

        qkv = (self.heads + 2 * self.kv) * self.hd
        self.layers = [
            dict(
                n1=torch.ones(h, device=device, dtype=dt),
                qkv=w(h, qkv),
                o=w(self.heads * self.hd, h),
                n2=torch.ones(h, device=device, dtype=dt),
                gu=w(h, 2 * self.inter),
                down=w(self.inter, h),
            )
            for _ in range(layers)
        ]
        self.norm = torch.ones(h, device=device, dtype=dt)
        self.head = w(h, spec.vocab_size // tp)
        self.dtype, self.device = dt, device

    def rms(self, x: Any, weight: Any) -> Any:
        t = self.t
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * t.rsqrt(var + 1e-5)).to(x.dtype) * weight

    def rotary(self, x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        rot = self.t.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def split(self, qkv: Any) -> tuple[Any, Any, Any]:
        q_end = self.heads * self.hd
        k_end = q_end + self.kv * self.hd
        return qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]

    def mlp(self, x: Any, lw: dict[str, Any]) -> Any:
        gu = self.rms(x, lw["n2"]) @ lw["gu"]
        g, u = gu[..., : self.inter], gu[..., self.inter :]
        return x + (self.t.nn.functional.silu(g) * u) @ lw["down"]

    def prefill(self, x: Any, past: list[tuple[Any, Any]] | None, cos: Any, sin: Any) -> Any:
        """``x``: [T, hidden]; ``past[i]``: layer i's cached (K, V), [1, kv, P, hd]."""
        sdpa = self.t.nn.functional.scaled_dot_product_attention
        n = x.shape[0]
        for i, lw in enumerate(self.layers):
            q, k, v = self.split(self.rms(x, lw["n1"]) @ lw["qkv"])
            q = self.rotary(q.view(n, self.heads, self.hd), cos, sin).transpose(0, 1)[None]
            k = self.rotary(k.view(n, self.kv, self.hd), cos, sin).transpose(0, 1)[None]
            v = v.view(n, self.kv, self.hd).transpose(0, 1)[None]
            if past is None:
                a = sdpa(q, k, v, is_causal=True, enable_gqa=True)
            else:
                from torch.nn.attention.bias import causal_lower_right

                pk, pv = past[i]
                k, v = self.t.cat((pk, k), dim=2), self.t.cat((pv, v), dim=2)
                mask = causal_lower_right(n, k.shape[2])
                a = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
            x = x + a[0].transpose(0, 1).reshape(n, -1) @ lw["o"]
            x = self.mlp(x, lw)
        return self.logits(x[-1:])

    def decode(self, x: Any, cache: list[tuple[Any, Any]], pos: int, cos: Any, sin: Any) -> Any:
        """``x``: [B, hidden]; ``cache[i]``: layer i's (K, V), [B, kv, c, hd]; writes position
        ``pos`` and attends over ``[0, pos]``."""
        sdpa = self.t.nn.functional.scaled_dot_product_attention
        b = x.shape[0]
        for i, lw in enumerate(self.layers):
            q, k, v = self.split(self.rms(x, lw["n1"]) @ lw["qkv"])
            q = self.rotary(q.view(b, self.heads, self.hd), cos, sin)[:, :, None]
            kc, vc = cache[i]
            kc[:, :, pos] = self.rotary(k.view(b, self.kv, self.hd), cos, sin)
            vc[:, :, pos] = v.view(b, self.kv, self.hd)
            a = sdpa(q, kc[:, :, : pos + 1], vc[:, :, : pos + 1], enable_gqa=True)
            x = x + a.reshape(b, -1) @ lw["o"]
            x = self.mlp(x, lw)
        return self.logits(x)

    def logits(self, x: Any) -> Any:
        return self.rms(x, self.norm) @ self.head


def guarded(torch: Any, fn: Any, device: str, reps: int) -> float:
    """``timed``, or NaN when the shape cannot run here (out of memory, no kernel): the run
    goes on with the next shape."""
    try:
        return timed(torch, fn, device, reps)
    except Exception as exc:
        print(f"# failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        if device != "cpu":
            torch.cuda.empty_cache()
        return float("nan")


def timed(torch: Any, fn: Any, device: str, reps: int) -> float:
    """Seconds per call of ``fn``: a CUDA graph replayed ``reps`` times (GPU), or plain calls."""
    if device == "cpu":
        fn()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return float(start.elapsed_time(end)) / 1e3 / reps


def measure_model(torch: Any, name: str, tp: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    from radixsched.sim.cost.models import get_model

    spec = get_model(name)
    shard = Shard(torch, spec, tp, args.layers, args.device)
    if args.compile:  # as vLLM V1 runs a model: torch.compile'd (fused element-wise ops)
        shard.prefill = torch.compile(shard.prefill, dynamic=True)  # type: ignore[method-assign]
        shard.decode = torch.compile(shard.decode, dynamic=True)  # type: ignore[method-assign]
    scale = spec.num_layers / args.layers
    rows = []
    dev, dt = args.device, shard.dtype

    def trig(*shape: int) -> tuple[Any, Any]:
        ang = torch.rand(*shape, device=dev, dtype=torch.float32)
        return ang.cos().to(dt), ang.sin().to(dt)

    def row(kind: str, seconds: float, head_s: float, **shape: int) -> dict[str, Any]:
        total = (seconds - head_s) * scale + head_s
        out = dict(model=name, tp=tp, kind=kind, ms=round(total * 1e3, 4), **shape)
        out["compiled"] = bool(args.compile)
        print(json.dumps(out), flush=True)
        return out

    head_x = torch.randn(1, spec.hidden_size, device=dev, dtype=dt)
    for n in args.prefill:
        x = torch.randn(n, spec.hidden_size, device=dev, dtype=dt)
        cos, sin = trig(n, 1, shard.hd)
        s = guarded(torch, partial(shard.prefill, x, None, cos, sin), dev, args.reps)
        h = guarded(torch, partial(shard.logits, head_x), dev, args.reps)
        rows.append(row("prefill", s, h, tokens=n, prefix=0))
    for n, p in args.prefix:
        x = torch.randn(n, spec.hidden_size, device=dev, dtype=dt)
        past = [
            (
                torch.randn(1, shard.kv, p, shard.hd, device=dev, dtype=dt),
                torch.randn(1, shard.kv, p, shard.hd, device=dev, dtype=dt),
            )
            for _ in shard.layers
        ]
        cos, sin = trig(n, 1, shard.hd)
        s = guarded(torch, partial(shard.prefill, x, past, cos, sin), dev, args.reps)
        h = guarded(torch, partial(shard.logits, head_x), dev, args.reps)
        rows.append(row("prefill", s, h, tokens=n, prefix=p))
        del past
    for c in args.contexts:
        for b in args.batches:
            cache = [
                (
                    torch.randn(b, shard.kv, c, shard.hd, device=dev, dtype=dt),
                    torch.randn(b, shard.kv, c, shard.hd, device=dev, dtype=dt),
                )
                for _ in shard.layers
            ]
            x = torch.randn(b, spec.hidden_size, device=dev, dtype=dt)
            cos, sin = trig(b, 1, shard.hd)
            hx = torch.randn(b, spec.hidden_size, device=dev, dtype=dt)
            s = guarded(torch, partial(shard.decode, x, cache, c - 1, cos, sin), dev, args.reps)
            h = guarded(torch, partial(shard.logits, hx), dev, args.reps)
            rows.append(row("decode", s, h, batch=b, context=c))
            del cache
    if dev != "cpu":
        torch.cuda.empty_cache()
    return rows


def device_facts(torch: Any, device: str) -> dict[str, Any]:
    """The device, and what its bf16 GEMM and copy reach (the roofline's ceilings)."""
    facts: dict[str, Any] = {"torch": torch.__version__, "device": device}
    if device == "cpu":
        return facts
    facts["name"] = torch.cuda.get_device_name()
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    facts["gemm_tflops"] = round(2 * 8192**3 / timed(torch, lambda: a @ a, device, 20) / 1e12, 1)
    big = torch.empty(2 * 1024**3, device=device, dtype=torch.uint8)
    dst = torch.empty_like(big)
    copy = timed(torch, lambda: dst.copy_(big), device, 20)
    facts["copy_tb_s"] = round(2 * big.numel() / copy / 1e12, 3)  # bytes read + written
    return facts


def run(args: argparse.Namespace) -> None:
    import torch

    out = Path(args.out)
    with out.open("w") as f:
        f.write(json.dumps({"facts": device_facts(torch, args.device)}) + "\n")
        for name, tp in args.models:
            for r in measure_model(torch, name, tp, args):
                f.write(json.dumps(r) + "\n")
            f.flush()


# ---- comparison with the roofline (no torch) ---------------------------------------------------


def predicted_ms(row: dict[str, Any], gpu: str) -> float:
    import numpy as np

    from radixsched.sim.cost.hardware import get_gpu
    from radixsched.sim.cost.models import get_model
    from radixsched.sim.cost.roofline import CostModel, StepShape

    g = get_gpu(gpu)
    curve = {} if g.mfu is None else {"mfu": g.mfu, "prefill_eff_tokens": g.prefill_eff_tokens}
    # The simulator's defaults for this GPU, without the per-step overhead (kernel launches
    # and sampling outside the forward) and the all-reduces (a shard is measured alone).
    cm = CostModel(g, get_model(row["model"]), tp=row["tp"], step_overhead_s=0.0, **curve)
    if row["kind"] == "decode":
        b, c = row["batch"], row["context"]
        shape = StepShape(num_decode=b, decode_ctx=np.array([b * c], dtype=np.int64))
    else:
        n, p = row["tokens"], row["prefix"]
        shape = StepShape(
            num_extend=1,
            extend_tokens=n,
            extend_attn_pairs=n * p + n * (n + 1) // 2,
            extend_prefix_pairs=n * p,
            extend_kv_tokens=p + n,
        )
    return float(cm.step_times(shape)[0]) * 1e3 - cm.allreduce_s(shape.num_tokens) * 1e3


def compare(path: str, gpu: str) -> None:
    """Each measured row beside the roofline's time, then the mean ratio and mean absolute
    error per kind (prefills from 256 tokens, where compute dominates, apart)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    facts = rows[0].get("facts", {})
    print(f"# {facts}")
    ratios: dict[str, list[float]] = {}
    print(f"{'model':<16}{'tp':>3} {'shape':<33}{'measured ms':>12}{'roofline ms':>12}{'ratio':>7}")
    for r in rows[1:]:
        pred = predicted_ms(r, gpu)
        if r["kind"] == "decode":
            shape = f"decode B={r['batch']} c={r['context']}"
        else:
            shape = f"prefill T={r['tokens']} P={r['prefix']}"
        if r.get("compiled"):
            shape += " (compiled)"
        ratio = r["ms"] / pred
        group = r["kind"] if r["kind"] == "decode" or r["tokens"] < 256 else "prefill >= 256"
        ratios.setdefault(f"{group}, prefix" if r.get("prefix") else group, []).append(ratio)
        print(f"{r['model']:<16}{r['tp']:>3} {shape:<33}{r['ms']:>12.3f}{pred:>12.3f}{ratio:>8.2f}")

    for group, rs in ratios.items():
        err = sum(abs(1 / x - 1) for x in rs) / len(rs)
        mean = sum(rs) / len(rs)
        print(f"# {group}: {len(rs)} rows, measured/roofline {mean:.2f}, roofline error {err:.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_steps.jsonl")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers captured per model")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a check of the script)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the layers (as vLLM V1)")
    ap.add_argument("--models", help="comma-separated presets to measure (default: all)")
    ap.add_argument("--no-prefix", action="store_true", help="skip the cached-prefix prefills")
    ap.add_argument("--compare", metavar="JSONL", help="compare measured rows with the roofline")
    ap.add_argument("--gpu", default="H100", help="GPU preset for --compare")
    args = ap.parse_args()
    if args.compare:
        compare(args.compare, args.gpu)
        return
    chosen = set(args.models.split(",")) if args.models else None
    args.models = [("llama-3.1-8b", 8)] if args.quick else MODELS
    args.models = [m for m in args.models if chosen is None or m[0] in chosen]
    args.prefill = [16, 64] if args.quick else PREFILL_TOKENS
    args.prefix = [] if args.no_prefix else [(16, 64)] if args.quick else PREFIX_CASES
    args.batches = [1, 4] if args.quick else DECODE_BATCHES
    args.contexts = [64] if args.quick else DECODE_CONTEXTS
    if args.quick:
        args.layers, args.reps = 1, 1
    run(args)


if __name__ == "__main__":
    main()

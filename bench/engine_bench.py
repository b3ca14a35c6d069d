"""Engine micro-benchmark: prefill and decode tokens/s of ``TorchRunner`` per batch size.

Workload (deterministic, numpy ``default_rng(0)``): ``batch`` requests of ``--prompt-len``
random token ids (0..255, valid for every model). Prefill: all requests in one extend step;
tokens/s = batch * prompt_len / step time (the step's measured ``duration_s``, sampling
included). Decode: then ``--decode-steps`` steps of one token per request (greedy); tokens/s =
batch / median step time. One untimed warm-up prefill + decode per model first.

Run: ``.venv/bin/python bench/engine_bench.py [--json PATH] [--models tiny-random smollm2-135m]
[--batches 1 8 32] [--prompt-len 64] [--decode-steps 8] [--threads N] [--device cpu]
[--dtype float32]``. ``--threads`` sets ``torch.set_num_threads`` (default: torch's choice; on a
busy 2-core box 1 thread is often faster than 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import NamedTuple

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from radixsched.engine.loader import LoadedModel, load_model
from radixsched.engine.runner import TorchRunner
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, DecodeEntry, ExtendEntry


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
    empty = np.zeros(0, dtype=np.int64)
    prefill = runner.forward(
        Batch(
            [
                ExtendEntry(r, 0, r.prompt_ids, empty, row[:prompt_len], True)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    rows: list[Row] = []
    for name in args.models:
        loaded = load_model(name, device=args.device, dtype=args.dtype)
        rows.extend(bench_model(loaded, args.batches, args.prompt_len, args.decode_steps))

    table = Table(
        title=f"TorchRunner on {args.device} ({torch.get_num_threads()} threads), "
        f"prompt {args.prompt_len} tokens, {args.decode_steps} decode steps"
    )
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
    Console().print(table)
    if args.json:
        meta = {
            "device": args.device,
            "dtype": args.dtype or ("float32" if args.device == "cpu" else "bfloat16"),
            "threads": torch.get_num_threads(),
            "prompt_len": args.prompt_len,
            "decode_steps": args.decode_steps,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": [r._asdict() for r in rows]}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

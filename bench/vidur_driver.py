"""Run Vidur once on a lengths-only trace and time its event loop from outside (for
``bench/vidur_bench.py``; run by the interpreter of a venv holding ``vidur``, never radixsched's).

Usage: ``VIDUR_PYTHON bench/vidur_driver.py TRACE.csv OUT.json OUTPUT_DIR [--chunk N]``.

What it builds, with Vidur's own classes (``vidur.simulator.Simulator``, its trace-replay request
generator and its Sarathi replica scheduler): one replica of ``meta-llama/Llama-3-8B`` on one
``h100`` (TP 1, PP 1), Sarathi-Serve chunked prefills of ``--chunk`` tokens, Vidur's batch cap
of 128, KV blocks of 16 tokens for all of the KV memory Vidur's memory planner finds (its default
would reserve a whole longest request per slot: two slots here). Chrome and JSON event traces off,
plots and request metrics as Vidur stores them by default.

The cost model: Vidur's execution-time predictor looks batch times up in tables that it downloads
from the Hugging Face hub at start-up, or else trains from profiling data downloaded from there;
the wheel ships neither and this machine cannot fetch them. The driver fills the same tables (same keys, the lookups in the loop
unchanged) from a roofline of the model on the device instead (``_roofline_tables``), so the event
loop is Vidur's own, and the simulated seconds are this stand-in's, not Vidur's trained models'.

Timing: ``Simulator.run()`` is the event loop followed by ``_write_output`` (the metrics and their
files); the driver times both and reports the loop alone as ``loop_s`` (run minus output) and the
start-up before it (imports, tables, trace load) as ``setup_s``, the stand-in's tables in it as
``tables_s``. The caller times the whole process.
"""

from __future__ import annotations

import argparse
import json
import math
import time

T_START = time.perf_counter()

import numpy as np  # noqa: E402
from vidur.config import (  # noqa: E402
    ClusterConfig,
    MetricsConfig,
    RandomForrestExecutionTimePredictorConfig,
    ReplicaConfig,
    SarathiSchedulerConfig,
    SimulationConfig,
    TraceRequestGeneratorConfig,
)
from vidur.config.config import CacheConfig  # noqa: E402
from vidur.entities import Batch  # noqa: E402
from vidur.execution_time_predictor import sklearn_execution_time_predictor as skl  # noqa: E402
from vidur.simulator import Simulator  # noqa: E402
from vidur.utils.memory_planner import MemoryPlanner  # noqa: E402
from vidur.utils.random import set_seeds  # noqa: E402

MODEL = "meta-llama/Llama-3-8B"
DEVICE = "h100"
NETWORK = "h100_dgx"
BLOCK = 16
KV_GRANULARITY = 256  # Vidur's kv_cache_prediction_granularity (its default)
PEAK_FLOPS = 989e12 * 0.6  # H100 SXM dense bf16, at a 60% matmul efficiency
PEAK_BW = 3.35e12 * 0.8  # H100 SXM HBM3, at 80%
OP_OVERHEAD_MS = 0.004  # one kernel launch


def _ms(flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    return np.maximum(flops / PEAK_FLOPS, nbytes / PEAK_BW) * 1e3 + OP_OVERHEAD_MS


def _table(keys: list[np.ndarray], values: np.ndarray) -> dict[tuple[int, ...], float]:
    """Vidur's prediction table: tuple of ints -> ms for one layer."""
    return dict(zip(zip(*(k.tolist() for k in keys), strict=True), values.tolist(), strict=True))


def _roofline_tables(max_q_tokens: int, max_kv: int, max_chunk: int, max_batch: int) -> dict:
    """Per-layer milliseconds for Llama-3-8B (hidden 4096, 32 query and 8 KV heads of 128, gated
    MLP 14336), keyed as Vidur's predictor looks them up."""
    d, kv_dim, ffn = 4096.0, 1024.0, 14336.0
    n = np.arange(1, max_q_tokens + 1)
    nf = n.astype(np.float64)
    act = nf * d * 2.0  # one bf16 activation row per token

    def gemm(k: float, m: float) -> np.ndarray:
        return _ms(2.0 * nf * k * m, 2.0 * k * m + act * (1 + m / d))

    per_token = {
        "attn_pre_proj": gemm(d, d + 2 * kv_dim),
        "attn_post_proj": gemm(d, d),
        "mlp_up_proj": gemm(d, 2 * ffn),
        "mlp_down_proj": gemm(ffn, d),
        "mlp_act": _ms(nf * ffn * 3, 3 * nf * ffn * 2),
        "attn_rope": _ms(nf * (d + kv_dim) * 4, 2 * nf * (d + kv_dim) * 2),
        "attn_kv_cache_save": _ms(nf, 2 * nf * kv_dim * 2 * 2),
        "input_layernorm": _ms(nf * d * 4, 2 * act),
        "post_attention_layernorm": _ms(nf * d * 4, 2 * act),
        "add": _ms(nf * d, 3 * act),
    }
    tables = {name: _table([n], ms) for name, ms in per_token.items()}
    kv = np.arange(0, max_kv + 1, KV_GRANULARITY)
    chunk = np.arange(32, max_chunk + 1, 32)
    pk, pc = (a.ravel() for a in np.meshgrid(kv, chunk, indexing="ij"))
    pkf, pcf = pk.astype(np.float64), pc.astype(np.float64)
    # Vidur's prefill key is (KV tokens after the chunk, chunk): the chunk attends on average
    # to the KV before it and half of itself.
    ctx = np.maximum(pkf - pcf / 2, pcf / 2)
    tables["attn_prefill"] = _table(
        [pk, pc], _ms(4.0 * pcf * ctx * d, pkf * kv_dim * 4 + pcf * d * 4)
    )
    batch = np.arange(1, max_batch + 1)
    db, dk = (a.ravel() for a in np.meshgrid(batch, kv, indexing="ij"))
    dbf, dkf = db.astype(np.float64), dk.astype(np.float64)
    tables["attn_decode"] = _table([db, dk], _ms(4.0 * dbf * dkf * d, dbf * dkf * kv_dim * 4))
    return tables


def _config(args: argparse.Namespace, max_tokens: int, out_dir: str) -> SimulationConfig:
    predictor = RandomForrestExecutionTimePredictorConfig(
        prediction_max_prefill_chunk_size=args.chunk,
        prediction_max_tokens_per_request=max_tokens,
        cache_dir=f"{out_dir}/cache",
    )
    replica = ReplicaConfig(
        model_name=MODEL,
        device=DEVICE,
        network_device=NETWORK,
        num_pipeline_stages=1,
        tensor_parallel_size=1,
    )
    cache = CacheConfig(block_size=BLOCK)
    cache.num_blocks = MemoryPlanner(replica, cache).get_max_kv_cache_size_in_tokens() // BLOCK
    generator = TraceRequestGeneratorConfig(
        trace_file=args.trace,
        date=DATE,
        prefill_scale_factor=1.0,
        decode_scale_factor=1.0,
        time_scale_factor=1.0,
        max_tokens=max_tokens,
    )
    cluster = ClusterConfig(
        num_replicas=1,
        replica_config=replica,
        cache_config=cache,
        replica_scheduler_config=SarathiSchedulerConfig(chunk_size=args.chunk),
    )
    metrics = MetricsConfig(
        write_json_trace=False, enable_chrome_trace=False, store_plots=False, output_dir=out_dir
    )
    return SimulationConfig(
        cluster_config=cluster,
        request_generator_config=generator,
        execution_time_predictor_config=predictor,
        metrics_config=metrics,
        log_level="warning",
    )


DATE = "2026-01-01"  # the one date bench/vidur_bench.py writes into the trace's Date column


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("output_dir")
    p.add_argument("--chunk", type=int, default=8192)
    args = p.parse_args()
    with open(args.trace) as f:
        rows = [line.split(",") for line in f.read().splitlines()[1:] if line]
    longest = max(int(r[2]) + int(r[3]) for r in rows)
    max_tokens = math.ceil(longest / KV_GRANULARITY) * KV_GRANULARITY
    t_tables = time.perf_counter()
    tables = _roofline_tables(args.chunk + 256, max_tokens, args.chunk, 128)
    tables_s = time.perf_counter() - t_tables
    # Vidur tries its hub-hosted predictions first; this hands it the tables instead.
    skl.SklearnExecutionTimePredictor._load_predictions_from_hf = lambda self: tables
    set_seeds(42)
    sim = Simulator(_config(args, max_tokens, args.output_dir))
    write_s = [0.0]
    write = sim._write_output

    def timed_write() -> None:
        t = time.perf_counter()
        write()
        write_s[0] += time.perf_counter() - t

    sim._write_output = timed_write
    t_run = time.perf_counter()
    sim.run()
    run_s = time.perf_counter() - t_run
    schedulers = sorted({type(s).__name__ for s in sim.scheduler._replica_schedulers.values()})
    result = {
        "requests": len(rows),
        "setup_s": t_run - T_START,
        "tables_s": tables_s,  # the stand-in's tables, part of setup_s
        "loop_s": run_s - write_s[0],
        "write_s": write_s[0],
        "simulated_s": float(sim._time),
        "model": MODEL,
        "device": DEVICE,
        "kv_blocks": sim._config.cluster_config.cache_config.num_blocks,
        "replica_scheduler": ",".join(schedulers),
        "chunk": args.chunk,
        "batches": Batch._id + 1,  # Vidur numbers its batches from 0
    }
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

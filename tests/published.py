"""Public serving measurements replayed through the simulator, uncalibrated
(``tests/data/published_measurements.json``; ``tests/test_published.py`` checks them).

Each row is one published benchmark point with the setup a replay needs: engine, model (a
preset, or a config.json under ``tests/data/models``), GPU, TP, input/output lengths,
concurrency (a closed loop) and the number of requests, and what was measured (mean TTFT and
TPOT, ms). ``predict`` simulates the row with the defaults a user gets (the engine mode's
front-end latency, the GPU's prefill curve, no calibration).

``python tests/published.py`` prints the README table (``--write`` records the predictions
in the data file)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
DATA = HERE / "data" / "published_measurements.json"
MODELS = HERE / "data" / "models"


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DATA.read_text())
    return doc


def _model(name: str) -> str:
    local = MODELS / f"{name}.json"
    return str(local) if local.exists() else name


def predict(row: dict[str, Any]) -> dict[str, float]:
    """Mean TTFT and TPOT (ms) the simulator predicts for ``row``'s setup."""
    from radixsched.config import SchedulerConfig
    from radixsched.request import Req, SamplingParams
    from radixsched.results.requests import tpot_samples, ttft_samples
    from radixsched.sim.settings.engine_modes import ENGINE_MODES
    from radixsched.sim.settings.simconfig import SimConfig
    from radixsched.sim.simulate import simulate
    from radixsched.sim.workloads.load import Workload

    rng = np.random.default_rng(0)
    reqs = []
    for i in range(int(row["num_requests"])):
        prompt = rng.integers(0, 32_000, int(row["input_len"])).astype(np.int32)
        sampling = SamplingParams(max_new_tokens=int(row["output_len"]), ignore_eos=True)
        r = Req(f"p{i}", prompt, sampling)
        r.arrival_time = r.times.arrival = 0.0
        reqs.append(r)
    wl = Workload(row["id"], {}, reqs, has_timestamps=True, arrivals="closed loop")
    mode = row["engine"]
    sched = SchedulerConfig(**ENGINE_MODES[mode])
    sim = SimConfig(
        model=_model(row["model"]),
        gpu=row["gpu"],
        tp=int(row["tp"]),
        engine_mode=mode,
        max_concurrency=int(row["concurrency"]),
    )
    run = simulate(wl, sched, sim, optimal_hit_rate=0.0)
    return {
        "ttft_ms": float(np.mean(ttft_samples(run.requests)) * 1e3),
        "tpot_ms": float(np.mean(tpot_samples(run.requests)) * 1e3),
    }


def _err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas * 100:+.0f}%"


def table(doc: dict[str, Any], predictions: list[dict[str, float]]) -> str:
    lines = [
        "| source | engine | model | GPU x TP | in/out | conc | TTFT ms pub / pred | TPOT ms "
        "pub / pred |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row, p in zip(doc["rows"], predictions, strict=True):
        src = doc["sources"][row["source"]]
        lines.append(
            f"| [{row['source']}]({src['url']}) | {row['engine']} | {row['model']} | "
            f"{row['gpu']} x{row['tp']} | {row['input_len']}/{row['output_len']} | "
            f"{row['concurrency']} | {row['ttft_ms']:.1f} / {p['ttft_ms']:.1f} "
            f"({_err(p['ttft_ms'], row['ttft_ms'])}) | {row['tpot_ms']:.1f} / "
            f"{p['tpot_ms']:.1f} ({_err(p['tpot_ms'], row['tpot_ms'])}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="record the predictions in the file")
    args = ap.parse_args(argv)
    doc = load()
    preds = [predict(r) for r in doc["rows"]]
    print(table(doc, preds))
    if args.write:
        for row, p in zip(doc["rows"], preds, strict=True):
            row["predicted"] = {k: round(v, 3) for k, v in p.items()}
        DATA.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

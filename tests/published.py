"""Public serving measurements replayed through the simulator, uncalibrated
(``tests/data/published_measurements.json``; ``tests/test_published.py`` checks them).

Each row is one published benchmark point with the setup a replay needs: engine, model (a
preset, or a config.json under ``tests/data/models``), GPU, TP, input/output lengths (a
dataset's mean lengths for a dataset row), the number of requests and how they arrive (a
closed loop of ``concurrency`` clients, or Poisson arrivals at ``request_rate``, ``"inf"``
sending every request at t=0), and what was measured: TTFT and TPOT (ms, means or medians)
and output tokens per second. ``predict`` simulates the row with the defaults a user gets
(the engine mode's front-end latency and scheduler settings, the GPU's prefill curve, no
calibration).

``python tests/published.py`` prints the table and its error summary (``--write`` records the
predictions in the data file)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
DATA = HERE / "data" / "published_measurements.json"
MODELS = HERE / "data" / "models"
# The metrics a row may publish, with their table headings.
METRICS = {"ttft_ms": "TTFT ms", "tpot_ms": "TPOT ms", "output_tok_s": "output tok/s"}
ENGINES = ("vllm", "sglang")


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DATA.read_text())
    return doc


def measured(row: dict[str, Any]) -> list[str]:
    """The metrics ``row`` publishes, in table order."""
    return [m for m in METRICS if m in row]


def _model(name: str) -> str:
    local = MODELS / f"{name}.json"
    return str(local) if local.exists() else name


def _rate(row: dict[str, Any]) -> float | None:
    """Poisson arrival rate (req/s; inf: all at t=0), or None for a closed loop."""
    if "concurrency" in row:
        return None
    return math.inf if row["request_rate"] == "inf" else float(row["request_rate"])


def _arrivals(row: dict[str, Any], n: int) -> np.ndarray:
    rate = _rate(row)
    if rate is None or math.isinf(rate):
        return np.zeros(n)
    gaps = np.random.default_rng(1).exponential(1.0 / rate, n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def _workload(row: dict[str, Any]) -> Any:
    from radixsched.request import Req, SamplingParams
    from radixsched.sim.workloads.load import Workload

    n = int(row["num_requests"])
    rng = np.random.default_rng(0)
    reqs = []
    for i, t in enumerate(_arrivals(row, n)):
        prompt = rng.integers(0, 32_000, int(row["input_len"])).astype(np.int32)
        sampling = SamplingParams(max_new_tokens=int(row["output_len"]), ignore_eos=True)
        r = Req(f"p{i}", prompt, sampling)
        r.arrival_time = r.times.arrival = float(t)
        reqs.append(r)
    how = "closed loop" if _rate(row) is None else f"poisson {row['request_rate']} req/s"
    return Workload(row["id"], {}, reqs, has_timestamps=True, arrivals=how)


def predict(row: dict[str, Any]) -> dict[str, float]:
    """The metrics ``row`` publishes, as the simulator predicts them for its setup."""
    from radixsched.config import SchedulerConfig
    from radixsched.sim.settings.engine_modes import scheduler_defaults
    from radixsched.sim.settings.simconfig import SimConfig
    from radixsched.sim.simulate import simulate
    from samples import tpot_samples, ttft_samples

    mode = row["engine"]
    sim = SimConfig(
        model=_model(row["model"]),
        gpu=row["gpu"],
        tp=int(row["tp"]),
        engine_mode=mode,
        max_concurrency=row.get("concurrency"),
    )
    sched = SchedulerConfig(**scheduler_defaults(mode, set(), row["gpu"]))
    run = simulate(_workload(row), sched, sim, optimal_hit_rate=0.0)
    stat = np.median if row.get("stat") == "median" else np.mean
    done = [r for r in run.requests if r.times.finish is not None]
    span = max(r.times.finish for r in done) - min(r.times.arrival for r in done)
    got = {
        "ttft_ms": float(stat(ttft_samples(done)) * 1e3),
        "tpot_ms": float(stat(tpot_samples(done)) * 1e3),
        "output_tok_s": sum(r.output_len for r in done) / span,
    }
    return {m: got[m] for m in measured(row)}


def error(pred: float, meas: float) -> float:
    """Signed relative error of a prediction, in percent."""
    return (pred - meas) / meas * 100


def _load_text(row: dict[str, Any]) -> str:
    if "concurrency" in row:
        return f"conc {row['concurrency']}"
    return "all at t=0" if row["request_rate"] == "inf" else f"{row['request_rate']} req/s"


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _cell(row: dict[str, Any], p: dict[str, float], m: str) -> str:
    """Published / predicted (error); a known miss (outside the test's band) marked †."""
    if m not in row:
        return "—"
    mark = " †" if m in row.get("known_miss", {}) else ""
    return f"{_num(row[m])} / {_num(p[m])} ({error(p[m], row[m]):+.0f}%){mark}"


def table(doc: dict[str, Any], predictions: list[dict[str, float]]) -> str:
    """The README table: one line per row, published / predicted (error) per metric."""
    heads = " | ".join(f"{h} pub / pred" for h in METRICS.values())
    lines = [
        f"| source | engine | model | GPU x TP | in/out | load | n | stat | {heads} |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(METRICS),
    ]
    for row, p in zip(doc["rows"], predictions, strict=True):
        src = doc["sources"][row["source"]]
        lengths = f"{row['input_len']}/{row['output_len']}"
        if "dataset" in row:
            lengths += f" ({row['dataset']} means)"
        cells = " | ".join(_cell(row, p, m) for m in METRICS)
        lines.append(
            f"| [{row['source']}]({src['url']}) | {row['engine']} | {row['model']} | "
            f"{row['gpu']} x{row['tp']} | {lengths} | {_load_text(row)} | "
            f"{row['num_requests']} | {row.get('stat', 'mean')} | {cells} |"
        )
    return "\n".join(lines)


def summary(doc: dict[str, Any], predictions: list[dict[str, float]]) -> str:
    """Mean absolute error per metric over the rows that publish it, per engine."""
    parts = []
    for engine in ENGINES:
        pairs = [(r, p) for r, p in zip(doc["rows"], predictions, strict=True)]
        pairs = [(r, p) for r, p in pairs if r["engine"] == engine]
        cells = []
        for m, head in METRICS.items():
            errs = [abs(error(p[m], r[m])) for r, p in pairs if m in r]
            if errs:
                cells.append(f"{head} {np.mean(errs):.0f}% (n={len(errs)})")
        parts.append(f"{engine}: " + ", ".join(cells))
    return "Mean absolute error, " + "; ".join(parts) + "."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="record the predictions in the file")
    args = ap.parse_args(argv)
    doc = load()
    preds = [predict(r) for r in doc["rows"]]
    print(table(doc, preds))
    print()
    print(summary(doc, preds))
    if args.write:
        for row, p in zip(doc["rows"], preds, strict=True):
            row["predicted"] = {k: round(v, 3) for k, v in p.items()}
        DATA.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

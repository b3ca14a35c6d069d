"""How well simulated runs match measured ones: each run's latency quantiles as the fit's
targets, the per-run comparison the command prints, and the objective the fit minimises."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from radixsched.request import FinishReason, Req

# ---- errors ---------------------------------------------------------------------------------


def _stats(values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0}
    return {
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
    }


def compare(
    predicted: Sequence[Req], measured: Sequence[tuple[float, float, int]]
) -> dict[str, Any]:
    """Predicted vs measured TTFT, ITL (per-request means) and E2E of one run."""
    pt, pi, pe = [], [], []
    for r in predicted:
        t = r.times
        if t.first_token is None or t.finish is None or r.finish is None:
            continue
        if r.finish.reason is FinishReason.ABORT:
            continue
        pt.append(t.first_token - t.arrival)
        pe.append(t.finish - t.arrival)
        if r.output_len >= 2:
            pi.append((t.finish - t.first_token) / (r.output_len - 1))
    mt = [m[0] for m in measured]
    me = [m[1] for m in measured]
    mi = [(m[1] - m[0]) / (m[2] - 1) for m in measured if m[2] >= 2]
    out: dict[str, Any] = {}
    for name, p, m in (("ttft_s", pt, mt), ("itl_s", pi, mi), ("e2e_s", pe, me)):
        ps, ms = _stats(p), _stats(m)
        out[name] = {
            "predicted": ps,
            "measured": ms,
            "error": {k: (ps[k] - ms[k]) / ms[k] if ms[k] else 0.0 for k in ps},
        }
    return out

"""Out-of-sample error of a calibration: leave one run out.

A fit's own error (the runs it was fitted on, replayed with its constants) flatters it: eight
constants can absorb a model mismatch on the runs they see. ``leave_one_out`` fits again
without each run in turn and predicts that run with the constants fitted on the others: the
error a user should expect on a run the calibration has not seen (another rate, another
concurrency, on the same server).

Each held-out fit is warm-started from the full fit's constants (from the defaults it would
cost the full fit's front-end grid again, five fits per run) and iterates on the other runs
alone until its constants settle: the held-out run is in no residual it minimises. Its
start saw that run, so a fit stopped early by ``max_iterations`` errs on the flattering side;
the report says held out, not independent."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixsched.sim.calibrate.fit import fit
from radixsched.sim.calibrate.params import FitResult
from radixsched.sim.calibrate.replay import Replay, predict


@dataclass(frozen=True)
class ErrorSummary:
    """Mean absolute relative error of the runs' mean TTFT, ITL and E2E."""

    ttft: float
    itl: float
    e2e: float
    runs: int

    def to_json(self) -> dict[str, float | int]:
        return {"ttft_s": self.ttft, "itl_s": self.itl, "e2e_s": self.e2e, "runs": self.runs}


def summarise(errors: Sequence[dict[str, Any]]) -> ErrorSummary:
    """``errors`` (per run, ``fit.compare``'s layout) as mean absolute errors."""

    def mean_abs(metric: str) -> float:
        values = [abs(float(e[metric]["error"]["mean"])) for e in errors]
        return float(np.mean(values)) if values else 0.0

    return ErrorSummary(mean_abs("ttft_s"), mean_abs("itl_s"), mean_abs("e2e_s"), len(errors))


def leave_one_out(
    replays: Sequence[Replay],
    full: FitResult,
    *,
    max_iterations: int = 16,
    on_run: Callable[[int, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Per run, its errors predicted by a fit on every other run (module docstring); an
    empty list for fewer than two runs (nothing to fit on without the one held out)."""
    if len(replays) < 2:
        return []
    start = dict(full.constants)
    out = []
    for i, held in enumerate(replays):
        if on_run is not None:
            on_run(i, held.run.name)
        train = [rp for j, rp in enumerate(replays) if j != i]
        result = fit(
            train, start=start, max_iterations=max_iterations, max_efficiency=full.max_efficiency
        )
        out.append(predict(held, result.constants))
    return out

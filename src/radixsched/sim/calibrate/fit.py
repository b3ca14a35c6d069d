"""Fit the cost model's constants to measured runs (``radixsched calibrate``).

Each measured run (``sim.calibrate.measured``) is replayed through the simulator: the same
requests (prompt lengths, output lengths; radixsched runs regenerate the very prompts, others
share the prefixes their file records, ``sim.calibrate.prompts``), sent
when the client sent them where the file records it, else by the run's arrival process
(closed loop at its max concurrency, or Poisson at its rate). The scheduler is stepped one
forward at a time with a recording runner, so every step's shape is known.

The fitted constants enter a step's time linearly once the roofline's branch (compute- or
memory-bound) is fixed::

    compute = C * (a + b / T)      a = 1 / mfu, b = prefill_eff_tokens / mfu
    memory  = M * c                c = 1 / mbu
    step    = max(compute, memory) + o + q * entries + p * prefill entries + fixed
    TTFT    = L + sum over the steps between arrival and first token (partly, at the ends)
    ITL     = sum over the steps between first token and finish / (tokens - 1)

with ``C``, ``M`` the step's compute and memory seconds at full efficiency, ``T`` its tokens,
``o`` the step overhead, ``q`` the scheduler's CPU time per batch entry, ``p`` its extra
time per prefill entry (admission) and ``L`` the per-request fixed latency. Each request's
TTFT and mean ITL is therefore linear in ``(a, b, c, o, q, L, p)`` around the current
schedule. The residuals are relative errors of each
run's TTFT and ITL deciles and means and of its mean and p90 E2E (quantiles are linear in the
constants through the request at that rank); a bounded linear least-squares solve
(``scipy.optimize.lsq_linear``, bounds that keep every constant physical: efficiencies in
(0, ``max_efficiency``], 0.9 unless the user widens it, times >= 0; Huber weights, so one disturbed run cannot pull every constant) gives
new constants; the runs are replayed again with them. This repeats
(Gauss-Newton on the simulator) until the constants settle; the constants with the lowest
replayed error are kept."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from radixsched.sim.calibrate.measured import MeasuredRun
from radixsched.sim.calibrate.params import (
    _SERIAL,
    DEFAULT_MAX_EFFICIENCY,
    FIT_START_PREFILL_EFF_TOKENS,
    CalibrateError,
    FitResult,
    _params,
    param_bounds,
)
from radixsched.sim.calibrate.replay import Replay
from radixsched.sim.calibrate.solve import (
    GRID_ITERATIONS,
    SERIAL_GRID_S,
    SERIAL_TOLERANCE,
    _levenberg_marquardt,
    _Point,
)
from radixsched.sim.cost.roofline import CONSTANTS


def fit(
    replays: Sequence[Replay],
    *,
    start: dict[str, float] | None = None,
    max_iterations: int = 16,
    on_iteration: Callable[[int, float, dict[str, float]], None] | None = None,
    max_efficiency: float = DEFAULT_MAX_EFFICIENCY,
) -> FitResult:
    """Calibrate the constants on ``replays`` (module docstring), ``mfu`` and ``mbu`` at most
    ``max_efficiency``.

    The front end's time per request ``s`` acts through the schedule alone (which requests
    share a prefill, how a burst trickles in), a step function of it near 0, not a smooth
    term: it is chosen on ``SERIAL_GRID_S`` (each point fitted for ``GRID_ITERATIONS``
    replays, from the best point so far), the least value whose error is within
    ``SERIAL_TOLERANCE`` of the best, and the rest is fitted there for ``max_iterations``
    replays. A ``request_serial_s`` in ``start`` fixes it instead.

    The rest is damped Gauss-Newton (Levenberg-Marquardt): each step solves the linearised
    problem with a penalty ``damping * |theta' - theta|^2`` (in scaled units) and is kept
    only if the replayed error falls; otherwise the damping grows and the step is tried again,
    shorter. Undamped steps oscillated: the latency and the prefill cost trade off almost
    exactly on a synchronous run, and each step overshot to the other side (a 64-request
    sweep's error went 1.33, 1.69, 1.10, 1.51, 0.98, ... and was still 0.28 after 20
    iterations)."""
    if not replays:
        raise CalibrateError("no runs to calibrate on")
    base = dict(CONSTANTS)
    # Where the search starts (not a default): a prefill efficiency of zero would leave the
    # compute branch flat in it.
    base["prefill_eff_tokens"] = max(base["prefill_eff_tokens"], FIT_START_PREFILL_EFF_TOKENS)
    base.update(start or {})
    bounds = param_bounds(max_efficiency)
    theta = np.clip(_params(base), *bounds)
    grid = SERIAL_GRID_S if "request_serial_s" not in (start or {}) else (theta[_SERIAL],)
    counter = itertools.count(1)
    best: _Point | None = None
    points = []
    for serial in grid:
        trial_start = (theta if best is None else best.theta).copy()
        trial_start[_SERIAL] = serial
        point = _levenberg_marquardt(
            replays,
            trial_start,
            base,
            GRID_ITERATIONS if len(grid) > 1 else 0,
            counter,
            on_iteration,
            bounds,
        )
        points.append(point)
        if best is None or point.result.objective < best.result.objective:
            best = point
    assert best is not None
    # A sweep often hardly tells 0.1 ms from 10 ms apart (only whether it is above 0): the
    # least front-end time that fits about as well as the best is kept.
    good = (1.0 + SERIAL_TOLERANCE) ** 2 * best.result.objective
    chosen = next(p for p in points if p.result.objective <= good)
    result = _levenberg_marquardt(
        replays, chosen.theta, base, max_iterations, counter, on_iteration, bounds, chosen
    ).result
    return dataclasses.replace(result, max_efficiency=max_efficiency)


def fitted_on(
    runs: Sequence[MeasuredRun], *, model: str, gpu: str, tp: int, engine_mode: str
) -> dict[str, Any]:
    from radixsched.sim.calibrate.readers.radixsched_bench import _radixsched_version

    engines = sorted({r.engine for r in runs if r.engine})
    versions = sorted({str(r.engine_version) for r in runs if r.engine_version})
    return {
        "model": model,
        "gpu": gpu,
        "tp": tp,
        "engine": ", ".join(engines) or "unknown",
        "engine_version": ", ".join(versions) or "unknown",
        "engine_mode": engine_mode,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "radixsched_version": _radixsched_version(),
        "runs": [r.describe() for r in runs],
    }

"""The fit's numerics: each step's time linearised in the constants, a robust least-squares
solve, and a damped (Levenberg-Marquardt) search over the request-serial term."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from radixsched.request import FinishReason
from radixsched.sim.calibrate.compare import compare
from radixsched.sim.calibrate.params import (
    _K,
    _QUANTILES,
    HUBER_DELTA,
    CalibrateError,
    FitResult,
    FloatArray,
    _constants,
)
from radixsched.sim.calibrate.replay import Replay, Simulated, StepLog, _simulate, _weight
from radixsched.sim.deploy.closed_loop import scheduler_arrivals

# ---- linearisation -------------------------------------------------------------------------


@dataclass
class _Linear:
    """Per request: TTFT and mean ITL as ``rows @ theta + const``."""

    ttft_rows: FloatArray
    ttft_const: FloatArray
    itl_rows: FloatArray
    itl_const: FloatArray
    ok: npt.NDArray[np.bool_]
    out: npt.NDArray[np.float64]  # output tokens


def _step_features(log: StepLog, theta: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per step: the feature row of (a, b, c, o, q) under the branch ``theta`` selects, and
    the seconds no parameter scales."""
    a, b, c = theta[0], theta[1], theta[2]
    comp = np.asarray(log.compute)
    mem = np.asarray(log.memory)
    tok = np.maximum(np.asarray(log.tokens, dtype=np.float64), 1.0)
    ent = np.asarray(log.entries, dtype=np.float64)
    compute_bound = comp * (a + b / tok) >= mem * c
    n = len(comp)
    phi = np.zeros((n, _K))
    phi[:, 0] = np.where(compute_bound, comp, 0.0)
    phi[:, 1] = np.where(compute_bound, comp / tok, 0.0)
    phi[:, 2] = np.where(compute_bound, 0.0, mem)
    phi[:, 3] = 1.0
    phi[:, 4] = ent
    phi[:, 6] = np.asarray(log.extends, dtype=np.float64)
    return phi, np.asarray(log.other)


def _linearise(sim: Simulated, theta: FloatArray) -> _Linear:
    phi, other = _step_features(sim.log, theta)
    start = np.asarray(sim.log.start)
    dur = np.asarray(sim.log.duration)
    end = start + dur
    cum_phi = np.vstack([np.zeros((1, _K)), np.cumsum(phi, axis=0)])
    cum_other = np.concatenate([[0.0], np.cumsum(other)])
    cum_dur = np.concatenate([[0.0], np.cumsum(dur)])
    n = len(sim.reqs)
    out = _Linear(
        np.zeros((n, _K)),
        np.zeros(n),
        np.zeros((n, _K)),
        np.zeros(n),
        np.zeros(n, bool),
        np.array([r.output_len for r in sim.reqs], dtype=np.float64),
    )
    order = sorted(range(n), key=lambda i: sim.reqs[i].times.arrival)
    at_scheduler = np.empty(n)
    at_scheduler[order] = scheduler_arrivals(
        [sim.reqs[i].times.arrival for i in order], sim.latency, sim.serial
    )
    for i, r in enumerate(sim.reqs):
        t = r.times
        if t.first_token is None or t.finish is None or r.finish is None:
            continue
        if r.finish.reason is FinishReason.ABORT:
            continue
        arrive = float(at_scheduler[i])
        front = arrive - t.arrival - sim.latency  # waited for the front end (s's doing)
        # Steps ending in (arrive, first_token]: whole ones, and the one under way at arrival.
        j0 = int(np.searchsorted(end, arrive, side="right"))
        j1 = int(np.searchsorted(end, t.first_token + 1e-12, side="right"))
        rows = cum_phi[j1] - cum_phi[j0]
        const = cum_other[j1] - cum_other[j0]
        busy = cum_dur[j1] - cum_dur[j0]
        if j0 < j1 and start[j0] < arrive:  # only part of that step is waited for
            frac = (end[j0] - arrive) / dur[j0] if dur[j0] > 0 else 0.0
            rows = rows - (1.0 - frac) * phi[j0]
            const -= (1.0 - frac) * other[j0]
            busy -= (1.0 - frac) * dur[j0]
        idle = max((t.first_token - arrive) - busy, 0.0)
        row = rows.copy()
        row[5] = 1.0  # + L
        out.ttft_rows[i], out.ttft_const[i] = row, const + idle + front
        k = r.output_len - 1
        if k >= 1:
            j2 = int(np.searchsorted(end, t.finish + 1e-12, side="right"))
            out.itl_rows[i] = (cum_phi[j2] - cum_phi[j1]) / k
            gap = (t.finish - t.first_token) - (cum_dur[j2] - cum_dur[j1])
            out.itl_const[i] = (cum_other[j2] - cum_other[j1] + max(gap, 0.0)) / k
        out.ok[i] = True
    return out


# No 0: a real front end never hands two requests to the scheduler at the same instant, and
# with 0 a closed loop's clients, finishing in one step, would all be prefilled in one batch.
SERIAL_GRID_S = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
GRID_ITERATIONS = 4
SERIAL_TOLERANCE = 0.05  # relative error of the fit within which a smaller s is preferred


def _levenberg_marquardt(
    replays: Sequence[Replay],
    theta: FloatArray,
    base: dict[str, float],
    iterations: int,
    counter: Iterator[int],
    on_iteration: Callable[[int, float, dict[str, float]], None] | None,
    bounds: tuple[FloatArray, FloatArray],
    current: _Point | None = None,
) -> _Point:
    """Up to ``iterations`` tried steps from ``theta`` (evaluated unless ``current`` is it),
    ``request_serial_s`` held where it is; the best point reached."""
    if current is None:
        current = _evaluate(replays, theta, base, next(counter), on_iteration)
    damping = INITIAL_DAMPING
    for _ in range(iterations):
        a_mat, y = _linear_system(replays, current.sims, current.theta)
        # Columns on comparable scales, so the solver's tolerances mean the same for each.
        scale = np.maximum(np.abs(a_mat).max(axis=0), 1e-300)
        x0 = current.theta * scale
        solved = _robust_solve(a_mat / scale, y, scale, x0, damping, bounds)
        new = np.clip(solved / scale, *bounds)
        # A column no residual depends on keeps its value (nothing measured constrains it).
        unused = np.abs(a_mat).max(axis=0) == 0
        new[unused] = current.theta[unused]
        change = np.max(np.abs(new - current.theta) / np.maximum(np.abs(current.theta), 1e-9))
        if change < 1e-3:
            break
        trial = _evaluate(replays, new, base, next(counter), on_iteration)
        if trial.result.objective < current.result.objective:
            current = trial
            damping = max(damping / DAMPING_FACTOR, MIN_DAMPING)
        else:
            damping *= DAMPING_FACTOR
    return current


INITIAL_DAMPING = 1.0
DAMPING_FACTOR = 3.0
MIN_DAMPING = 1e-6


@dataclass
class _Point:
    """The constants ``theta`` replayed: what the fit keeps of one evaluation."""

    theta: FloatArray
    result: FitResult
    sims: list[list[Simulated]]


def _evaluate(
    replays: Sequence[Replay],
    theta: FloatArray,
    base: dict[str, float],
    it: int,
    on_iteration: Callable[[int, float, dict[str, float]], None] | None,
) -> _Point:
    consts = _constants(theta, base)
    sims = [_simulate(rp, consts) for rp in replays]
    for rp, s in zip(replays, sims, strict=True):
        _check_served(rp, s)
    errors = [
        {"run": rp.run.name, **compare([r for d in s for r in d.reqs], rp.measured)}
        for rp, s in zip(replays, sims, strict=True)
    ]
    obj = _objective(errors, [_weight(rp) for rp in replays])
    if on_iteration is not None:
        on_iteration(it, obj, consts)
    return _Point(theta, FitResult(consts, errors, it, obj), sims)


# A residual's row or target beyond this (relative to its measured value) comes of a measured
# time next to 0 (no real one is): the least-squares solve would overflow on it.
_MAX_ROW = 1e12


def _check_served(replay: Replay, sims: Sequence[Simulated]) -> None:
    """Every request of the replay was served, whole: one the simulated server rejected, or
    cut short (it does not fit the KV capacity modelled, ...), has no prediction to compare
    with its measurement."""
    where = f"{replay.run.path}: {replay.run.name}"
    measured = sorted(m[2] for m in replay.measured)
    for sim in sims:
        lost = [r for r in sim.reqs if r.finish is None or r.finish.reason is FinishReason.ABORT]
        if lost:
            r = lost[0]
            why = "not finished" if r.finish is None else r.finish.message
            raise CalibrateError(
                f"{where}: {len(lost)} of {len(sim.reqs)} requests were not served in the "
                f"replay (request {r.rid}: {why})"
            )
        replayed = sorted(r.output_len for r in sim.reqs)
        if replayed != measured:
            raise CalibrateError(
                f"{where}: the replay generated {sum(replayed)} output tokens, "
                f"{sum(measured)} were measured: requests were cut short to fit the context "
                "or KV capacity modelled (--max-total-tokens, --model)"
            )


def _linear_system(
    replays: Sequence[Replay], sims: Sequence[list[Simulated]], theta: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Rows (relative to the measured values) and targets of the problem linearised at
    ``theta`` over the schedules ``sims`` replayed there. No row depends on the front end's
    time per request: it acts through the schedule (``fit`` searches it)."""
    rows: list[FloatArray] = []
    y: list[float] = []
    for rp, s in zip(replays, sims, strict=True):
        r, c, v = _targets([_linearise(d, theta) for d in s], rp, theta)
        w = _weight(rp)
        for row, const, value in zip(r, c, v, strict=True):
            if value <= 0:
                continue
            rows.append(w * row / value)
            y.append(w * (value - const) / value)
            if not (np.abs(rows[-1]).max() < _MAX_ROW and abs(y[-1]) < _MAX_ROW):
                raise CalibrateError(
                    f"{rp.run.path}: {rp.run.name}: a measured time of {value:.3g} s: too "
                    "small to fit relative errors on"
                )
    if not rows:
        raise CalibrateError("no successful request to calibrate on")
    return np.vstack(rows), np.asarray(y)


def _robust_solve(
    a_mat: FloatArray,
    y: FloatArray,
    scale: FloatArray,
    x0: FloatArray,
    damping: float,
    bounds: tuple[FloatArray, FloatArray],
) -> FloatArray:
    """Bounded least squares with Huber weights (iteratively reweighted): residuals beyond
    ``HUBER_DELTA`` (relative error) count linearly, so one disturbed run (another process
    took the machine for a while) cannot pull every constant. ``damping`` adds
    ``damping * |x - x0|^2`` (x in scaled units: a Levenberg-Marquardt step from ``x0``)."""
    from scipy.optimize import lsq_linear

    k = a_mat.shape[1]
    pull = math.sqrt(damping) * np.eye(k)
    weights = np.ones(len(y))
    x = np.asarray(x0, dtype=np.float64)
    for _ in range(4):
        sw = np.sqrt(weights)
        sol = lsq_linear(
            np.vstack([a_mat * sw[:, None], pull]),
            np.concatenate([y * sw, pull @ x0]),
            bounds=(bounds[0] * scale, bounds[1] * scale),
            method="bvls",
        )
        x = sol.x
        r = np.abs(a_mat @ x - y)
        new = np.where(r <= HUBER_DELTA, 1.0, HUBER_DELTA / np.maximum(r, 1e-300))
        if np.allclose(new, weights, rtol=1e-3, atol=1e-6):
            break
        weights = new
    result: FloatArray = x
    return result


def _quantile_rows(
    rows: FloatArray, const: FloatArray, theta: FloatArray, q: float
) -> tuple[FloatArray, float]:
    """The linear form of the ``q``-th percentile (numpy's linear interpolation) of
    ``rows @ theta + const`` at ``theta``."""
    values = rows @ theta + const
    order = np.argsort(values, kind="stable")
    pos = (len(values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    w = pos - lo
    row = (1 - w) * rows[order[lo]] + w * rows[order[hi]]
    c = (1 - w) * const[order[lo]] + w * const[order[hi]]
    return row, float(c)


def _targets(
    lins: Sequence[_Linear], replay: Replay, theta: FloatArray
) -> tuple[list[FloatArray], list[float], list[float]]:
    """Rows, constants and measured values of one run's residuals (see module docstring);
    the predictions of every arrival draw are pooled."""
    meas = np.array(replay.measured, dtype=np.float64)
    m_ttft, m_e2e, m_out = meas[:, 0], meas[:, 1], meas[:, 2]
    rows: list[FloatArray] = []
    consts: list[float] = []
    values: list[float] = []
    t_rows = np.vstack([lin.ttft_rows[lin.ok] for lin in lins])
    if not len(t_rows):
        return rows, consts, values
    t_const = np.concatenate([lin.ttft_const[lin.ok] for lin in lins])
    i_rows = np.vstack([lin.itl_rows[lin.ok & (lin.out >= 2)] for lin in lins])
    i_const = np.concatenate([lin.itl_const[lin.ok & (lin.out >= 2)] for lin in lins])
    multi = m_out >= 2
    m_itl = (m_e2e[multi] - m_ttft[multi]) / (m_out[multi] - 1)
    series = [(t_rows, t_const, m_ttft)]
    if multi.any() and len(i_rows):
        series.append((i_rows, i_const, m_itl))
    for r, c, m in series:
        rows.append(r.mean(axis=0))
        consts.append(float(c.mean()))
        values.append(float(m.mean()))
        for q in _QUANTILES:
            qr, qc = _quantile_rows(r, c, theta, q)
            rows.append(qr)
            consts.append(qc)
            values.append(float(np.percentile(m, q)))
    # E2E = TTFT + (tokens - 1) * ITL, per request.
    e_rows = np.vstack(
        [
            lin.ttft_rows[lin.ok]
            + np.maximum(lin.out[lin.ok] - 1, 0)[:, None] * lin.itl_rows[lin.ok]
            for lin in lins
        ]
    )
    e_const = np.concatenate(
        [
            lin.ttft_const[lin.ok] + np.maximum(lin.out[lin.ok] - 1, 0) * lin.itl_const[lin.ok]
            for lin in lins
        ]
    )
    rows.append(e_rows.mean(axis=0))
    consts.append(float(e_const.mean()))
    values.append(float(m_e2e.mean()))
    qr, qc = _quantile_rows(e_rows, e_const, theta, 90.0)
    rows.append(qr)
    consts.append(qc)
    values.append(float(np.percentile(m_e2e, 90)))
    return rows, consts, values


def _objective(errors: Sequence[dict[str, Any]], weights: Sequence[float]) -> float:
    total = 0.0
    for e, w in zip(errors, weights, strict=True):
        for metric in ("ttft_s", "itl_s", "e2e_s"):
            for k in ("mean", "p50", "p90"):
                x = w * e[metric]["error"][k]
                total += x * x  # (inf, not OverflowError, when a measured time is ~0)
    return total

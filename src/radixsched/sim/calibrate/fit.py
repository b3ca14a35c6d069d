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
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, StepResult
from radixsched.sim.calibrate.measured import MeasuredRun
from radixsched.sim.calibrate.prompts import replay_prompts
from radixsched.sim.cost.build import resolve_specs
from radixsched.sim.cost.roofline import CONSTANTS, CostModel, shape_of
from radixsched.sim.cost.runner import CostModelRunner
from radixsched.sim.deploy.closed_loop import scheduler_arrivals
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.workloads.load import Workload

FloatArray = npt.NDArray[np.float64]
logger = logging.getLogger(__name__)

# Fitted parameters: a = 1/mfu, b = prefill_eff_tokens/mfu, c = 1/mbu, o, q, L, p, s (seconds).
_NAMES = (
    "a",
    "b",
    "c",
    "step_overhead_s",
    "sched_per_req_s",
    "request_latency_s",
    "sched_per_prefill_s",
    "request_serial_s",
)
_LOWER = np.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
_UPPER = np.array([1e4, 1e8, 1e4, 1.0, 0.1, 10.0, 1.0, 0.05])
# The most of the GPU's datasheet peak (mfu) and bandwidth (mbu) a fit may credit it with:
# large GEMMs reach ~80% of bf16 peak on H100, streaming copies ~90% of HBM bandwidth
# (``sim.cost.hardware``); a fit that wants more is compensating for something the replay
# gets wrong (``sim.calibrate.diagnose``). ``calibrate --max-efficiency`` widens it.
DEFAULT_MAX_EFFICIENCY = 0.9


def upper_bounds(max_efficiency: float) -> dict[str, float]:
    """The largest value the fit allows each constant (``sim.calibrate.diagnose``)."""
    times = {n: float(u) for n, u in zip(_NAMES, _UPPER, strict=True) if n.endswith("_s")}
    return {
        "mfu": max_efficiency,
        "mbu": max_efficiency,
        "prefill_eff_tokens": _MAX_PREFILL_EFF_TOKENS,
        **times,
    }


def param_bounds(max_efficiency: float) -> tuple[FloatArray, FloatArray]:
    """Lower and upper bounds of the fitted parameters: ``a = 1/mfu`` and ``c = 1/mbu`` at
    least ``1 / max_efficiency``."""
    if not 0.0 < max_efficiency <= 1.0:
        raise CalibrateError(f"max_efficiency must be in (0, 1], got {max_efficiency}")
    lower = _LOWER.copy()
    lower[0] = lower[2] = 1.0 / max_efficiency
    return lower, _UPPER.copy()


_SERIAL = _NAMES.index("request_serial_s")
_K = len(_NAMES)
_QUANTILES = (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0)
_MAX_PREFILL_EFF_TOKENS = 8192.0
FIT_START_PREFILL_EFF_TOKENS = 64.0
HUBER_DELTA = 0.1  # relative error beyond which a residual's weight falls off


class CalibrateError(ValueError):
    """Runs that cannot be calibrated on (nothing succeeded, unknown model, ...)."""


# ---- constants <-> parameters ------------------------------------------------------------


def _params(constants: dict[str, float]) -> FloatArray:
    a = 1.0 / constants["mfu"]
    return np.array(
        [
            a,
            constants["prefill_eff_tokens"] * a,
            1.0 / constants["mbu"],
            constants["step_overhead_s"],
            constants["sched_per_req_s"],
            constants["request_latency_s"],
            constants["sched_per_prefill_s"],
            constants["request_serial_s"],
        ]
    )


def _constants(theta: FloatArray, base: dict[str, float]) -> dict[str, float]:
    a, b, c, o, q, lat, qp, serial = (float(v) for v in theta)
    out = dict(base)
    out.update(
        mfu=min(1.0, 1.0 / a),
        mbu=min(1.0, 1.0 / c),
        prefill_eff_tokens=min(b / a, _MAX_PREFILL_EFF_TOKENS),
        step_overhead_s=o,
        sched_per_req_s=q,
        request_latency_s=lat,
        sched_per_prefill_s=qp,
        request_serial_s=serial,
    )
    return out


# ---- replay --------------------------------------------------------------------------------


@dataclass
class StepLog:
    start: list[float]
    duration: list[float]
    compute: list[float]
    memory: list[float]
    tokens: list[int]
    entries: list[int]
    extends: list[int]
    other: list[float]


class RecordingRunner(CostModelRunner):
    """The simulator's runner, one forward per step, remembering each step's terms."""

    supports_multi_step = False

    def __init__(self, cost: Any, *, seed: int, clock: VirtualClock, log: StepLog) -> None:
        super().__init__(cost, seed=seed)
        self.clock = clock
        self.log = log

    def forward(self, batch: Batch) -> StepResult:
        result = super().forward(batch)
        cost = self.cost
        base = cost if isinstance(cost, CostModel) else getattr(cost, "base", None)
        if not isinstance(base, CostModel):
            raise TypeError(f"calibration replays need a roofline cost model, got {cost!r}")
        c, m, t, e, other = base.step_terms(shape_of(batch))
        log = self.log
        log.start.append(self.clock.now())
        log.duration.append(result.duration_s)
        log.compute.append(c)
        log.memory.append(m)
        log.tokens.append(t)
        log.entries.append(e)
        log.extends.append(len(batch.extend))
        log.other.append(other)
        return result


@dataclass(frozen=True)
class Replay:
    """What one run's replay needs: the requests, how they arrive, the settings."""

    run: MeasuredRun
    # One workload per arrival draw: the measured sends, or (unknown sends, Poisson) several
    # draws of the process, pooled, so that one draw's luck does not bias the fit.
    workloads: list[Workload]
    sched: SchedulerConfig
    sim: SimConfig
    measured: list[tuple[float, float, int]]  # per request (TTFT, E2E, output tokens)


POISSON_DRAWS = 4
# Weight of a run replayed from draws of its arrival process rather than its own sends: its
# measured sample is one realisation, and near saturation the realisation moves everything.
DRAWN_WEIGHT = 0.3


def _weight(replay: Replay) -> float:
    return DRAWN_WEIGHT if len(replay.workloads) > 1 else 1.0


def _fit_to_limits(req: Req, vocab: int | None, context: int | None) -> Req:
    """The request as ``radixsched bench`` sent it (``server.bench.fit_request``'s rule)."""
    ids = req.prompt_ids
    max_new = req.sampling.max_new_tokens
    if context:
        max_new = max(1, min(max_new, context // 2))
        ids = ids[: max(1, min(len(ids), context - max_new - 1))]
    if vocab:
        ids = (np.asarray(ids, dtype=np.int64) % vocab).astype(np.int32)
    return dataclasses.replace(
        req, prompt_ids=ids, sampling=SamplingParams(max_new_tokens=max_new, ignore_eos=True)
    )


def _replay_requests(run: MeasuredRun, index: int) -> list[Req]:
    """The run's successful requests, each with its measured output length."""
    from radixsched.sim.workloads.load import load_workload

    wl = run.workload
    if run.prompts is None and run.source == "radixsched" and wl.get("spec"):
        rate = wl.get("request_rate")
        # The params bench recorded, so the spec's left-out params take bench's values.
        params = wl.get("params")
        defaults = {str(wl["name"]): params} if wl.get("name") and params else None
        loaded = load_workload(
            str(wl["spec"]),
            request_rate=math.inf if rate in (None, "inf") else float(rate),
            num_requests=wl.get("num_requests"),
            seed=int(wl.get("seed") or 0),
            defaults=defaults,
        )
        by_rid = {r.rid: r for r in loaded.requests}
        rids = [rid for rid in wl.get("rids", []) if rid in by_rid]
        reqs = []
        if len(rids) == len(run.requests):
            base = [by_rid[rid] for rid in rids]
            reqs = [_fit_to_limits(r, wl.get("vocab_size"), wl.get("context_len")) for r in base]
        if reqs and all(
            r.prompt_len == m.prompt_len for r, m in zip(reqs, run.requests, strict=True)
        ):
            return [
                dataclasses.replace(
                    r,
                    sampling=SamplingParams(max_new_tokens=m.output_len, ignore_eos=True),
                    arrival_time=r.arrival_time,
                )
                for r, m in zip(reqs, run.requests, strict=True)
            ]
        # Another workload than bench sent (another generator version, an edited file):
        # request-unique prompts of the measured lengths, without the shared prefixes.
        logger.warning(
            "%s: %s: workload %r does not regenerate the requests bench sent: replayed "
            "without their shared prefixes",
            run.path,
            run.name,
            wl["spec"],
        )
    return replay_prompts(run, index)


def build_replay(run: MeasuredRun, index: int, sched: SchedulerConfig, sim: SimConfig) -> Replay:
    """The replay of ``run`` (the module docstring says how requests arrive)."""
    _check_fits_context(run, sim)
    sends = [m.sent_at for m in run.requests]
    measured = [(m.ttft_s, m.e2e_s, m.output_len) for m in run.requests]
    if all(s is not None for s in sends):
        reqs = _replay_requests(run, index)
        for r, t in zip(reqs, sends, strict=True):
            r.arrival_time = float(t or 0.0)
        sim = dataclasses.replace(sim, max_concurrency=None)
        return Replay(run, [_workload(run, reqs, "measured send times")], sched, sim, measured)
    sim = dataclasses.replace(sim, max_concurrency=run.max_concurrency)
    if not math.isfinite(run.request_rate):
        how = "closed loop" if run.max_concurrency else "all at once"
        return Replay(
            run, [_workload(run, _replay_requests(run, index), how)], sched, sim, measured
        )
    draws = []
    for k in range(POISSON_DRAWS):
        reqs = _replay_requests(run, index)
        gaps = np.random.default_rng([index, k, 0xA771]).exponential(
            1.0 / run.request_rate, len(reqs)
        )
        for r, t in zip(reqs, np.concatenate([[0.0], np.cumsum(gaps[:-1])]).tolist(), strict=True):
            r.arrival_time = t
        draws.append(_workload(run, reqs, f"poisson {run.request_rate:g}/s, draw {k}"))
    return Replay(run, draws, sched, sim, measured)


def _check_fits_context(run: MeasuredRun, sim: SimConfig) -> None:
    """Every measured request fits the context of the model simulated: one that does not
    was served by another model (the simulator would cut it short, or reject it)."""
    _, model = resolve_specs(sim.gpu, sim.model, sim.context_length)
    limit = model.max_context_len
    for i, m in enumerate(run.requests):
        if m.prompt_len + m.output_len > limit:
            raise CalibrateError(
                f"{run.path}: {run.name}: request {i}: {m.prompt_len} prompt + {m.output_len} "
                f"output tokens do not fit the {limit}-token context of {model.name}: were "
                "these runs served by another model? (give --model)"
            )


def _workload(run: MeasuredRun, reqs: list[Req], how: str) -> Workload:
    for r in reqs:
        r.times.arrival = r.arrival_time
    reqs = sorted(reqs, key=lambda r: r.arrival_time)
    return Workload(run.name, {}, reqs, has_timestamps=True, arrivals=how)


@dataclass
class Simulated:
    reqs: list[Req]
    log: StepLog
    latency: float
    serial: float


def _simulate(replay: Replay, constants: dict[str, float]) -> list[Simulated]:
    return [_simulate_one(replay, wl, constants) for wl in replay.workloads]


def _simulate_one(replay: Replay, workload: Workload, constants: dict[str, float]) -> Simulated:
    from radixsched.sim.simulate import simulate

    log = StepLog([], [], [], [], [], [], [], [])

    def factory(cost: Any, seed: int, clock: VirtualClock) -> RecordingRunner:
        return RecordingRunner(cost, seed=seed, clock=clock, log=log)

    sim = dataclasses.replace(
        replay.sim,
        mfu=constants["mfu"],
        mbu=constants["mbu"],
        step_overhead_ms=constants["step_overhead_s"] * 1e3,
        prefill_eff_tokens=constants["prefill_eff_tokens"],
        sched_step_ms=constants["sched_step_s"] * 1e3,
        sched_per_req_ms=constants["sched_per_req_s"] * 1e3,
        sched_per_prefill_ms=constants["sched_per_prefill_s"] * 1e3,
        request_latency_ms=constants["request_latency_s"] * 1e3,
        request_serial_ms=constants["request_serial_s"] * 1e3,
        calibration=None,
    )
    run = simulate(
        workload,
        replay.sched,
        sim,
        optimal_hit_rate=0.0,
        runner_factory=factory,
    )
    return Simulated(
        run.requests, log, constants["request_latency_s"], constants["request_serial_s"]
    )


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
        if r.finish.reason.value == "abort":
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
        if r.finish.reason.value == "abort":
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


def _objective(errors: Sequence[dict[str, Any]], weights: Sequence[float]) -> float:
    total = 0.0
    for e, w in zip(errors, weights, strict=True):
        for metric in ("ttft_s", "itl_s", "e2e_s"):
            for k in ("mean", "p50", "p90"):
                x = w * e[metric]["error"][k]
                total += x * x  # (inf, not OverflowError, when a measured time is ~0)
    return total


# ---- the fit --------------------------------------------------------------------------------


@dataclass
class FitResult:
    constants: dict[str, float]
    errors: list[dict[str, Any]]  # per run: compare() plus name
    iterations: int
    objective: float
    max_efficiency: float = DEFAULT_MAX_EFFICIENCY  # the bound mfu and mbu were fitted under


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
        lost = [r for r in sim.reqs if r.finish is None or r.finish.reason.value == "abort"]
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


def predict(replay: Replay, constants: dict[str, float]) -> dict[str, Any]:
    """Replay one run with ``constants`` and compare with what was measured."""
    sims = _simulate(replay, constants)
    return {"run": replay.run.name, **compare([r for d in sims for r in d.reqs], replay.measured)}

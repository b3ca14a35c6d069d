"""A measured run replayed through the simulator: its requests rebuilt (with the prefixes the
report records), their arrivals as the benchmark sent them, and every step the scheduler ran
recorded for the fit."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixsched.clock import VirtualClock
from radixsched.config import SchedulerConfig
from radixsched.request import Req, SamplingParams
from radixsched.runner import Batch, StepResult
from radixsched.sim.calibrate.compare import compare
from radixsched.sim.calibrate.measured import MeasuredRun
from radixsched.sim.calibrate.params import CalibrateError, logger
from radixsched.sim.calibrate.prompts import replay_prompts
from radixsched.sim.cost.build import resolve_specs
from radixsched.sim.cost.roofline import CostModel, shape_of
from radixsched.sim.cost.runner import CostModelRunner
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.workloads.load import Workload, load_workload

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
    """The request as ``radixsched bench`` sent it (``client.bench.fit_request``'s rule)."""
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
    run = simulate(workload, replay.sched, sim, optimal_hit_rate=0.0, runner_factory=factory)
    return Simulated(
        run.requests, log, constants["request_latency_s"], constants["request_serial_s"]
    )


def predict(replay: Replay, constants: dict[str, float]) -> dict[str, Any]:
    """Replay one run with ``constants`` and compare with what was measured."""
    sims = _simulate(replay, constants)
    return {"run": replay.run.name, **compare([r for d in sims for r in d.reqs], replay.measured)}

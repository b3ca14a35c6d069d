"""Where a sweep's points run: one simulation per point, guarded so one failure is a row, in
local processes or on a Ray cluster."""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from radixsched.sim.sweep.config import (
    Metrics,
    RunFn,
    Settings,
    SweepError,
    _trace_version,
    resolve_settings,
)

if TYPE_CHECKING:
    from radixsched.sim.workloads.load import DraftMemo


def simulate_point(settings: Settings) -> Metrics:
    """The default run function: one simulation, its ``PolicyResult`` flattened (with SLO
    attainment when the point sets SLO targets)."""
    from radixsched.results.requests import SloTargets
    from radixsched.results.service import slo_result
    from radixsched.results.writers import flatten_result
    from radixsched.sim.settings.runconfig import DEFAULT_WORKLOAD
    from radixsched.sim.simulate import simulate
    from radixsched.sim.workloads.load import DraftMemo, load_workload, workload_optimal_hit_rate

    global _last_workload, _prompts
    r = resolve_settings(settings)
    sched = r.scheduler_config()
    sim = r.sim_config()
    wl = r.workload
    seed = sched.seed if wl.seed is None else wl.seed
    key: tuple[Any, ...] = (wl.spec or DEFAULT_WORKLOAD, wl.request_rate, wl.num_requests, seed)
    key += (sched.page_size, _trace_version(key[0]))
    if _last_workload is None or _last_workload[0] != key:
        _last_workload = None  # the previous one is freed before the next is built
        _prompts = _prompts or DraftMemo()
        workload = load_workload(
            key[0], request_rate=key[1], num_requests=key[2], seed=key[3], memo=_prompts
        )
        _last_workload = (key, workload, workload_optimal_hit_rate(workload, sched.hit_unit))
    _, workload, optimal = _last_workload
    run = simulate(workload, sched, sim, optimal_hit_rate=optimal)
    result = run.result
    slo = SloTargets(
        None if r.slo_ttft_ms is None else r.slo_ttft_ms / 1e3,
        None if r.slo_tpot_ms is None else r.slo_tpot_ms / 1e3,
    )
    if slo.active:
        result = dataclasses.replace(result, slo=slo_result(run.requests, slo, result.makespan_s))
    return flatten_result(result)


# ---- execution -------------------------------------------------------------------------------


class RunOutcome(NamedTuple):
    metrics: Metrics | None  # None when the run failed
    error: str | None
    wall_s: float


def run_guarded(run_fn: RunFn, settings: Settings) -> RunOutcome:
    """Run one point; an exception becomes the outcome's error (the sweep goes on)."""
    t0 = time.perf_counter()
    try:
        metrics = run_fn(settings)
    except Exception as e:  # any failure of one run is reported, not fatal
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
        return RunOutcome(None, f"{type(e).__name__}: {e}{where}", time.perf_counter() - t0)
    return RunOutcome(dict(metrics), None, time.perf_counter() - t0)


class SweepExecutor(Protocol):
    def map(
        self, run_fn: RunFn, points: Sequence[Settings], on_result: OnResult | None = None
    ) -> list[RunOutcome]: ...


class LocalExecutor:
    """``jobs`` worker processes (spawned, so nothing is inherited from the caller's threads);
    ``jobs == 1`` runs in this process. ``run_fn`` must be importable (a module-level
    function)."""

    def __init__(self, jobs: int = 1) -> None:
        if jobs < 1:
            raise ValueError("jobs must be >= 1")
        self.jobs = jobs

    def map(
        self, run_fn: RunFn, points: Sequence[Settings], on_result: OnResult | None = None
    ) -> list[RunOutcome]:
        out: list[RunOutcome | None] = [None] * len(points)
        if self.jobs == 1 or len(points) <= 1:
            for i, p in enumerate(points):
                out[i] = run_guarded(run_fn, p)
                if on_result is not None:
                    on_result(i, out[i])  # type: ignore[arg-type]
        else:
            ctx = multiprocessing.get_context("spawn")
            workers = min(self.jobs, len(points))
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = {pool.submit(run_guarded, run_fn, p): i for i, p in enumerate(points)}
                for fut in as_completed(futures):
                    i = futures[fut]
                    out[i] = fut.result()
                    if on_result is not None:
                        on_result(i, out[i])  # type: ignore[arg-type]
        return [o for o in out if o is not None]


class RayExecutor:
    """One ``ray.remote`` task per run. Connects with ``ray.init(address=...)`` unless Ray is
    already initialised (then that session is used and left running); a session started here
    is shut down afterwards."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._started = False  # this executor started the session (and shuts it down)

    def connect(self) -> None:
        """Join Ray's session now (unless one is running), so that a missing ``ray`` package
        or an unreachable cluster fails before any run: ``SweepError`` naming ``--ray``."""
        try:
            import ray
        except ImportError:
            raise SweepError(
                f"--ray {self.address}: the ray package is not installed "
                "(pip install 'radixsched[ray]'); or run without --ray on local processes"
            ) from None
        if ray.is_initialized():
            return
        try:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        except Exception as e:  # ConnectionError, RuntimeError, ValueError ... by version
            detail = " ".join(str(e).split()) or type(e).__name__
            raise SweepError(f"--ray {self.address}: cannot connect to Ray: {detail}") from None
        self._started = True

    def map(
        self, run_fn: RunFn, points: Sequence[Settings], on_result: OnResult | None = None
    ) -> list[RunOutcome]:
        import ray

        self.connect()
        started, self._started = self._started, False
        try:
            task = ray.remote(num_cpus=1)(run_guarded)
            refs = [task.remote(run_fn, p) for p in points]
            index = {ref: i for i, ref in enumerate(refs)}
            out: list[RunOutcome | None] = [None] * len(points)
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = index[ref]
                    out[i] = RunOutcome(*ray.get(ref))
                    if on_result is not None:
                        on_result(i, out[i])  # type: ignore[arg-type]
            return [o for o in out if o is not None]
        finally:
            if started:
                ray.shutdown()


OnResult = Callable[[int, RunOutcome], None]


# The workload (with its optimal hit rate) of the last point this process ran: the next point
# with the same workload settings reuses it (``simulate`` never changes a workload). A sweep's
# points vary their last key fastest, so a worker often runs several on one workload. A point
# at another request rate reuses the prompts at least (``_prompts``).
_last_workload: tuple[tuple[Any, ...], Any, float] | None = None

_prompts: DraftMemo | None = None  # made on first use

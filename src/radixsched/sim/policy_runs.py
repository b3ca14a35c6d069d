"""Every policy of one ``simulate`` command over the workload it loaded once, several at a time
in processes of their own (``--jobs``).

Each simulation is single-threaded and independent of the others, so a comparison of N
policies on a machine with N cores takes about as long as one. Workers are forked after the
load: they inherit the workload (its prompt arrays are never written, so their pages stay
shared) instead of receiving a pickled copy, and each sends back only what the command prints
and writes (``PolicyOutcome``: the result, its series, the failure summary and, when asked, the
per-request rows), never its requests. A run's results do not depend on the process it ran in
or on the other runs: any ``jobs`` gives the same outcomes as 1 (``tests/test_policy_runs.py``);
only the wall times differ. Off Linux (Windows cannot fork; macOS can, but its system libraries
are not safe across a fork), the policies run one after another in this process.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from radixsched.config import SchedulerConfig
from radixsched.results.metrics import PolicyResult
from radixsched.results.requests import RequestRow, SloTargets, failure_summary, request_rows
from radixsched.results.series import TimeSeries
from radixsched.results.service import slo_result
from radixsched.sim.deploy.run import SimRun
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.simulate import simulate
from radixsched.sim.workloads.load import Workload, workload_optimal_hit_rate

if TYPE_CHECKING:
    import multiprocessing
    from concurrent.futures import Future

# (policy index, requests done, requests in all): how a run reports its progress.
Progress = Callable[[int, int, int], None]
# A run reports at most this many times (a worker's report crosses a pipe, and a display
# redraws); the simulation calls back on every step that finishes a request.
REPORTS_PER_RUN = 100


@dataclass
class PolicyOutcome:
    """What the command reads of one policy's run."""

    result: PolicyResult
    series: TimeSeries
    ttft_s: np.ndarray
    failures: str  # ``failure_summary`` of its requests ("" when none failed)
    rows: list[RequestRow] | None  # ``request_rows``, when the command writes them


@dataclass(frozen=True)
class PolicyRuns:
    """One workload, the settings every run shares, and what to keep of each run."""

    workload: Workload
    base: SchedulerConfig = field(default_factory=SchedulerConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    # The workload's optimal hit rate (None: computed once by ``run_policies``, before forking).
    optimal_hit_rate: float | None = None
    slo: SloTargets = field(default_factory=SloTargets)
    keep_rows: bool = False  # compute the per-request rows (``--requests-csv``)

    def run(
        self,
        policy: str,
        report: Callable[[int, int], None] | None,
        left: list[Any] | None = None,
    ) -> PolicyOutcome:
        """Simulate ``policy``. A setting only the run itself rejects raises ``ValueError``.
        ``left``: the run (its requests, replicas, scheduler) is added to it instead of being
        freed on return, for a process that ends without freeing anything (``run_policies``)."""
        cfg = dataclasses.replace(self.base, schedule_policy=policy)
        # A process that ends after this run reads the workload's requests no more: the run
        # takes them as they are (the last run; earlier ones ran copies).
        run = simulate(
            self.workload, cfg, self.sim, on_progress=report,
            optimal_hit_rate=self.optimal_hit_rate, reuse_requests=left is not None,
        )  # fmt: skip
        if left is not None:
            left.append(run)
        return self._outcome(run)

    def _outcome(self, run: SimRun) -> PolicyOutcome:
        result = run.result
        if self.optimal_hit_rate is not None and math.isnan(self.optimal_hit_rate):
            # Not computed (deferred prompts): the summary's 0.0 stand-in would read as a bound.
            result = dataclasses.replace(result, optimal_hit_rate=math.nan)
        if self.slo.active:
            result = dataclasses.replace(
                result, slo=slo_result(run.requests, self.slo, result.makespan_s)
            )
        rows = None
        if self.keep_rows:
            rows = request_rows(result.policy, run.requests, run.replica_of, self.slo)
        return PolicyOutcome(result, run.series, run.ttft_s, failure_summary(run.requests), rows)


def default_jobs(num_policies: int) -> int:
    """One process per CPU this process may run on, at most one per policy; 1 where processes
    cannot fork."""
    if not can_fork():
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(num_policies, cpus or 1))


def can_fork() -> bool:
    """Whether workers may be forked: on Linux. macOS offers fork but its system libraries are
    not safe across it (Python starts processes afresh there by default). Linux always offers
    the fork start method: multiprocessing (imported only by a forking run) is not asked."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


class PolicyFailed(Exception):
    """A run rejected its settings (the ``ValueError`` of ``PolicyRuns.run``), naming the
    policy."""

    def __init__(self, policy: str, message: str) -> None:
        super().__init__(policy, message)
        self.policy = policy
        self.message = message

    def __str__(self) -> str:
        return f"{self.policy}: {self.message}"


def run_policies(
    runs: PolicyRuns,
    policies: Sequence[str],
    jobs: int,
    progress: Progress | None = None,
    display: AbstractContextManager[Any] | None = None,
    left: list[Any] | None = None,
) -> list[PolicyOutcome]:
    """Each policy's outcome, in the order given. ``display`` (a progress display) is entered
    once the workers exist: a process must not fork while a display's thread runs. ``left``
    (a process that ends right after without freeing anything, ``cli.main.exit_now``): the
    last run in this process is added to it rather than freed, the teardown of its requests'
    token times, replicas and trees (11 ms of a run of the Mooncake trace) skipped. Only the
    last: each earlier run is freed before the next starts, as without it."""
    shown = display if display is not None else nullcontext()
    if runs.optimal_hit_rate is None:
        opt = workload_optimal_hit_rate(runs.workload, page_size=runs.base.hit_unit)
        runs = dataclasses.replace(runs, optimal_hit_rate=opt)
    if jobs <= 1 or len(policies) <= 1 or not can_fork():
        last = len(policies) - 1
        outcomes = []
        with shown:
            for i, p in enumerate(policies):
                # Inside a caller's frozen heap (the command's program freezes its workload,
                # ``cli.simulate``) a run's own frozen heap collects nothing before it
                # freezes (``sim.heap.frozen_heap``): the garbage of the run before (cycles
                # that hold its trees and pools) is collected here, a pass over what is not
                # frozen, instead of frozen for the command.
                if i and gc.get_freeze_count():
                    gc.collect()
                outcomes.append(_run_here(runs, i, p, progress, left if i == last else None))
        return outcomes
    return _run_forked(runs, policies, jobs, progress, shown)


def _run_forked(
    runs: PolicyRuns,
    policies: Sequence[str],
    jobs: int,
    progress: Progress | None,
    shown: AbstractContextManager[Any],
) -> list[PolicyOutcome]:
    """``run_policies`` in forked workers, at most ``jobs`` at a time."""
    # Imported here: a run in this process needs neither (about 10 ms of a command's start).
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("fork")
    reports: multiprocessing.Queue[tuple[int, int, int]] = ctx.Queue()
    _INHERITED.update(runs=runs, policies=list(policies), reports=reports)
    # Objects that exist before the fork are left out of the workers' collections: a
    # collection writes to every object it visits, which would copy each inherited page.
    # (A caller's own frozen heap stays frozen.)
    thaw = gc.get_freeze_count() == 0
    gc.freeze()
    others = {p.pid for p in multiprocessing.active_children()}
    pool = ProcessPoolExecutor(
        min(jobs, len(policies)), mp_context=ctx, initializer=_die_with, initargs=(os.getpid(),)
    )
    workers: list[multiprocessing.process.BaseProcess] = []
    ended = False
    try:
        futures = [pool.submit(_work, i) for i in range(len(policies))]  # forks the workers
        workers = [p for p in multiprocessing.active_children() if p.pid not in others]
        with shown:
            _relay(futures, reports, progress, len(runs.workload.requests))
        for f in futures:  # a failed run first: the others may still be running
            if f.done() and f.exception() is not None:
                f.result()
        outcomes = [f.result() for f in futures]
        ended = True
        return outcomes
    finally:
        if not ended:  # a run failed, or an interrupt: no run goes on, none starts
            for p in workers:
                p.terminate()
        pool.shutdown(wait=ended, cancel_futures=not ended)
        if thaw:
            gc.unfreeze()
        _INHERITED.clear()


def _every_hundredth(i: int, progress: Progress) -> Callable[[int, int], None]:
    """``progress`` for run ``i``, passed on only when another ``1 / REPORTS_PER_RUN`` of the
    requests is done, and at the end (a run reports every step that finishes one)."""
    last = 0

    def report(done: int, total: int) -> None:
        nonlocal last
        if done == total or done - last >= max(total // REPORTS_PER_RUN, 1):
            last = done
            progress(i, done, total)

    return report


def _run_here(
    runs: PolicyRuns,
    i: int,
    policy: str,
    progress: Progress | None,
    left: list[Any] | None = None,
) -> PolicyOutcome:
    report = None if progress is None else _every_hundredth(i, progress)
    try:
        return runs.run(policy, report) if left is None else runs.run(policy, report, left)
    except ValueError as e:
        raise PolicyFailed(policy, str(e)) from e


# What forked workers inherit from the parent: set just before the pool forks them.
_INHERITED: dict[str, Any] = {}


def _die_with(parent: int) -> None:
    """Have the kernel kill this worker when the command's process ends, however it ends (a
    SIGKILL or a SIGTERM leaves it no chance to stop its workers): an orphan would simulate on
    for nobody. Linux only, as forking is here (``prctl(PR_SET_PDEATHSIG)``)."""
    # Imported here, as the pool's are: a run in this process needs neither.
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl in this C library: the workers may outlive it
        return
    if os.getppid() != parent:  # it ended before the setting took effect
        os._exit(1)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _work(i: int) -> PolicyOutcome:
    """Run policy ``i`` in a worker, reporting progress through the inherited queue."""
    runs: PolicyRuns = _INHERITED["runs"]
    reports: multiprocessing.Queue[tuple[int, int, int]] = _INHERITED["reports"]
    return _run_here(runs, i, _INHERITED["policies"][i], lambda *report: reports.put(report))


def _relay(
    futures: list[Future[PolicyOutcome]],
    reports: multiprocessing.Queue[tuple[int, int, int]],
    progress: Progress | None,
    total: int,
) -> None:
    """Pass the workers' progress reports on until every run has ended well, or one failed; a
    run that ended well is shown complete (its last report may still be in the pipe)."""
    import queue  # a worker's module, as the pool's are (``_run_forked``)

    shown_done: set[int] = set()
    while len(shown_done) < len(futures):
        try:
            i, done, of = reports.get(timeout=0.1)
            if progress is not None and i not in shown_done:
                progress(i, done, of)
        except queue.Empty:
            pass
        for i, f in enumerate(futures):
            if f.done() and i not in shown_done:
                if f.exception() is not None:
                    return  # the command fails: no need to wait for the others
                shown_done.add(i)
                if progress is not None:
                    progress(i, total, total)

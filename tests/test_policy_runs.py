"""simulate's policies side by side (``radixsched.sim.policy_runs``, ``--jobs``): forked workers
give exactly the outcomes of runs one after another in this process."""

from __future__ import annotations

import gc
import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixsched.cli.main import main
from radixsched.config import SchedulerConfig
from radixsched.results.requests import SloTargets
from radixsched.sim import policy_runs
from radixsched.sim.policy_runs import (
    REPORTS_PER_RUN,
    PolicyFailed,
    PolicyOutcome,
    PolicyRuns,
    default_jobs,
    run_policies,
)
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.simulate import simulate
from radixsched.sim.workloads.load import load_workload

needs_fork = pytest.mark.skipif(not policy_runs.can_fork(), reason="processes cannot fork here")

POLICIES = ["fcfs", "lpm", "random", "dfs-weight", "hrrn"]


def _runs(keep_rows: bool = True) -> PolicyRuns:
    # Overloaded, chunked and retracting: every part of an outcome is exercised.
    wl = load_workload("shared-prefix:groups=6,prompts=6,system_len=700", request_rate=40, seed=3)
    return PolicyRuns(
        wl,
        SchedulerConfig(chunked_prefill_size=512),
        SimConfig(max_total_tokens=6_000),
        optimal_hit_rate=0.5,
        slo=SloTargets(ttft_s=0.5, tpot_s=0.05),
        keep_rows=keep_rows,
    )


def _same(a: PolicyOutcome, b: PolicyOutcome) -> None:
    ja, jb = a.result.to_json(), b.result.to_json()
    for j in (ja, jb):  # real time, the only thing a process changes
        j.pop("wall_s")
        j.pop("requests_per_wall_s", None)
    assert ja == jb
    assert a.failures == b.failures
    assert a.rows == b.rows
    assert np.array_equal(a.ttft_s, b.ttft_s, equal_nan=True)
    for col_a, col_b in zip(a.series.arrays(), b.series.arrays(), strict=True):
        assert np.array_equal(col_a, col_b)


@needs_fork
def test_forked_runs_give_the_outcomes_of_runs_in_process() -> None:
    runs = _runs()
    here = run_policies(runs, POLICIES, jobs=1)
    frozen = gc.get_freeze_count()
    forked = run_policies(runs, POLICIES, jobs=3)
    assert gc.get_freeze_count() == frozen or frozen > 0  # the heap frozen for the fork, thawed
    assert [o.result.policy for o in forked] == POLICIES  # the order given, not of completion
    assert any(o.result.retractions for o in here)  # the workload is a real test
    assert all(o.result.slo is not None for o in forked) and all(o.rows for o in forked)
    for a, b in zip(here, forked, strict=True):
        _same(a, b)


def test_defaults_compute_the_optimal_bound_once_as_simulate_does() -> None:
    wl = load_workload("shared-prefix:groups=3,prompts=4,system_len=300", request_rate=20, seed=1)
    (out,) = run_policies(PolicyRuns(wl), ["lpm"], jobs=1)
    alone = simulate(wl, SchedulerConfig(schedule_policy="lpm"), SimConfig())
    assert out.result.optimal_hit_rate == alone.result.optimal_hit_rate > 0
    assert out.result.hit_rate == alone.result.hit_rate
    assert out.rows is None and out.result.slo is None


def test_the_last_run_in_process_is_left_to_the_caller_and_changes_nothing() -> None:
    # ``left``: the process ends next (the CLI) and skips the last run's teardown. Only the
    # last run is kept: the others are freed before the next starts, as without it.
    runs = _runs()
    policies = ["fcfs", "lpm", "hrrn"]
    left: list[Any] = []
    kept = run_policies(runs, policies, jobs=1, left=left)
    assert [type(r).__name__ for r in left] == ["SimRun"] and left[0].result.policy == "hrrn"
    assert len(left[0].requests) == len(runs.workload.requests)
    for a, b in zip(kept, run_policies(runs, policies, jobs=1), strict=True):
        _same(a, b)


@needs_fork
def test_forked_runs_leave_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    left: list[Any] = []
    run_policies(_runs(), ["fcfs", "lpm"], jobs=2, left=left)
    assert left == []  # the workers' objects end with them


SHAPES = [
    "multi-turn:conversations=8,turns=3,first_len=256,turn_len=64,output_len=32",
    "tree-of-thought:trees=3,depth=2,branching=2",
    "few-shot",
    f"mooncake:{Path(__file__).parent / 'data' / 'mooncake_sample.jsonl'}",
]


@needs_fork
@pytest.mark.parametrize("spec", SHAPES, ids=lambda spec: spec.split(":")[0])
def test_every_workload_shape_gives_the_same_outcomes_forked(spec: str) -> None:
    wl = load_workload(spec, request_rate=30, num_requests=60, seed=2)
    runs = PolicyRuns(wl, SchedulerConfig(chunked_prefill_size=256), SimConfig(), keep_rows=True)
    policies = ["fcfs", "lpm", "dfs-weight", "fair"]
    for a, b in zip(
        run_policies(runs, policies, jobs=1), run_policies(runs, policies, jobs=2), strict=True
    ):
        _same(a, b)


@needs_fork
def test_rows_are_only_computed_when_asked() -> None:
    (out,) = run_policies(_runs(keep_rows=False), ["lpm"], jobs=2)
    assert out.rows is None


@needs_fork
@pytest.mark.parametrize("jobs", [1, 2])
def test_progress_ends_complete_for_every_policy(jobs: int) -> None:
    runs = _runs()
    seen: dict[int, list[tuple[int, int]]] = {}

    def progress(i: int, done: int, total: int) -> None:
        seen.setdefault(i, []).append((done, total))

    run_policies(runs, ["fcfs", "lpm"], jobs=jobs, progress=progress)
    n = len(runs.workload.requests)
    assert sorted(seen) == [0, 1]
    for reports in seen.values():
        assert reports[-1] == (n, n)
        assert all(d <= t == n for d, t in reports)
        assert [d for d, _ in reports] == sorted(d for d, _ in reports)


def test_progress_is_reported_about_a_hundred_times_in_process() -> None:
    wl = load_workload(
        "shared-prefix:groups=8,prompts=40,system_len=256,output_len=16", request_rate=50
    )
    runs = PolicyRuns(wl, SchedulerConfig(), SimConfig())
    seen: list[int] = []
    run_policies(runs, ["fcfs"], jobs=1, progress=lambda i, done, total: seen.append(done))
    n = len(wl.requests)
    assert n == 320 and seen[-1] == n
    assert len(seen) <= REPORTS_PER_RUN + 1  # each step that finishes a request calls back
    assert all(b - a >= n // REPORTS_PER_RUN for a, b in itertools.pairwise(seen[:-1]))


class _Rejects(PolicyRuns):
    """Rejects lpm the way ``simulate`` rejects a combination only the run can see."""

    def run(self, policy: str, report: Any) -> PolicyOutcome:
        if policy == "lpm":
            raise ValueError("not with these settings")
        return super().run(policy, report)


@needs_fork
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_rejected_run_names_its_policy(jobs: int) -> None:
    base = _runs()
    runs = _Rejects(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    with pytest.raises(PolicyFailed) as e:
        run_policies(runs, ["fcfs", "lpm"], jobs=jobs)
    assert (e.value.policy, str(e.value)) == ("lpm", "lpm: not with these settings")


class _SlowOrRejects(PolicyRuns):
    def run(self, policy: str, report: Any) -> PolicyOutcome:
        if policy == "lpm":
            raise ValueError("not with these settings")
        time.sleep(60)
        raise AssertionError("a failed command let its other runs go on")


@needs_fork
def test_a_failed_run_ends_the_runs_under_way() -> None:
    base = _runs()
    runs = _SlowOrRejects(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    before = {p.pid for p in multiprocessing.active_children()}
    start = time.monotonic()
    with pytest.raises(PolicyFailed):
        run_policies(runs, ["fcfs", "lpm", "hrrn"], jobs=2)
    assert time.monotonic() - start < 20
    time.sleep(0.2)
    assert {p.pid for p in multiprocessing.active_children()} <= before  # none left running


class _Dies(PolicyRuns):
    def run(self, policy: str, report: Any) -> PolicyOutcome:
        os._exit(3)  # as the kernel's OOM killer would end it


@needs_fork
def test_a_worker_that_dies_fails_the_command_instead_of_hanging() -> None:
    base = _runs()
    runs = _Dies(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    with pytest.raises(BrokenProcessPool):
        run_policies(runs, ["fcfs", "lpm"], jobs=2)


_ORPHAN_SCRIPT = """
import os, sys, time
from radixsched.sim.policy_runs import PolicyRuns, run_policies
from radixsched.sim.workloads.load import load_workload

class Slow(PolicyRuns):
    def run(self, policy, report):
        open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
        time.sleep(120)

wl = load_workload("shared-prefix:groups=2,prompts=2", request_rate=10)
run_policies(Slow(wl, optimal_hit_rate=0.5), ["fcfs", "lpm"], jobs=2)
"""


@needs_fork
def test_workers_end_with_the_command_however_it_ends(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = [int(p.name) for p in tmp_path.iterdir()]
        assert len(workers) == 2
    finally:
        parent.kill()  # SIGKILL: no chance to stop its workers itself
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_without_fork_the_policies_run_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_runs, "can_fork", lambda: False)
    pids: list[int] = []

    def progress(i: int, done: int, total: int) -> None:
        pids.append(os.getpid())

    out = run_policies(_runs(), ["fcfs", "lpm"], jobs=4, progress=progress)
    assert [o.result.policy for o in out] == ["fcfs", "lpm"]
    assert set(pids) == {os.getpid()}
    assert default_jobs(9) == 1


@needs_fork
def test_default_jobs_is_one_per_cpu_at_most_one_per_policy() -> None:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert default_jobs(1) == 1
    assert default_jobs(1000) == cpus


# ---- the command ------------------------------------------------------------------------------


def _simulate(tmp_path: Path, name: str, *extra: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / f"{name}.json"
    rows = tmp_path / f"{name}.csv"
    argv = ["simulate", "--workload", "shared-prefix:groups=4,prompts=4,system_len=300"]
    argv += ["--request-rate", "20", "--policy", "fcfs,lpm,hrrn", "--slo-ttft-ms", "200"]
    argv += ["--quiet", "--json", str(out), "--requests-csv", str(rows), *extra]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    for r in doc["results"]:
        r.pop("wall_s")
        r.pop("requests_per_wall_s", None)
    doc.pop("meta")
    return doc, rows.read_text()


@needs_fork
def test_simulate_jobs_writes_the_same_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, rows_one = _simulate(tmp_path, "one", "--jobs", "1")
    assert "processes" not in capsys.readouterr().out
    three, rows_three = _simulate(tmp_path, "three", "--jobs", "3")
    assert "for 3 policies in 3 processes" in capsys.readouterr().out.replace("\n", " ")
    assert one == three
    assert rows_one == rows_three


@pytest.mark.parametrize("value", ["0", "-2"])
def test_simulate_rejects_a_jobs_count_below_one(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--num-requests", "4", "--jobs", value]) == 2
    assert f"jobs must be a positive integer, got {value}" in capsys.readouterr().err


def test_simulate_rejects_jobs_from_a_config_file_that_is_not_a_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("jobs: many\nnum_requests: 4\n")
    assert main(["simulate", "--config", str(cfg)]) == 2
    assert "jobs must be a positive integer, got 'many'" in capsys.readouterr().err


def test_inside_a_frozen_heap_a_run_s_garbage_goes_before_the_next_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The command's program freezes its workload: each run's frozen heap then freezes what is
    # alive without collecting first, so the run before's cycles are collected in between.
    import weakref

    class Cycle:
        me: object = None

    seen: list[Any] = []

    def run(runs: Any, i: int, policy: str, progress: Any, left: Any = None) -> Any:
        if seen:
            seen.append(seen[0]() is None)
        c = Cycle()
        c.me = c
        seen.append(weakref.ref(c))
        return policy

    monkeypatch.setattr(policy_runs, "_run_here", run)
    runs = _runs()
    was = gc.isenabled()
    gc.disable()  # only the runs' loop may collect it
    gc.freeze()
    try:
        assert run_policies(runs, ["fcfs", "lpm"], jobs=1) == ["fcfs", "lpm"]
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()
    assert seen[1] is True

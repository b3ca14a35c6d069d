"""End to end on CPU: a real ``radixsched serve --model tiny-random``, ``bench --sweep``,
``calibrate``, then predictions for held-out arrival processes of the same workload compared
with what the server did there.

Bounds (the issue's): mean E2E and mean ITL within 5%, mean TTFT within 10%, p90 E2E within
10% of measured. The server runs as ``radixsched serve`` does, its engine in a process of its
own with one torch thread. The measurement is taken in rounds of (sweep, then one run of each
held-out process), so that the machine's slow spells fall on calibration and held-out runs
alike; the fit uses every sweep, each held-out statistic is its median over the rounds.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from fidelity import WORKLOAD, failures, held_out_processes, predict_held_out, stats_of
from radixsched.cli.main import main
from radixsched.client.bench import BenchConfig, run_bench
from served import tiny_random_server

# Opt-in: the bounds hold only where nothing else competes for the CPUs. On the project's
# shared 2-core VM a fixed CPU task runs up to 72% slower for minutes at a time with nothing
# else running, and 3 of 10 runs passed every bound (README, "What was measured, and what to
# expect"), so in the default suite it would fail at random. test_calibrate_recorded replays a
# recording of it in every run. Run it with RADIXSCHED_FIDELITY=1 on a quiet machine.
pytestmark = pytest.mark.skipif(
    os.environ.get("RADIXSCHED_FIDELITY") != "1",
    reason="timing-sensitive live fidelity check (serve, bench --sweep, calibrate, predict "
    "within 5%/10%): needs a quiet machine with free cores; set RADIXSCHED_FIDELITY=1 to run",
)

ROUNDS = 3
# A directory to record the measurement in (compressed sweeps, held-out statistics): how the
# recording test_calibrate_recorded replays was made.
RECORD = os.environ.get("RADIXSCHED_FIDELITY_RECORD")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with tiny_random_server(_free_port()) as url:
        yield url


@pytest.mark.slow
def test_calibrated_simulator_predicts_held_out_runs(server_url: str, tmp_path: Path) -> None:
    # 1. Rounds of the calibrating sweep, then one run of each held-out arrival process. This
    # machine's speed wanders by more than the bounds from one minute to the next (README,
    # "What was measured, and what to expect"), so calibration and held-out runs are taken in
    # turns and each is pooled over the rounds: the fit on every sweep, each statistic of a
    # held-out process by its median over the rounds (one slow spell cannot move it).
    sweeps: list[Path] = []
    held_out: dict[str, dict[str, Any]] = {}
    measured: dict[str, list[dict[str, float]]] = {}
    for k in range(ROUNDS):
        sweep = tmp_path / f"sweep{k}.json"
        argv = ["bench", "--url", server_url, "--workload", WORKLOAD, "--sweep", "--quiet"]
        argv += ["--json", str(sweep)] + (["--no-sweep-warmup"] if k else [])
        assert main(argv) == 0
        sweeps.append(sweep)
        held_out = held_out or held_out_processes(sweep)
        for name, kw in held_out.items():
            cfg = BenchConfig(url=server_url, workload=WORKLOAD, flush_cache=True, **kw)
            res = asyncio.run(run_bench(cfg))
            assert res.num_failed == 0
            measured.setdefault(name, []).append(stats_of(res.result))
    if RECORD:
        _record(Path(RECORD), sweeps, held_out, measured)
    # 2. Calibrate on every sweep; 3. predict the held-out processes.
    report = predict_held_out(sweeps, held_out, measured, tmp_path / "cal.json")
    print(json.dumps(report, indent=1))
    assert not failures(report), (failures(report), report)


def _record(
    out: Path,
    sweeps: list[Path],
    held_out: dict[str, dict[str, Any]],
    measured: dict[str, list[dict[str, float]]],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for p in sweeps:
        (out / (p.name + ".gz")).write_bytes(gzip.compress(p.read_bytes(), mtime=0))
    doc = {"workload": WORKLOAD, "held_out": held_out, "measured": measured}
    (out / "held_out.json").write_text(json.dumps(doc, indent=1) + "\n")

"""Vidur against ``radixsched simulate`` on the same lengths-only Mooncake requests, in one run.

The requests: the Mooncake synthetic trace (3,993 requests, 61.2M prompt tokens, arrivals at its
timestamps over 17 minutes) reduced to what Vidur replays: arrival time, prompt length, output
length, nothing shared. Without the full trace (``/work/shared/data/mooncake/synthetic_trace.jsonl``,
or ``--trace``) the 200-request sample in ``tests/data`` stands in, with a note.

- **Vidur** (Microsoft's simulator, ``vidur`` 0.0.26 from PyPI) in a fresh process of its own venv:
  ``bench/vidur_driver.py`` builds ``vidur.simulator.Simulator`` with its trace-replay request
  generator on one ``meta-llama/Llama-3-8B`` replica on one ``h100`` (TP 1, PP 1), Sarathi-Serve
  chunked prefills of 8,192 tokens, batch cap 128, 16-token KV blocks for the KV memory Vidur's
  planner finds (483k tokens), no event traces or plots; and times ``Simulator.run()``'s event
  loop (the run less the metrics written after it) from outside.
- **radixsched**: ``python -m radixsched simulate --workload jsonl:LENGTHS --policy fcfs --gpu h100
  --context-length 262144 --json OUT`` (``llama-3.1-8b`` on one H100, SGLang's scheduler with its
  defaults: chunked prefill 8,192, radix cache on, KV 452k tokens; the context length raised so
  that it serves the 10 prompts over 128k that Vidur serves too); its event loop is the JSON's
  ``wall_s``. Its prompt cache lives in a fresh folder per bench run: the first repeat builds
  the requests' token arrays (``first process s``), later ones map them.

Each side runs ``--repeat`` times, alternating, so both see the same load; the fastest counts
(noise only adds time) and the slowest is shown beside it. Reported: requests per second of each
event loop and of each whole process (start to exit: interpreter, imports, trace, loop, output),
and radixsched's ratio over Vidur for both.

**They do not simulate the same thing, only the same requests.** Their cost models differ:
Vidur's predictor looks batch times up in tables that it downloads from the Hugging Face hub at
start-up (or trains from GPU profiling data downloaded from there), none of which the wheel ships
and which this machine cannot reach;
the driver fills those tables from a roofline of the model on the device instead (its loop and
lookups unchanged, its simulated seconds not Vidur's trained ones). radixsched uses its own
roofline for llama-3.1-8b. Their schedulers differ too (Sarathi's FCFS with decodes first against
SGLang's FCFS with retraction), so they take different numbers of steps for the same requests.

Run: ``python bench/vidur_bench.py [--vidur-python PATH] [--repeat N] [--trace PATH] [--json
PATH]`` from the checkout (with its ``src`` importable). ``--vidur-python`` (default
``$VIDUR_PYTHON``, else ``/tmp/vidur-venv/bin/python``) names a venv's interpreter where
``import vidur`` works; install it apart from the project (it pins no torch and pulls pandas,
scikit-learn, plotly and streamlit): ``python3.11 -m venv /tmp/vidur-venv &&
/tmp/vidur-venv/bin/pip install vidur==0.0.26``. Without it the bench says so in one line and
exits 2.

Measured: ``python bench/vidur_bench.py --repeat 5`` (PYTHONPATH=src), 2026-12-06 00:58-01:00 UTC,
the 2-core CI VM, load average 5.6-7.6 (other work beside it), the full trace, fastest of 5:

===========  ===============  ===========  =========================  ============  ======
simulator    event loop s     loop req/s   whole process s            process       CPU s
===========  ===============  ===========  =========================  ============  ======
Vidur        6.93             576          15.37                      260 req/s     5.99
radixsched   3.00             1,331        4.06 (first run 7.45)      983 req/s     1.76
ratio        2.31x                         3.78x                                    3.40x
===========  ===============  ===========  =========================  ============  ======

Vidur: 11,230 batches; 4.97 s of start-up (the stand-in's tables 0.33 s of it) and 1.01 s of
metrics written after its loop. The goal of issue 32 (event loop >= 10x Vidur's) is not met.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

FULL_TRACE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")
SAMPLE_TRACE = Path(__file__).resolve().parent.parent / "tests" / "data" / "mooncake_sample.jsonl"
DRIVER = Path(__file__).resolve().parent / "vidur_driver.py"
DEFAULT_VIDUR_PYTHON = "/tmp/vidur-venv/bin/python"
VIDUR_DATE = "2026-01-01"  # the driver selects this Date (Vidur's trace replay filters by date)
OUR_FLAGS = ("--policy", "fcfs", "--gpu", "h100", "--context-length", "262144", "--quiet")
INSTALL = "python3.11 -m venv /tmp/vidur-venv && /tmp/vidur-venv/bin/pip install vidur==0.0.26"
FIELDS = ("input_length", "output_length", "timestamp")


class Lengths(NamedTuple):
    """One request as Vidur sees it: nothing about its tokens."""

    arrival_ms: int
    prompt: int
    output: int


class TraceError(ValueError):
    """A trace line that is not a lengths record; the message names the file, line and field."""


@dataclass
class Side:
    """One simulator's timings over the repeats (seconds)."""

    name: str
    simulates: str
    requests: int
    loops: list[float] = field(default_factory=list)  # the event loop alone
    processes: list[float] = field(default_factory=list)  # the whole process, wall
    cpus: list[float] = field(default_factory=list)  # the whole process, user + system
    runs: list[dict[str, object]] = field(default_factory=list)  # each run's own report
    first_process_s: float | None = None  # radixsched: the run that built its prompt cache

    @property
    def loop_s(self) -> float:
        return min(self.loops)

    @property
    def process_s(self) -> float:
        return min(self.processes)

    def add(self, timed: tuple[float, float], loop_s: float) -> None:
        self.processes.append(timed[0])
        self.cpus.append(timed[1])
        self.loops.append(loop_s)


# ---- the requests -------------------------------------------------------------------------------


def read_lengths(path: Path) -> list[Lengths]:
    """The trace's requests as lengths, in file order. Raises TraceError naming the line."""
    out = []
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{no}: not JSON ({e.msg})") from None
        vals = []
        for name in FIELDS:
            v = rec.get(name) if isinstance(rec, dict) else None
            least = 0 if name == "timestamp" else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise TraceError(f"{path}:{no}: field {name!r} must be an integer >= {least}")
            vals.append(v)
        out.append(Lengths(arrival_ms=vals[2], prompt=vals[0], output=vals[1]))
    if not out:
        raise TraceError(f"{path}: no requests")
    return out


def write_ours(reqs: list[Lengths], path: Path) -> Path:
    """radixsched's ``jsonl:`` workload with lengths only (no hash ids: nothing shared)."""
    rows = (json.dumps({"input_length": r.prompt, "output_length": r.output,
                        "timestamp": r.arrival_ms}) for r in reqs)  # fmt: skip
    path.write_text("".join(row + "\n" for row in rows))
    return path


def write_vidur(reqs: list[Lengths], path: Path) -> Path:
    """Vidur's trace-replay CSV: arrival in seconds, one Date for all rows."""
    rows = (f"{VIDUR_DATE},{r.arrival_ms / 1000!r},{r.prompt},{r.output}\n" for r in reqs)
    path.write_text("Date,Time,PromptTokenCount,CompletionTokenCount\n" + "".join(rows))
    return path


# ---- one run of each ----------------------------------------------------------------------------


def _children_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall s, CPU s) of one process run to its end."""
    cpu, t = _children_cpu_s(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall, cpu = time.perf_counter() - t, _children_cpu_s() - cpu
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{cmd[0]} {cmd[1]} exited {proc.returncode}: " + " | ".join(tail))
    return wall, cpu


def run_vidur(python: str, csv: Path, tmp: Path) -> tuple[tuple[float, float], dict[str, object]]:
    """((wall s, CPU s), the driver's JSON) of one fresh Vidur process."""
    out = tmp / "vidur.json"
    out.unlink(missing_ok=True)
    out_dir = tempfile.mkdtemp(dir=tmp, prefix="vidur-out-")
    wall = _timed([python, str(DRIVER), str(csv), str(out), out_dir])
    return wall, json.loads(out.read_text())


def run_ours(jsonl: Path, tmp: Path, cache: Path) -> tuple[tuple[float, float], dict[str, object]]:
    """((wall s, CPU s), the first policy's JSON result) of one ``radixsched simulate``."""
    out = tmp / "ours.json"
    out.unlink(missing_ok=True)
    env = dict(os.environ, RADIXSCHED_CACHE_DIR=str(cache))
    env.pop("RADIXSCHED_PROMPT_CACHE", None)
    cmd = [sys.executable, "-m", "radixsched", "simulate", "--workload", f"jsonl:{jsonl}",
           *OUR_FLAGS, "--json", str(out)]  # fmt: skip
    wall = _timed(cmd, env)
    data = json.loads(out.read_text())
    cost = data["config"]["cost_model"]
    result: dict[str, object] = {**data["results"][0], "model": cost["model"], "gpu": cost["gpu"]}
    return wall, result


def vidur_missing(python: str) -> str | None:
    """None when ``python`` imports vidur, else the one line to print."""
    try:
        ok = subprocess.run([python, "-c", "import vidur"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        ok = None
    if ok is not None and ok.returncode == 0:
        return None
    return f"vidur_bench: no Vidur at --vidur-python {python}: install it apart: {INSTALL}"


def _byte_compile() -> None:
    """Write radixsched's bytecode before timing, as an installed package has it."""
    import compileall

    import radixsched

    compileall.compile_dir(str(Path(radixsched.__file__).parent), quiet=1)


def measure(python: str, reqs: list[Lengths], repeat: int) -> tuple[Side, Side]:
    """Alternate Vidur and radixsched ``repeat`` times on the same requests."""
    vidur = Side("Vidur 0.0.26", "", len(reqs))
    ours = Side("radixsched", "", len(reqs))
    with tempfile.TemporaryDirectory(prefix="vidur-bench-") as d:
        tmp = Path(d)
        csv, jsonl = write_vidur(reqs, tmp / "trace.csv"), write_ours(reqs, tmp / "lengths.jsonl")
        for _ in range(repeat):
            timed, res = run_vidur(python, csv, tmp)
            vidur.add(timed, float(res["loop_s"]))  # type: ignore[arg-type]
            vidur.runs.append(res)
            vidur.simulates = (f"{res['model']} on 1x {str(res['device']).upper()}, Sarathi chunks "
                               f"of {res['chunk']}, KV {int(res['kv_blocks']) * 16:,} tokens "  # type: ignore[call-overload]
                               f"({res['batches']:,} batches)")  # fmt: skip
            timed, out = run_ours(jsonl, tmp, tmp / "cache")
            if ours.first_process_s is None:
                ours.first_process_s = timed[0]
            ours.add(timed, float(out["wall_s"]))  # type: ignore[arg-type]
            ours.runs.append({k: out[k] for k in ("num_completed", "makespan_s", "retractions")})
            ours.simulates = (f"{out['model']} on 1x {out['gpu']}, SGLang's scheduler (fcfs), KV "
                              f"{out['kv_capacity_tokens']:,} tokens")  # fmt: skip
            if out["num_completed"] != len(reqs):
                print(f"note: radixsched completed {out['num_completed']} of {len(reqs)}")
    return vidur, ours


# ---- report -------------------------------------------------------------------------------------


def _row(s: Side) -> list[str]:
    n = s.requests
    first = f" (first {s.first_process_s:.2f})" if s.first_process_s is not None else ""
    return [s.name, f"{s.loop_s:.2f} / {max(s.loops):.2f}", f"{n / s.loop_s:,.0f}",
            f"{s.process_s:.2f} / {max(s.processes):.2f}{first}", f"{n / s.process_s:,.0f}",
            f"{min(s.cpus):.2f}"]  # fmt: skip


def report(vidur: Side, ours: Side, trace: Path) -> dict[str, object]:
    table = Table(title=f"Lengths-only requests: {ours.requests:,} from {trace.name}")
    for col in ("simulator", "event loop s (fastest / slowest)", "loop req/s",
                "whole process s", "process req/s", "process CPU s"):  # fmt: skip
        table.add_column(col)
    table.add_row(*_row(vidur))
    table.add_row(*_row(ours))
    loop_x, proc_x = vidur.loop_s / ours.loop_s, vidur.process_s / ours.process_s
    cpu_x = min(vidur.cpus) / min(ours.cpus)
    table.add_row("radixsched / Vidur", "", f"{loop_x:.2f}x", "", f"{proc_x:.2f}x", f"{cpu_x:.2f}x")
    Console(width=max(100, Console().width)).print(table)
    for side in (vidur, ours):
        print(f"{side.name} simulates {side.simulates}")
    part = {k: min(float(r[k]) for r in vidur.runs) for k in ("setup_s", "tables_s", "write_s")}  # type: ignore[arg-type]
    print(f"Vidur outside its loop (fastest): start-up {part['setup_s']:.2f} s (the stand-in's "
          f"tables {part['tables_s']:.2f} s of it), metrics written after it {part['write_s']:.2f} s")  # fmt: skip
    print("Different cost models (Vidur: tables filled by a roofline stand-in, see the docstring;")
    print("radixsched: its roofline) and schedulers: the same requests, not the same simulation.")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return {"trace": str(trace), "requests": ours.requests, "vidur": asdict(vidur),
            "radixsched": asdict(ours), "loop_speedup": loop_x, "process_speedup": proc_x,
            "process_cpu_speedup": cpu_x, "load_average": os.getloadavg()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vidur-python", default=os.environ.get("VIDUR_PYTHON", DEFAULT_VIDUR_PYTHON),
                   help="interpreter of a venv with vidur installed")  # fmt: skip
    p.add_argument("--repeat", type=int, default=3, help="runs of each, alternating (default 3)")
    p.add_argument("--trace", type=Path, default=None, help="Mooncake-style JSONL trace")
    p.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.json is not None and not args.json.parent.is_dir():
        print(f"vidur_bench: --json {args.json}: no such folder", file=sys.stderr)
        return 2
    trace = args.trace or (FULL_TRACE if FULL_TRACE.exists() else SAMPLE_TRACE)
    if args.trace is None and trace == SAMPLE_TRACE:
        print(f"note: {FULL_TRACE} not found: the 200-request sample stands in (not comparable)")
    try:
        reqs = read_lengths(trace)
    except (OSError, TraceError) as e:
        print(f"vidur_bench: {e}", file=sys.stderr)
        return 2
    missing = vidur_missing(args.vidur_python)
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    _byte_compile()
    vidur, ours = measure(args.vidur_python, reqs, args.repeat)
    result = report(vidur, ours, trace)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

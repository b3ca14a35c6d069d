"""Real cluster benchmark: radixsched workers behind sglang-router (``serve --dp-size N``) on
this machine, against the simulator's prediction of the same cluster.

For each worker count in ``--workers`` (default 1 2 4) and each router policy in
``--policies`` (default cache_aware round_robin; one worker runs without a router), a fresh
``radixsched serve --model MODEL [--dp-size N --router-policy P]`` is started on a free port,
``radixsched bench`` sends the workload once (all requests at once unless ``--request-rate``,
the workers' prefix caches flushed first), and the cluster is stopped. Reported per run:
requests/s and output tokens/s as the client saw them, the cluster hit rate (the workers'
/metrics summed; the workload's optimum beside it), the spread of requests over workers, and
the hit rate ``simulate --dp N --router ...`` predicts for the same workload.

Needs sglang-router (``pip install 'radixsched[router]'``, or its ``sglang-router`` command on
PATH). Run: ``.venv/bin/python bench/cluster_serve_bench.py [--workers 1 2 4]
[--policies cache_aware round_robin] [--workload SPEC] [--model tiny-random] [--json PATH]``.
On a 2-core machine the default run takes a few minutes, most of it starting workers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from radixsched.client.bench import BenchConfig, run_bench
from radixsched.server.cluster import free_ports, router_launcher

DEFAULT_WORKLOAD = "shared-prefix:groups=8,prompts=8,system_len=256,question_len=32,output_len=16"
SIM_ROUTER = {"cache_aware": "cache-aware", "round_robin": "round-robin"}
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Run:
    workers: int
    policy: str  # sglang-router's name; "-" for one worker without a router
    requests_per_s: float
    output_tokens_per_s: float
    hit_rate: float
    optimal_hit_rate: float
    requests_per_worker: tuple[int, ...]
    predicted_hit_rate: float


def _ready(url: str, workers: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the server (one worker) or the router (its workers healthy) answers."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if workers == 1:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return
            else:
                listed = httpx.get(url + "/workers", timeout=2).json()["workers"]
                if sum(1 for w in listed if w.get("is_healthy")) >= workers:
                    return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready within {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.5)


def _serve(model: str, workers: int, policy: str, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "radixsched", "serve", "--model", model, "--port", str(port)]
    cmd += ["--log-level", "warning"]
    if workers > 1:
        cmd += ["--dp-size", str(workers), "--router-policy", policy]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _predicted_hit_rate(workload: str, workers: int, policy: str, rate: str) -> float:
    """``simulate --dp N --router R``'s cluster hit rate for the same workload."""
    from radixsched.cli.main import main

    out = f"/tmp/cluster_serve_bench_{workers}_{policy}.json"
    argv = ["simulate", "--workload", workload, "--request-rate", rate, "--policy", "fcfs"]
    argv += ["--json", out]
    if workers > 1:
        argv += ["--dp", str(workers), "--router", SIM_ROUTER[policy]]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = main(argv)
    if status != 0:
        raise RuntimeError(f"simulate {' '.join(argv)} failed")
    with open(out, encoding="utf-8") as f:
        return float(json.load(f)["results"][0]["hit_rate"])


def measure(model: str, workload: str, workers: int, policy: str, rate: str) -> Run:
    (port,) = free_ports(1)
    proc = _serve(model, workers, policy, port)
    url = f"http://127.0.0.1:{port}"
    try:
        _ready(url, workers, proc)
        cfg = BenchConfig(url=url, workload=workload, request_rate=float(rate), flush_cache=True)
        result = asyncio.run(run_bench(cfg))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    r = result.result
    spread = tuple(w.requests for w in result.per_worker) or (r.num_requests,)
    return Run(
        workers=workers,
        policy=policy if workers > 1 else "-",
        requests_per_s=r.throughput.requests_per_s,
        output_tokens_per_s=r.throughput.output_tokens_per_s,
        hit_rate=r.hit_rate,
        optimal_hit_rate=r.optimal_hit_rate,
        requests_per_worker=spread,
        predicted_hit_rate=_predicted_hit_rate(workload, workers, policy, rate),
    )


def table(runs: list[Run]) -> str:
    rows = [["workers", "router", "req/s", "out tok/s", "hit rate", "optimal", "simulated",
             "requests per worker"]]  # fmt: skip
    for r in runs:
        rows.append([
            str(r.workers), r.policy, f"{r.requests_per_s:.1f}", f"{r.output_tokens_per_s:,.0f}",
            f"{r.hit_rate:.1%}", f"{r.optimal_hit_rate:.1%}", f"{r.predicted_hit_rate:.1%}",
            "/".join(map(str, r.requests_per_worker)),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin"],
                   choices=sorted(SIM_ROUTER))  # fmt: skip
    p.add_argument("--workload", default=DEFAULT_WORKLOAD)
    p.add_argument("--request-rate", default="inf")
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)
    if router_launcher() is None and any(n > 1 for n in args.workers):
        print("cluster_serve_bench: sglang-router is not installed", file=sys.stderr)
        return 2
    runs: list[Run] = []
    for n in args.workers:
        for policy in args.policies if n > 1 else args.policies[:1]:
            runs.append(measure(args.model, args.workload, n, policy, args.request_rate))
            print(f"done: {n} workers, {runs[-1].policy}", file=sys.stderr, flush=True)
    print(f"workload {args.workload}, request rate {args.request_rate}, model {args.model}")
    print(table(runs))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r.__dict__ for r in runs], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``radixsched serve --dp-size N``: N radixsched workers behind sglang-router on one port.

Each worker is a ``radixsched serve`` process of its own on a free loopback port (the same
flags, its share of the CPU threads); the router (PyPI ``sglang-router``, the optional extra
``radixsched[router]``) takes the public host and port and routes with its cache-aware policy
(the one ``simulate --router cache-aware`` models). Every part is a child process: when one of
them exits, or this process gets SIGTERM or SIGINT, all are stopped and the command ends.

Router settings that suit radixsched's answers (``ROUTER_SETTINGS``): radixsched answers a
client's mistake with 4xx (an unknown model, ``n=2``), and sglang-router's circuit breaker
counts those as worker failures (20 of them opened every circuit for a minute), so the
breaker is off and the health check does its job instead: every second, a worker failing two
checks in a row is dropped (a killed worker stops getting requests within about 2-3 s), and
one good check brings it back. A request that cannot reach its worker is retried with a
backoff that spans more than that (about 5 s over 6 retries): once the dead worker is dropped,
the retry goes to another, so a killed worker costs at most the requests in flight on it
(measured: 0 of 48 requests sent in the 5 s after a kill failed; with 3 quick retries, 13
did).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")  # sglang-router's
ROUTER_SETTINGS: tuple[str, ...] = (
    "--disable-circuit-breaker",
    "--health-check-interval-secs", "1",
    "--health-failure-threshold", "2",
    "--health-success-threshold", "1",
    "--health-check-timeout-secs", "2",
    "--retry-max-retries", "7",  # attempts, the first included
    "--retry-initial-backoff-ms", "250",
    "--retry-max-backoff-ms", "2000",
    "--retry-backoff-multiplier", "1.5",
    "--worker-startup-check-interval", "1",
)  # fmt: skip
MISSING_ROUTER = (
    "sglang-router is not installed: pip install 'radixsched[router]' (or sglang-router>=0.3)"
)
STARTUP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.25
# Flags of `serve` the launcher sets itself for each worker (each takes one value).
LAUNCHER_FLAGS = ("--dp-size", "--router-policy", "--host", "--port", "--metrics-port")


class ClusterError(Exception):
    """A part did not start: one line, the command exits 2."""


def router_launcher() -> list[str] | None:
    """How to start sglang-router here: its Python launcher when this interpreter has it, else
    its ``sglang-router`` command on PATH; None when neither is installed."""
    if importlib.util.find_spec("sglang_router") is not None:
        return [sys.executable, "-m", "sglang_router.launch_router"]
    found = shutil.which("sglang-router")
    return [found, "launch"] if found else None


def router_command(
    launcher: Sequence[str],
    worker_urls: Sequence[str],
    *,
    host: str,
    port: int,
    policy: str,
    metrics_port: int,
    tokenizer_path: str | None = None,
) -> list[str]:
    """The router's command line over ``worker_urls`` with ``ROUTER_SETTINGS``. With
    ``tokenizer_path`` (a folder on this machine) the router loads the workers' tokenizer from
    it instead of looking the model's name up on a model hub."""
    tokenizer = ["--tokenizer-path", tokenizer_path] if tokenizer_path else []
    return [
        *launcher,
        *tokenizer,
        "--host", host,
        "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(metrics_port),
        "--log-level", "warn",
        *ROUTER_SETTINGS,
    ]  # fmt: skip


def worker_argv(serve_argv: Sequence[str], port: int, threads: int | None) -> list[str]:
    """A worker's ``radixsched serve`` arguments: the cluster's own, less the flags the
    launcher sets (``LAUNCHER_FLAGS``), on ``127.0.0.1:port`` with ``threads`` torch threads
    unless ``--threads`` was given."""
    kept: list[str] = []
    skip_value = False
    for arg in serve_argv:
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in LAUNCHER_FLAGS:
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    kept += ["--host", "127.0.0.1", "--port", str(port)]
    if threads is not None and not any(a.split("=", 1)[0] == "--threads" for a in kept):
        kept += ["--threads", str(threads)]
    return kept


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free right now (held open together while picked)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


@dataclass
class Cluster:
    """The child processes of one ``serve --dp-size`` run: workers first, then the router."""

    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    worker_urls: list[str] = field(default_factory=list)
    router: subprocess.Popen[bytes] | None = None
    stopping: bool = False

    @property
    def parts(self) -> list[subprocess.Popen[bytes]]:
        return [*self.workers, *([self.router] if self.router else [])]

    def first_exited(self) -> subprocess.Popen[bytes] | None:
        return next((p for p in self.parts if p.poll() is not None), None)

    def name_of(self, proc: subprocess.Popen[bytes]) -> str:
        if proc is self.router:
            return f"the router (pid {proc.pid})"
        i = self.workers.index(proc)
        return f"worker {i} at {self.worker_urls[i]} (pid {proc.pid})"

    def stop(self) -> None:
        """SIGTERM to every part (router first: no new requests), then SIGKILL to any still
        running after ``STOP_TIMEOUT_S``."""
        self.stopping = True
        for proc in reversed(self.parts):
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.parts:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def local_tokenizer(worker_url: str) -> str | None:
    """The tokenizer folder a worker publishes (``/server_info``'s ``tokenizer_path``), when
    it is a folder on this machine; else None."""
    import json
    import os
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(worker_url + "/server_info", timeout=5.0) as r:
            path = json.loads(r.read()).get("tokenizer_path")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None
    return path if isinstance(path, str) and os.path.isdir(path) else None


def router_env() -> dict[str, str]:
    """The router's environment: offline for model hubs (it reads tokenizers from disk)."""
    import os

    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _router_has_workers(url: str, n: int) -> bool:
    """Whether the router lists ``n`` healthy workers (``GET /workers``)."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/workers", timeout=2.0) as r:
            workers = json.loads(r.read()).get("workers", [])
    except (OSError, ValueError, AttributeError):
        return False
    return sum(1 for w in workers if w.get("is_healthy")) >= n


def wait_until(cluster: Cluster, check: Callable[[], bool], what: str) -> None:
    """Poll ``check()`` until true; a part exiting first or ``STARTUP_TIMEOUT_S`` passing is a
    ``ClusterError`` naming ``what``."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not check():
        if (gone := cluster.first_exited()) is not None:
            raise ClusterError(f"{cluster.name_of(gone)} exited with {gone.returncode}")
        if cluster.stopping:
            raise ClusterError("stopped before it was ready")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} not ready within {STARTUP_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)


@dataclass(frozen=True)
class ClusterSpec:
    """What ``serve --dp-size`` was asked for."""

    dp_size: int
    host: str
    port: int
    policy: str
    serve_argv: tuple[str, ...]
    threads_per_worker: int | None
    # Workers already running elsewhere (``radixsched router``): none is started here.
    worker_urls: tuple[str, ...] = ()
    # Where the whole cluster's metrics are scraped (``server.cluster_metrics``); 0: a free port.
    metrics_port: int = 0


def start(spec: ClusterSpec, launcher: Sequence[str], cluster: Cluster) -> None:
    """Start the workers, wait until each is healthy, then the router and wait until it lists
    them all. Raises ``ClusterError``."""
    ports = free_ports(spec.dp_size + 1)
    if spec.worker_urls:
        cluster.worker_urls.extend(spec.worker_urls)
    for port in [] if spec.worker_urls else ports[:-1]:
        argv = worker_argv(spec.serve_argv, port, spec.threads_per_worker)
        cluster.worker_urls.append(f"http://127.0.0.1:{port}")
        cluster.workers.append(subprocess.Popen([sys.executable, "-m", "radixsched", *argv]))
    for url in cluster.worker_urls:
        wait_until(cluster, functools.partial(_http_ok, url + "/health"), f"worker {url}")
    cmd = router_command(
        launcher,
        cluster.worker_urls,
        host=spec.host,
        port=spec.port,
        policy=spec.policy,
        metrics_port=ports[-1],
        tokenizer_path=local_tokenizer(cluster.worker_urls[0]),
    )
    cluster.router = subprocess.Popen(cmd, env=router_env())
    local = "127.0.0.1" if spec.host in ("0.0.0.0", "::", "[::]") else spec.host.strip("[]")
    router_url = f"http://{local}:{spec.port}"
    wait_until(
        cluster,
        lambda: _router_has_workers(router_url, spec.dp_size),
        f"the router at {router_url}",
    )


def run_cluster(spec: ClusterSpec) -> int:
    """Run the cluster until a part exits (1) or SIGTERM/SIGINT (0); 2 when sglang-router is
    missing or a part does not start."""
    from radixsched.server.cluster_metrics import serve_cluster_metrics

    launcher = router_launcher()
    if launcher is None:
        print(f"radixsched: error: {MISSING_ROUTER}", file=sys.stderr)
        return 2
    cluster = Cluster()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        cluster.stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            start(spec, launcher, cluster)
        except ClusterError as e:
            if cluster.stopping:
                return 0
            print(f"radixsched: error: {e}", file=sys.stderr)
            return 2
        metrics = serve_cluster_metrics(spec.host, spec.metrics_port, cluster.worker_urls)
        print(_serving_line(spec, cluster, metrics.server_address[1]), file=sys.stderr, flush=True)
        try:
            return _supervise(cluster)
        finally:
            metrics.shutdown()
    finally:
        cluster.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _supervise(cluster: Cluster) -> int:
    while not cluster.stopping:
        gone = cluster.first_exited()
        if gone is not None:
            print(
                f"radixsched: error: {cluster.name_of(gone)} exited with {gone.returncode}; "
                "stopping the others",
                file=sys.stderr,
            )
            return 1
        time.sleep(POLL_S)
    return 0


def _serving_line(spec: ClusterSpec, cluster: Cluster, metrics_port: int) -> str:
    return (
        f"routing to {spec.dp_size} workers with sglang-router ({spec.policy}) on "
        f"http://{spec.host}:{spec.port}: workers {' '.join(cluster.worker_urls)}; router pid "
        f"{cluster.router.pid if cluster.router else '-'}; the cluster's metrics (every worker "
        f"and their totals) on http://{spec.host}:{metrics_port}/metrics"
    )

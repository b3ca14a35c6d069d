"""``radixsched serve --dp-size N`` and ``radixsched router``: N workers behind sglang-router.

The tests that run the router skip when sglang-router is not installed (``radixsched[router]``;
its ``sglang-router`` command on PATH also counts)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from radixsched.cli.main import main
from radixsched.server import cluster
from radixsched.server.cluster import (
    ROUTER_SETTINGS,
    free_ports,
    router_command,
    router_launcher,
    worker_argv,
)

MODEL = "tiny-random"
needs_router = pytest.mark.skipif(
    router_launcher() is None, reason="sglang-router is not installed (radixsched[router])"
)


def test_worker_argv_drops_the_launchers_flags_and_keeps_the_rest() -> None:
    argv = ["serve", "--model", MODEL, "--dp-size", "2", "--port=9000", "--host", "0.0.0.0"]
    argv += ["--router-policy", "round_robin", "--schedule-policy", "lpm"]
    got = worker_argv(argv, 4567, threads=1)
    assert got == ["serve", "--model", MODEL, "--schedule-policy", "lpm", "--host", "127.0.0.1",
                   "--port", "4567", "--threads", "1"]  # fmt: skip
    assert worker_argv([*argv, "--threads", "3"], 1, threads=1).count("--threads") == 1


def test_router_command_carries_the_settings_that_suit_radixsched() -> None:
    cmd = router_command(["r"], ["http://a:1", "http://b:2"], host="h", port=5, policy="p",
                         metrics_port=6)  # fmt: skip
    assert cmd[:3] == ["r", "--host", "h"]
    i = cmd.index("--worker-urls")
    assert cmd[i + 1 : i + 3] == ["http://a:1", "http://b:2"]
    assert "--disable-circuit-breaker" in cmd  # 4xx answers must not open circuits
    interval = ROUTER_SETTINGS[ROUTER_SETTINGS.index("--health-check-interval-secs") + 1]
    threshold = ROUTER_SETTINGS[ROUTER_SETTINGS.index("--health-failure-threshold") + 1]
    assert int(interval) * int(threshold) <= 3  # a dead worker is dropped within seconds

    def setting(flag: str) -> float:
        return float(ROUTER_SETTINGS[ROUTER_SETTINGS.index(flag) + 1])

    # A request routed to a dead worker is retried until the health check has dropped it.
    backoff, waited = setting("--retry-initial-backoff-ms") / 1000, 0.0
    for _ in range(int(setting("--retry-max-retries")) - 1):
        waited += min(backoff, setting("--retry-max-backoff-ms") / 1000)
        backoff *= setting("--retry-backoff-multiplier")
    assert waited >= int(interval) * int(threshold) + setting("--health-check-timeout-secs")


def test_a_missing_router_is_one_error_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster, "router_launcher", lambda: None)
    assert main(["serve", "--model", MODEL, "--dp-size", "2", "--port", "39999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"radixsched: error: {cluster.MISSING_ROUTER}"]
    assert main(["router", "--worker-urls", "http://127.0.0.1:1"]) == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--dp-size", "0"], "--dp-size must be between 1 and 64, got 0"),
        (["--dp-size", "2", "--api-key", "k"], "--dp-size does not take an API key yet"),
        (["--dp-size", "2", "--port", "0"], "--dp-size needs a --port other than 0"),
    ],
)
def test_bad_cluster_flags_fail_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    def started(*a: Any, **kw: Any) -> Any:
        raise AssertionError("a part was started")

    monkeypatch.setattr(cluster, "run_cluster", started)
    assert main(["serve", "--model", MODEL, *args]) == 2
    assert needle in capsys.readouterr().err


def test_router_refuses_a_bad_worker_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["router", "--worker-urls", "localhost:8000"]) == 2
    assert "--worker-urls 'localhost:8000'" in capsys.readouterr().err


# ---- live: the router in front of real workers ---------------------------------------------


def _wait(check: Any, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"exited with {proc.returncode}"
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.2)


def _router_ready(url: str, n: int) -> bool:
    try:
        workers = httpx.get(url + "/workers", timeout=2).json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return sum(1 for w in workers if w.get("is_healthy")) >= n


def _cli(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "radixsched", *args])


@pytest.fixture
def dp2() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port, metrics_port = free_ports(2)
    proc = _cli("serve", "--model", MODEL, "--dp-size", "2", "--port", str(port),
                "--metrics-port", str(metrics_port),
                "--kv-slots", "4096", "--log-level", "warning")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _router_ready(url, 2), proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


@needs_router
def test_dp_size_serves_every_api_and_4xx_answers_open_no_circuit(
    dp2: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = dp2
    with httpx.Client(base_url=url, timeout=60) as c:
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [MODEL]
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 3}
        assert c.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 3
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert c.post("/v1/chat/completions", json=chat).status_code == 200
        gen = {"text": "hello", "sampling_params": {"max_new_tokens": 2}, "stream": True}
        with c.stream("POST", "/generate", json=gen) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) >= 2
        for _ in range(25):  # refused by the workers with 400
            assert c.post("/v1/completions", json={**body, "n": 2}).status_code == 400
        assert c.post("/v1/completions", json=body).status_code == 200
    workers = [w["url"] for w in httpx.get(url + "/workers").json()["workers"]]
    _cluster_metrics_count_every_request(proc, workers)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    for w in workers:  # every part stopped with it
        with pytest.raises(httpx.TransportError):
            httpx.get(w + "/health", timeout=2)


def _cluster_metrics_count_every_request(proc: subprocess.Popen[bytes], workers: list[str]) -> None:
    """One scrape of the launcher's metrics port: each worker's counters and their total."""
    from prometheus_client.parser import text_string_to_metric_families

    metrics_port = proc.args[proc.args.index("--metrics-port") + 1]  # type: ignore[union-attr]
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    finished: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "radixsched_requests_finished_total":  # one sample per finish reason
                finished[s.labels["worker"]] = finished.get(s.labels["worker"], 0.0) + s.value
    assert "all" in finished and set(finished) <= {*workers, "all"}
    assert finished["all"] == sum(v for w, v in finished.items() if w != "all") >= 3
    assert f'radixsched_cluster_worker_up{{worker="{workers[0]}"}} 1.0' in text


@needs_router
def test_a_dead_worker_stops_the_whole_dp_cluster(
    dp2: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = dp2
    info = httpx.get(url + "/workers").json()["workers"]
    port = int(info[0]["url"].rsplit(":", 1)[1])
    pid = _pid_listening_on(port)
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(60) == 1
    with pytest.raises(httpx.TransportError):
        httpx.get(info[1]["url"] + "/health", timeout=2)


def _pid_listening_on(port: int) -> int:
    """The pid of the ``radixsched serve`` worker whose command line names ``port``."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "radixsched serve" in line and f"--port {port}" in line and "--dp-size" not in line:
            return int(line.split()[0])
    raise AssertionError(f"no worker on port {port}")


@needs_router
def test_failover_costs_only_the_killed_workers_requests_in_flight() -> None:
    """Two workers behind ``radixsched router``; one killed by pid mid-run: requests after
    the kill succeed on the other within seconds."""
    ports = free_ports(3)
    workers = [
        _cli(
            "serve",
            "--model",
            MODEL,
            "--port",
            str(p),
            "--kv-slots",
            "4096",
            "--log-level",
            "warning",
        )
        for p in ports[:2]
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports[:2]]
    router = _cli("router", "--worker-urls", *urls, "--port", str(ports[2]))
    url = f"http://127.0.0.1:{ports[2]}"
    try:
        _wait(lambda: _router_ready(url, 2), router)
        outcomes = _run_with_a_kill(url, workers[0])
        killed_at = outcomes["killed_at"]
        late = [ok for t, ok in outcomes["results"] if t > killed_at + 3.0]
        failed = [t for t, ok in outcomes["results"] if not ok]
        assert late and all(late), outcomes
        # Requests sent to the dead worker before the health check dropped it are retried
        # (ROUTER_SETTINGS): at most those in flight on it when it died may fail.
        assert len(failed) <= outcomes["in_flight"], outcomes
        assert router.poll() is None  # the router keeps serving
    finally:
        for p in [router, *workers]:
            if p.poll() is None:
                p.terminate()
                p.wait(60)


def _run_with_a_kill(url: str, victim: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Send 60 requests, 4 at a time (distinct prefixes, so both workers get some); kill
    ``victim`` after the 12th is sent. Each result: (send time, succeeded)."""
    results: list[tuple[float, bool]] = []
    t0 = time.monotonic()
    in_flight = 0
    killed_at = float("inf")

    def one(i: int) -> tuple[float, bool]:
        sent = time.monotonic() - t0
        body = {"text": f"{i % 8} " * 40, "sampling_params": {"max_new_tokens": 8}}
        try:
            r = httpx.post(url + "/generate", json=body, timeout=30)
            return sent, r.status_code == 200
        except httpx.HTTPError:
            return sent, False

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = []
        for i in range(60):
            if i == 12:
                in_flight = sum(not f.done() for f in futures)
                victim.kill()
                killed_at = time.monotonic() - t0
            futures.append(pool.submit(one, i))
            time.sleep(0.1)
        results = [f.result() for f in futures]
    return {"results": results, "killed_at": killed_at, "in_flight": in_flight}


def test_router_policies_are_sglang_routers() -> None:
    from radixsched.cli.serve import ROUTER_POLICIES

    assert ROUTER_POLICIES == cluster.ROUTER_POLICIES
    launcher = router_launcher()
    if launcher is None:
        pytest.skip("sglang-router is not installed")
    out = subprocess.run([*launcher, "--help"], capture_output=True, text=True, timeout=60).stdout
    for policy in ROUTER_POLICIES:
        assert policy in out
    assert json.dumps(ROUTER_SETTINGS)  # every setting is a flag the router knows:
    for flag in (s for s in ROUTER_SETTINGS if s.startswith("--")):
        assert flag in out, flag


# ---- bench through the router, and the simulator's prediction of it --------------------------

CLUSTER_WORKLOAD = "shared-prefix:groups=4,prompts=6,system_len=192,question_len=24,output_len=6"


def _hit_rate_of(path: Any) -> float:
    return float(json.loads(path.read_text())["results"][0]["hit_rate"])


@needs_router
def test_bench_through_the_router_and_simulate_agree_on_the_cluster_hit_rate(
    dp2: tuple[str, subprocess.Popen[bytes]],
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``bench --url <router>`` takes its limits from a worker and reports each worker's
    share; its cluster hit rate is what ``simulate --dp 2 --router cache-aware`` predicts."""
    url, _ = dp2
    served = tmp_path / "served.json"
    args = ["--workload", CLUSTER_WORKLOAD, "--request-rate", "inf", "--json", str(served)]
    assert main(["bench", "--url", url, "--flush-cache", *args]) == 0
    out = capsys.readouterr().out
    assert "from the 2 workers' /metrics" in out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("worker http://")]
    assert len(lines) == 2
    workers = json.loads(served.read_text())["results"][0]["workers"]
    assert sum(w["requests"] for w in workers) == 24
    predicted = tmp_path / "simulated.json"
    sim = ["simulate", "--dp", "2", "--router", "cache-aware", "--policy", "fcfs"]
    assert main([*sim, *args[:4], "--json", str(predicted)]) == 0
    assert abs(_hit_rate_of(served) - _hit_rate_of(predicted)) <= 0.05


# ---- the cluster's metrics in one scrape ---------------------------------------------------------

_WORKER_TEXT = """# HELP radixsched_prompt_tokens_total Prompt tokens.
# TYPE radixsched_prompt_tokens_total counter
radixsched_prompt_tokens_total {tokens}
# HELP radixsched_kv_usage KV usage.
# TYPE radixsched_kv_usage gauge
radixsched_kv_usage {usage}
"""


def test_cluster_metrics_label_each_worker_and_sum_only_the_counters() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from radixsched.server.cluster_metrics import cluster_metrics

    texts = {
        "http://a:1/metrics": _WORKER_TEXT.format(tokens=10, usage=0.5),
        "http://b:2/metrics": _WORKER_TEXT.format(tokens=32, usage=0.25),
    }
    text = cluster_metrics(["http://a:1", "http://b:2", "http://dead:3"], texts.get)
    samples = {
        (s.name, s.labels.get("worker")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("radixsched_prompt_tokens_total", "http://a:1")] == 10
    assert samples[("radixsched_prompt_tokens_total", "http://b:2")] == 32
    assert samples[("radixsched_prompt_tokens_total", "all")] == 42
    assert samples[("radixsched_kv_usage", "http://b:2")] == 0.25
    assert ("radixsched_kv_usage", "all") not in samples  # a sum of usages means nothing
    assert samples[("radixsched_cluster_worker_up", "http://a:1")] == 1
    assert samples[("radixsched_cluster_worker_up", "http://dead:3")] == 0


def test_cluster_metrics_are_served_over_http() -> None:
    import urllib.request

    from radixsched.server.cluster_metrics import serve_cluster_metrics

    server = serve_cluster_metrics("127.0.0.1", 0, ["http://127.0.0.1:9"])  # nothing listens
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read().decode()
        assert 'radixsched_cluster_worker_up{worker="http://127.0.0.1:9"} 0.0' in body
    finally:
        server.shutdown()


def test_metrics_port_without_dp_size_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--model", MODEL, "--metrics-port", "9100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "radixsched: error: --metrics-port applies to --dp-size N only: add it, or drop this"
    ]

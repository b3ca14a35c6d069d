"""The engine in its own process (``server.process``, what ``radixsched serve`` runs): the same
answers as the engine on a thread, KV freed on disconnect, metrics and cache flush from the
engine's process, and every way the pair can come apart (the engine dies, the server stops,
the server is killed, the engine cannot start).

The engine checks KV conservation and locks itself each time it goes idle and reports a
failure as unhealthy, so ``/health`` answering 200 after a scenario is that check passing."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from radixsched.config import SchedulerConfig
from radixsched.engine.loader import load_model, load_tokenizer
from radixsched.server.app import ServerThread, create_app, engine_for_model, served_model
from radixsched.server.metrics import parse_counter
from radixsched.server.process import EngineProcess, EngineSpec, EngineStartError
from served import wait_healthy

MODEL = "tiny-random"
CTX = 1024
KV = 4096
SPEC = EngineSpec(model=MODEL, config=SchedulerConfig(), kv_slots=KV, context_len=CTX)


def start(spec: EngineSpec = SPEC) -> tuple[ServerThread, EngineProcess]:
    engine = EngineProcess(spec)
    info = engine.launch()
    served = served_model(load_tokenizer(spec.model), info.context_len)
    return ServerThread(create_app(engine, served)).start(), engine


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ServerThread, EngineProcess]]:
    st, engine = start()
    yield st, engine
    st.stop()
    assert not engine.alive


def gauge(url: str, name: str) -> float:
    return parse_counter(httpx.get(url + "/metrics", timeout=10).text, name)


def wait_drained(url: str, timeout: float = 20.0) -> None:
    """Nothing runs, waits or holds KV, and the engine's own idle check passed."""
    deadline = time.monotonic() + timeout
    while (
        gauge(url, "radixsched_num_running_requests")
        or gauge(url, "radixsched_num_waiting_requests")
        or gauge(url, "radixsched_kv_usage")
    ):
        assert time.monotonic() < deadline, "the engine did not drain"
        time.sleep(0.05)
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def generate(url: str, text: str, n: int, **extra: object) -> httpx.Response:
    sampling = {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}
    body = {"text": text, "sampling_params": sampling, **extra}
    return httpx.post(url + "/generate", json=body, timeout=60)


def stream_body(text: str, n: int = 900, **extra: object) -> dict[str, object]:
    return {"text": text, "stream": True,
            "sampling_params": {"max_new_tokens": n, "ignore_eos": True}, **extra}  # fmt: skip


@contextlib.contextmanager
def streaming(url: str, body: dict[str, object]) -> Iterator[Iterator[str]]:
    """A streamed /generate whose first token has arrived: the rest of its lines."""
    with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        yield lines


def sampled(url: str, text: str, n: int, seed: int) -> list[int]:
    sampling = {"max_new_tokens": n, "ignore_eos": True, "temperature": 1.0, "seed": seed}
    r = httpx.post(url + "/generate", json={"text": text, "sampling_params": sampling}, timeout=60)
    ids: list[int] = r.json()["output_ids"]
    return ids


def test_the_engine_process_answers_as_the_engine_on_a_thread(
    server: tuple[ServerThread, EngineProcess],
) -> None:
    st, _ = server
    info = httpx.get(st.url + "/server_info", timeout=10).json()
    assert info["kv_slots"] == KV and info["context_len"] == CTX
    prompts = ["The capital of France is", "a b c d e f g", "The capital of Spain is"]
    remote = [generate(st.url, p, 12).json()["output_ids"] for p in prompts]
    remote += [sampled(st.url, p, 12, seed=i) for i, p in enumerate(prompts)]
    engine, served = engine_for_model(
        load_model(MODEL), SchedulerConfig(), kv_slots=KV, context_len=CTX
    )
    with ServerThread(create_app(engine, served)) as local:
        here = [generate(local.url, p, 12).json()["output_ids"] for p in prompts]
        here += [sampled(local.url, p, 12, seed=i) for i, p in enumerate(prompts)]
    assert remote == here
    assert all(len(ids) == 12 for ids in remote)
    assert remote[:3] != remote[3:]  # greedy and sampled differ: both paths were compared
    wait_drained(st.url)


def test_streaming_metrics_and_flush_come_from_the_engine_process(
    server: tuple[ServerThread, EngineProcess],
) -> None:
    st, _ = server
    before = gauge(st.url, "radixsched_generation_tokens_total")
    with httpx.stream("POST", st.url + "/generate", json=stream_body("me", 6), timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["meta_info"]["completion_tokens"] == 6
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert gauge(st.url, "radixsched_generation_tokens_total") == before + 6
    wait_drained(st.url)
    assert gauge(st.url, "radixsched_radix_cache_tokens") > 0
    flushed = httpx.post(st.url + "/flush_cache", timeout=10)
    assert flushed.status_code == 200 and flushed.json()["freed_tokens"] > 0
    assert gauge(st.url, "radixsched_radix_cache_tokens") == 0


def test_a_disconnected_stream_frees_its_kv_in_the_engine_process(
    server: tuple[ServerThread, EngineProcess],
) -> None:
    st, _ = server
    with streaming(st.url, stream_body("long")):
        assert gauge(st.url, "radixsched_num_running_requests") == 1
    # Closed after the first token: the engine aborts it at the next step boundary.
    wait_drained(st.url)
    finished = httpx.get(st.url + "/metrics", timeout=10).text
    assert 'radixsched_requests_finished_total{finish_reason="abort"} 1.0' in finished


def test_the_arrival_is_stamped_on_the_engines_clock(
    server: tuple[ServerThread, EngineProcess],
) -> None:
    st, engine = server
    t0 = time.perf_counter()
    meta = generate(st.url, "clock", 4).json()["meta_info"]
    wall = time.perf_counter() - t0
    # The server's e2e latency runs from the HTTP side's stamp to the engine's finish.
    assert 0 < meta["e2e_latency"] < wall
    assert abs(engine.now() - (time.perf_counter() - SPEC.epoch)) < 0.01


def test_a_duplicate_request_id_in_flight_is_refused_by_the_server_process(
    server: tuple[ServerThread, EngineProcess],
) -> None:
    st, _ = server
    body = stream_body("a", rid="twice")
    with streaming(st.url, body):
        dup = httpx.post(st.url + "/generate", json={**body, "stream": False}, timeout=60)
    assert dup.status_code == 400 and dup.json()["error"]["param"] == "rid"
    wait_drained(st.url)
    assert generate(st.url, "a", 2, rid="twice").status_code == 200


def test_requests_in_flight_end_with_503_when_the_engine_process_dies() -> None:
    st, engine = start()
    try:
        with streaming(st.url, stream_body("doomed")) as lines:
            assert engine.pid is not None
            os.kill(engine.pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        error = json.loads(rest[-2][6:])["error"]
        assert error["code"] == 503 and error["message"] == "the engine process exited"
        assert rest[-1] == "data: [DONE]"
        assert httpx.get(st.url + "/health", timeout=10).status_code == 503
        refused = generate(st.url, "after", 2)
        assert refused.status_code == 503
        assert httpx.get(st.url + "/metrics", timeout=10).status_code == 503
    finally:
        st.stop()


def test_stopping_the_server_ends_requests_in_flight_with_503_and_the_engine_process() -> None:
    st, engine = start()
    with streaming(st.url, stream_body("cut short")) as lines:
        engine.stop()
        rest = [line for line in lines if line.startswith("data: ")]
    error = json.loads(rest[-2][6:])["error"]
    assert "shutting down" in error["message"]
    assert not engine.alive and engine._proc.exitcode == 0
    st.stop()


def test_an_engine_that_cannot_start_says_why() -> None:
    bad = EngineSpec(model="no-such-model", config=SchedulerConfig())
    with pytest.raises(EngineStartError, match="unknown model 'no-such-model'"):
        EngineProcess(bad).launch()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_engine_process_exits_when_the_server_is_killed() -> None:
    port = _port()
    cmd = [sys.executable, "-m", "radixsched", "serve", "--model", MODEL, "--port", str(port),
           "--kv-slots", "1024", "--context-len", "256", "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "engine process " in line, line
        engine_pid = int(line.split("engine process ")[1].split(",")[0])
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        assert generate(url, "hi", 3).status_code == 200
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while os.path.exists(f"/proc/{engine_pid}") and _alive(engine_pid):
            assert time.monotonic() < deadline, "the engine process outlived its server"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    """False for a zombie (exited, not yet reaped by init) too."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_serve_names_a_model_it_cannot_load_and_exits_2() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "radixsched", "serve", "--model", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "radixsched: error: unknown model 'no-such-model'" in out.stderr


def test_the_engine_process_runs_on_the_cpus_it_is_given() -> None:
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.skip("needs 2 usable CPUs (one for the engine, one for the server)")
    engine = EngineProcess(dataclasses.replace(SPEC, cpus=(usable[-1],)))
    try:
        engine.launch()
        assert engine.pid is not None
        assert os.sched_getaffinity(engine.pid) == {usable[-1]}
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("text", "single", "match"),
    [
        ("x", False, "not a CPU list"),
        ("99999", False, "names CPUs this process may not use"),
        ("0-99999", False, "names CPUs this process may not use"),
        ("0", True, "needs the engine in its own process"),
    ],
)
def test_engine_cpus_are_checked(text: str, single: bool, match: str) -> None:
    from radixsched.cli.serve import _UsageError, engine_cpus

    with pytest.raises(_UsageError, match=match):
        engine_cpus(text, single_process=single)


def test_engine_cpus_leave_the_server_a_cpu() -> None:
    from radixsched.cli.serve import _UsageError, engine_cpus

    usable = sorted(os.sched_getaffinity(0))
    spec = ",".join(map(str, usable))
    with pytest.raises(_UsageError, match="leave at least one"):
        engine_cpus(spec, single_process=False)
    if len(usable) >= 2:
        assert engine_cpus(str(usable[-1]), single_process=False) == (usable[-1],)
        assert engine_cpus(f" {usable[0]}", single_process=False) == (usable[0],)

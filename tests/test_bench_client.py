"""The load client against a live 'tiny-random' server on 127.0.0.1: it reports the simulator's
metrics (same JSON keys and document shape as ``simulate --json``), reads the server's cache
hit rate from /metrics, fits requests to the server's vocabulary and context, and records
failures instead of crashing."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from radixsched.cli import bench as cli_bench
from radixsched.cli import serve as cli_serve
from radixsched.cli.main import main
from radixsched.client.bench import (
    BenchConfig,
    BenchError,
    BenchResult,
    RequestRecord,
    ServerLimits,
    counter_value,
    describe_error,
    fit_request,
    load_bench_workload,
    request_records,
    run_bench,
)
from radixsched.config import SchedulerConfig
from radixsched.engine.loader import LoadedModel, load_model
from radixsched.request import Req, SamplingParams
from radixsched.results.metrics import ADDITIONAL_KEYS, REQUIRED_KEYS
from radixsched.results.stats import STATS_KEYS
from radixsched.server.app import ServerThread, create_app
from radixsched.server.build import engine_for_model

WORKLOAD = "shared-prefix:groups=4,prompts=6,system_len=120,question_len=16,output_len=8"


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model("tiny-random")


def serve(loaded: LoadedModel, config: SchedulerConfig | None = None, **kw: object) -> ServerThread:
    engine, served = engine_for_model(
        loaded, config or SchedulerConfig(), kv_slots=8192, context_len=512
    )
    return ServerThread(create_app(engine, served, **kw)).start()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server(loaded: LoadedModel) -> Iterator[ServerThread]:
    st = serve(loaded)
    yield st
    st.stop()


def bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixsched")
    sub = p.add_subparsers(dest="command", required=True)
    cli_bench.add_bench_parser(sub)
    cli_serve.add_serve_parser(sub)
    return p


def test_bench_reports_simulator_metrics_and_server_hit_rate(server: ServerThread) -> None:
    cfg = BenchConfig(url=server.url, workload=WORKLOAD, max_concurrency=8)
    res = asyncio.run(run_bench(cfg))
    r = res.result
    assert res.num_failed == 0 and not res.errors
    assert r.num_requests == r.num_completed == 24
    assert r.output_tokens == 24 * 8
    assert r.ttft_s.n == 24 and r.e2e_s.n == 24
    assert r.itl_s.n == 24 * 7
    assert 0 < r.ttft_s.p50 <= r.e2e_s.p50
    assert r.throughput.output_tokens_per_s > 0
    assert r.policy == "fcfs"
    # 4 system prompts shared by 6 requests each: most prompt tokens come from the cache.
    assert r.prompt_tokens == 24 * 136
    assert 0.5 < r.hit_rate <= r.optimal_hit_rate + 1e-9
    # The server's counters and the per-request meta_info agree when nothing else runs.
    assert r.extra["hit_rate_source"] == "server /metrics"
    assert r.extra["client_hit_rate"] == pytest.approx(r.hit_rate)
    doc = res.to_document()
    # The simulate --json shape, plus the per-request records calibration replays.
    assert set(doc) == {"meta", "workload", "config", "results", "requests"}
    assert len(doc["requests"]) == 24
    out = doc["results"][0]
    for key in (*REQUIRED_KEYS, *ADDITIONAL_KEYS):
        assert key in out, key
    for key in ("ttft_s", "itl_s", "e2e_s", "tpot_s"):
        assert list(out[key]) == list(STATS_KEYS)
    assert doc["config"]["server"]["vocab_size"] == 512
    assert "api_key" not in doc["config"]["bench"]
    text = res.render()
    # One unit formatter for every latency: each value carries its own unit.
    ttft = next(ln for ln in text.splitlines() if ln.startswith("TTFT"))
    assert re.fullmatch(r"TTFT(\s+[\d.,]+ (µs|ms|s)){7}", ttft), ttft
    assert "ttft_s mean" not in text


def test_bench_cli_writes_json(server: ServerThread, tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    args = bench_parser().parse_args(
        ["bench", "--url", server.url, "--workload", WORKLOAD, "--num-requests", "10",
         "--request-rate", "200", "--max-concurrency", "4", "--json", str(path), "--quiet"]
    )  # fmt: skip
    assert args.func(args) == 0
    doc = json.loads(path.read_text())
    res = doc["results"][0]
    assert res["num_requests"] == 10 and res["num_completed"] == 10
    assert res["source"] == "bench" and res["num_failed"] == 0
    assert doc["workload"]["request_rate"] == 200.0
    assert doc["workload"]["arrivals"].startswith("poisson")


def test_bench_cli_usage_errors(server: ServerThread) -> None:
    p = bench_parser()
    for extra in (["--request-rate", "0"], ["--request-rate", "fast"], ["--max-concurrency", "0"],
                  ["--workload", "nope"]):  # fmt: skip
        args = p.parse_args(["bench", "--url", server.url, *extra])
        assert args.func(args) == 2, extra


def test_bench_records_rejections_as_failures(loaded: LoadedModel) -> None:
    cfg = SchedulerConfig(max_running_requests=1, max_queued_requests=1)
    st = serve(loaded, cfg)
    try:
        res = asyncio.run(run_bench(BenchConfig(url=st.url, workload=WORKLOAD)))
    finally:
        st.stop()
    assert res.num_failed > 0
    assert res.result.num_aborted == res.num_failed
    assert res.result.num_completed == 24 - res.num_failed
    assert any("HTTP 503" in e for e in res.errors)


def test_bench_needs_the_api_key(loaded: LoadedModel) -> None:
    st = serve(loaded, api_key="k")
    try:
        args = bench_parser().parse_args(["bench", "--url", st.url, "--workload", WORKLOAD])
        assert args.func(args) == 2  # cannot read the server's limits
        args = bench_parser().parse_args(
            ["bench", "--url", st.url, "--workload", WORKLOAD, "--num-requests", "3",
             "--api-key", "k", "--quiet"]
        )  # fmt: skip
        assert args.func(args) == 0
    finally:
        st.stop()


def test_fit_request_caps_ids_and_lengths() -> None:
    limits = ServerLimits(model="m", vocab_size=100, context_len=64, policy=None, info={})
    prompt = np.arange(95, 95 + 80, dtype=np.int32)
    r = Req("a", prompt, SamplingParams(max_new_tokens=50), routing_key="k", arrival_time=1.5)
    fitted = fit_request(r, limits)
    assert fitted.sampling.max_new_tokens == 32  # half the context
    assert fitted.prompt_len == 64 - 32 - 1
    assert fitted.prompt_ids.tolist() == [i % 100 for i in range(95, 95 + 31)]
    assert fitted.sampling.ignore_eos and fitted.routing_key == "k" and fitted.arrival_time == 1.5
    # Requests sharing a prefix still share it after the map.
    other = fit_request(
        Req("b", np.arange(95, 105, dtype=np.int32), SamplingParams(max_new_tokens=4)), limits
    )
    assert other.prompt_ids.tolist() == fitted.prompt_ids[:10].tolist()


def test_a_partial_spec_keeps_bench_sizes_and_no_rate_sends_at_once() -> None:
    # The README's example: only groups and prompts given; the rest is bench's, not the
    # simulator's 2,048-token system prompts and 256-token outputs.
    wl = load_bench_workload(BenchConfig(url="x", workload="shared-prefix:groups=4,prompts=8"))
    assert len(wl.requests) == 32
    assert {r.prompt_len for r in wl.requests} == {256 + 32}
    assert {r.sampling.max_new_tokens for r in wl.requests} == {32}
    assert wl.arrivals == "all at t=0"
    assert load_bench_workload(BenchConfig(url="x", request_rate=4.0)).arrivals.startswith(
        "poisson 4"
    )


def test_prometheus_text_is_read_with_prometheus_client() -> None:
    text = (
        "# HELP radixsched_prompt_tokens_total Prompt tokens\n"
        "# TYPE radixsched_prompt_tokens_total counter\n"
        "radixsched_prompt_tokens_total 1.5e+03\n"
        'radixsched_requests_finished_total{finish_reason="stop"} 3.0\n'
    )
    assert counter_value(text, "radixsched_prompt_tokens_total") == 1500.0
    assert counter_value(text, "radixsched_cached_prompt_tokens_total") is None
    assert counter_value("not { prometheus", "x") is None


def test_failed_requests_exit_1_with_a_summary_by_reason(
    loaded: LoadedModel, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # One running slot and a queue of one: most of 24 requests sent at once are refused.
    st = serve(loaded, SchedulerConfig(max_running_requests=1, max_queued_requests=1))
    csv_path = tmp_path / "req.csv"
    try:
        rc = main(["bench", "--url", st.url, "--workload", WORKLOAD, "--requests-csv",
                   str(csv_path)])  # fmt: skip
    finally:
        st.stop()
    assert rc == 1
    out, err = capsys.readouterr()
    m = re.search(r"(\d+) of 24 requests failed:\n  (\d+) x HTTP 503: (.+)", out)
    assert m is not None, out
    assert m.group(1) == m.group(2) and int(m.group(1)) > 0
    assert "The request queue is full" in m.group(3)
    assert f"radixsched: error: {m.group(1)} of 24 requests failed" in err
    rows = list(csv.DictReader(csv_path.open(encoding="utf-8")))
    assert len(rows) == 24
    assert sum(r["finish_reason"] == "abort" for r in rows) == int(m.group(1))


# ---- failures, against a scripted HTTP/1.1 server (each connection: one answer) ------------

SERVER_INFO = {"model": "stub", "vocab_size": 512, "context_len": 512, "scheduler": {}}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(completion_tokens: int, finish: str | None = None) -> bytes:
    meta = {
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
        "finish_reason": None if finish is None else {"type": finish},
    }
    obj = {"output_ids": list(range(completion_tokens)), "meta_info": meta}
    return f"data: {json.dumps(obj)}\n\n".encode()


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


async def _answer(kind: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer a POST /generate the way ``kind`` says, then close the connection."""
    if kind == "ok":
        body = _event(1) + _event(2, "length") + b"data: [DONE]\n\n"
        writer.write(STREAM_HEAD + _chunk(body) + b"0\r\n\r\n")
    elif kind == "503":
        body = json.dumps({"error": {"message": "The request queue is full"}}).encode()
        head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n%s" % (len(body), body))
    elif kind == "cut":  # the stream stops mid-body: no terminating chunk
        writer.write(STREAM_HEAD + _chunk(_event(1)))
    elif kind == "unfinished":  # a well-formed stream that never says how it finished
        writer.write(STREAM_HEAD + _chunk(_event(1) + b"data: [DONE]\n\n") + b"0\r\n\r\n")
    elif kind == "stall":  # until the client gives up
        writer.write(STREAM_HEAD + _chunk(_event(1)))
        await writer.drain()
        await reader.read()
    elif kind == "hangup":  # no status line at all
        pass
    await writer.drain()
    writer.close()


async def scripted_server(kinds: list[str]) -> tuple[asyncio.Server, str]:
    """Answers /server_info (and 404 elsewhere) and each POST /generate with the next kind."""
    script = iter(kinds)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        m = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
        await reader.readexactly(int(m.group(1)) if m else 0)
        path = head.split(b" ")[1]
        if path == b"/generate":
            await _answer(next(script), reader, writer)
            return
        body = json.dumps(SERVER_INFO).encode() if path == b"/server_info" else b"{}"
        status = b"200 OK" if path == b"/server_info" else b"404 Not Found"
        head = b"HTTP/1.1 %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        writer.write(head % (status, len(body)) + body)
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


def test_failures_are_recorded_in_words() -> None:
    kinds = ["ok", "503", "cut", "unfinished", "hangup", "stall"]

    async def go() -> BenchResult:
        srv, url = await scripted_server(kinds)
        # One request at a time, in order; 0.5 s to wait for data.
        cfg = BenchConfig(
            url=url,
            workload=WORKLOAD,
            num_requests=len(kinds),
            max_concurrency=1,
            request_rate=math.inf,
            timeout_s=0.5,
        )
        async with srv:
            return await run_bench(cfg)

    res = asyncio.run(go())
    errors = [rec.error for rec in res.records]
    assert errors[0] is None and res.records[0].token_times and res.records[0].finish
    assert errors[1] == "HTTP 503: The request queue is full"
    assert errors[2] is not None
    assert errors[2].startswith("ClientPayloadError: the server closed the connection (")
    assert errors[3] == "the stream ended without a finish reason"
    assert errors[4] is not None
    assert errors[4].startswith("ServerDisconnectedError: the server closed the connection")
    assert errors[5] == "SocketTimeoutError: no data within 0.5 s (--timeout)"
    assert res.num_failed == 5 and res.result.num_completed == 1
    assert res.result.extra["hit_rate_source"] == "meta_info.cached_tokens"  # no /metrics
    text = "\n".join(res.failure_lines())
    assert text.startswith("5 of 6 requests failed:")
    assert "1 x HTTP 503: The request queue is full" in text


def test_an_unreachable_server_says_so() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    words = r"cannot reach the server: ClientConnectorError: cannot connect \(Cannot connect to"
    with pytest.raises(BenchError, match=words):
        asyncio.run(run_bench(BenchConfig(url=f"http://127.0.0.1:{port}", workload=WORKLOAD)))


def test_timeouts_say_what_timed_out() -> None:
    import aiohttp

    exc = aiohttp.SocketTimeoutError("Timeout on reading data from socket")
    assert describe_error(exc, 600.0) == "SocketTimeoutError: no data within 600 s (--timeout)"
    assert describe_error(aiohttp.ConnectionTimeoutError(), 600.0) == (
        "ConnectionTimeoutError: no connection within 30 s"
    )
    assert describe_error(asyncio.TimeoutError(), 2.0) == (
        "TimeoutError: no progress within 2 s (--timeout)"
    )
    assert describe_error(ValueError("bad"), 1.0) == "ValueError: bad"


def test_rate_parsing() -> None:
    from radixsched.sim.settings.limits import RunConfigError, parse_rate

    assert math.isinf(parse_rate("inf") or 0.0)
    assert parse_rate("2.5") == 2.5 and parse_rate(None) is None
    with pytest.raises(RunConfigError, match="--request-rate"):
        parse_rate("0", "--request-rate")


def test_request_records_keep_the_order_of_their_times() -> None:
    # An instant that rounds up at 0.1 us: the first token and the finish came in one message.
    now = next(t for t in (k * 1.37e-8 + 0.25 for k in range(1000)) if round(t, 7) > t)
    req = Req("r", np.array([1, 2], dtype=np.int32), SamplingParams(max_new_tokens=1))
    (row,) = request_records((RequestRecord(req, sent_at=now, token_times=[now], finished_at=now),))
    assert row["sent_at"] <= row["token_times"][0] <= row["finished_at"]
    (failed,) = request_records((RequestRecord(req, sent_at=now, error="refused"),))
    assert failed["finished_at"] is None and failed["error"] == "refused"

"""GuideLLM as the second client of the fidelity loop: GuideLLM 0.8's sweeps of a real
``radixsched serve --model tiny-random`` calibrate the simulator, which must then predict two
held-out GuideLLM runs (4 concurrent streams; Poisson arrivals at 3/4 of the synchronous rate)
within 10% on the means of E2E and ITL (each statistic's error its median over three rounds,
as in ``test_calibrate_e2e``; why TTFT and the 5% bounds are not held: ``fidelity.GUIDELLM_BOUNDS``).

``test_guidellm_recording_is_predicted`` replays a recording of the live loop in every run:
GuideLLM's files exactly as it wrote them (gzip), read by the calibration readers as a user's
would be. The live loop (``test_guidellm_live_loop``) needs GuideLLM in a venv of its own
(``RADIXSCHED_GUIDELLM=/path/to/venv/bin/guidellm``) and a quiet machine
(``RADIXSCHED_FIDELITY=1``); ``RADIXSCHED_FIDELITY_RECORD=DIR`` keeps its files, which is how
``RECORDING`` was made (README there)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from fidelity import GUIDELLM_BOUNDS, GUIDELLM_DATA, check_held_out_files, failures

RECORDING = Path(__file__).parent / "data" / "calibration" / "live_tiny_random_guidellm"
GUIDELLM = os.environ.get("RADIXSCHED_GUIDELLM")
RECORD = os.environ.get("RADIXSCHED_FIDELITY_RECORD")
ROUNDS = 3
REQUESTS = 64


@pytest.mark.slow
def test_guidellm_recording_is_predicted(tmp_path: Path) -> None:
    meta = json.loads((RECORDING / "meta.json").read_text())
    sweeps = sorted(RECORDING.glob("sweep*.json.gz"))
    held = {name: sorted(RECORDING.glob(f"{name}*.json.gz")) for name in meta["held_out"]}
    assert len(sweeps) == ROUNDS and all(len(files) == ROUNDS for files in held.values())
    report = check_held_out_files(sweeps, held, meta["server"], tmp_path / "cal.json")
    assert not failures(report, GUIDELLM_BOUNDS), (failures(report, GUIDELLM_BOUNDS), report)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _guidellm(url: str, tokenizer: str, profile: str, out: Path) -> None:
    """One ``guidellm run`` as its 0.8 CLI takes it (``kind=`` specs), JSON written to ``out``."""
    assert GUIDELLM is not None
    backend = f"kind=openai_http,target={url},model=tiny-random,request_format=/v1/completions"
    argv = [GUIDELLM, "run", "--backend", backend, "--profile", profile]
    argv += ["--data", GUIDELLM_DATA, "--constraint", f"kind=max_requests,count={REQUESTS}"]
    argv += ["--tokenizer", f"kind=hf_auto,model={tokenizer}", "--seed", "kind=static,value=7"]
    argv += ["--output", f"kind=json,path={out}", "--disable-progress"]
    # One worker process: the client shares the 2-core machine with the server (GuideLLM starts
    # up to 10 by default, which take the cores the measured engine needs).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GUIDELLM__MAX_WORKER_PROCESSES": "1"}
    subprocess.run(argv, check=True, env=env, capture_output=True, timeout=900)


def _synchronous_rate(sweep: Path) -> float:
    doc = json.loads(sweep.read_text())
    first = doc["benchmarks"][0]
    return float(first["metrics"]["requests_per_second"]["successful"]["mean"])


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RADIXSCHED_FIDELITY") != "1" or not GUIDELLM,
    reason="live GuideLLM fidelity loop: needs GuideLLM (RADIXSCHED_GUIDELLM=path to its "
    "guidellm) and a quiet machine (RADIXSCHED_FIDELITY=1)",
)
def test_guidellm_live_loop(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    from served import tiny_random_server

    with tiny_random_server(_free_port()) as url:
        server = httpx.get(url + "/server_info", timeout=10).json()
        sweeps: list[Path] = []
        held: dict[str, list[Path]] = {}
        rate = 0.0
        for k in range(ROUNDS):
            sweeps.append(tmp_path / f"sweep{k}.json")
            _guidellm(url, server["tokenizer_path"], "kind=sweep,sweep_size=5", sweeps[-1])
            rate = rate or round(0.75 * _synchronous_rate(sweeps[0]), 2)
            for name, profile in _held_out(rate).items():
                held.setdefault(name, []).append(tmp_path / f"{name}{k}.json")
                _guidellm(url, server["tokenizer_path"], profile, held[name][-1])
    info = {k: server[k] for k in ("kv_slots", "context_len", "scheduler")}
    if RECORD:
        _record(Path(RECORD), [*sweeps, *(p for ps in held.values() for p in ps)], info, rate)
    report = check_held_out_files(sweeps, held, info, tmp_path / "cal.json")
    print(json.dumps(report, indent=1))
    assert not failures(report, GUIDELLM_BOUNDS), (failures(report, GUIDELLM_BOUNDS), report)


def _held_out(rate: float) -> dict[str, str]:
    return {"concurrent4": "kind=concurrent,streams=4", "poisson": f"kind=poisson,rate={rate}"}


def _record(out: Path, files: list[Path], server: dict[str, Any], rate: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for p in files:
        (out / (p.name + ".gz")).write_bytes(gzip.compress(p.read_bytes(), mtime=0))
    meta = {"server": server, "held_out": _held_out(rate), "bounds": GUIDELLM_BOUNDS}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

"""Waiting for a ``radixsched serve`` subprocess to come up, for the tests that start one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx


def wait_healthy(url: str, proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Return once ``url``'s ``/health`` answers 200 (within 60 s). Fails with the server's
    stderr if it exits first."""
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"server exited with {proc.returncode}: {err!r}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.1)


@contextlib.contextmanager
def tiny_random_server(port: int) -> Iterator[str]:
    """``radixsched serve --model tiny-random`` as a user starts it, its engine on one torch
    thread (the fidelity loops' server); yields its URL and stops it after."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            *("-m", "radixsched", "serve", "--model", "tiny-random"),
            *("--port", str(port), "--log-level", "warning"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()

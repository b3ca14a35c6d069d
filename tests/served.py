"""Waiting for a ``radixsched serve`` subprocess to come up, for the tests that start one."""

from __future__ import annotations

import subprocess
import time

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

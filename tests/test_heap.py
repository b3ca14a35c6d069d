"""Heap tuning for simulator processes (radixsched.sim.heap)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from radixsched.sim.heap import tune_heap


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="mallopt tuning applies to glibc only",
)
def test_tune_heap_takes_effect_on_glibc() -> None:
    # In a child: the setting is process-wide and must not leak into the test session.
    code = "from radixsched.sim.heap import tune_heap; print(tune_heap(), tune_heap())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]  # and idempotent


def test_tune_heap_is_a_no_op_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert tune_heap() is False

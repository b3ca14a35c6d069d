"""Every golden case (``tests/golden.py``) gives today exactly what release 0.1.0 recorded:
the same tokens at the same times for every request, the same replica summaries and headline
metrics. A failure names the case; rerun it with ``python tests/golden.py --only NAME``."""

from __future__ import annotations

import json
from typing import Any

import pytest

import golden
from radixsched.native import core

RECORDED: dict[str, Any] = json.loads(golden.GOLDEN.read_text())
CASES = {c.name: c for c in golden.cases()}


def test_every_recorded_case_is_still_a_case() -> None:
    assert set(RECORDED) == set(CASES)


@pytest.mark.skipif(
    core() is None,
    reason="the accelerated core needs the native core (not built, or off): without it the "
    "cases run on the reference, which tests/test_equivalence.py checks against the record",
)
@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case(name: str) -> None:
    want = RECORDED[name]
    got = golden.run_case(CASES[name])
    assert "error" not in want, f"recorded as a crash: {want['error']}"
    assert got["finished"] == want["finished"]
    assert golden.same_as_recorded(got, want)
    assert got["replicas"] == want["replicas"]
    assert got["lockstep"] == want["lockstep"]
    assert got["trace"] == want["trace"], "per-request tokens or times differ"

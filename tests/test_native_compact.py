"""The native compaction of finished requests (``_core.compact_requests``, ``bulk.cpp``) leaves
them as ``sim.workloads.deferred.compact``'s Python loop does: the same stand-ins, the same
packed token times; a list held elsewhere keeps its items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixsched.sim.deploy.run import client_requests
from radixsched.sim.workloads import deferred
from radixsched.sim.workloads.load import load_workload

SPEC = f"mooncake:{Path(__file__).resolve().parent / 'data' / 'mooncake_sample.jsonl'}"


def _times_bits(arrays: list[Any]) -> list[tuple[str, bytes]]:
    return [(a.typecode, a.tobytes()) for a in arrays]


def test_native_compact_is_the_python_one(defer_all: None, monkeypatch: pytest.MonkeyPatch) -> None:
    if getattr(deferred.core(), "compact_requests", None) is None:
        pytest.skip("no native compact_requests")

    held = [400_000, 500_000]  # a list held elsewhere too keeps its items

    def compacted() -> list[Any]:
        reqs = client_requests(load_workload(SPEC, defer_prompts=True))
        rs = [reqs[i] for i in range(4)]
        rs[0].output_ids = list(range(100_000, 100_100))  # past the prefetch distance
        rs[0].times.token_times = [0.5, -0.0, *(t / 7 for t in range(98))]
        rs[1].output_ids, rs[1].times.token_times = [3], (2.0,)  # not a list: array('d', it)
        rs[2].output_ids, rs[2].times.token_times = held, [1, float("nan")]  # an int
        rs[3].prompt_ids = np.ones(123_457, dtype=np.int32)  # a length not yet shared
        deferred.compact(rs)
        return rs

    native = compacted()
    assert held == [400_000, 500_000]
    monkeypatch.setattr(deferred, "core", lambda: None)
    plain = compacted()
    assert _times_bits([r.times.token_times for r in native]) == _times_bits(
        [r.times.token_times for r in plain]
    )
    for a, b in zip(native, plain, strict=True):
        assert a.prompt_ids is b.prompt_ids and a.output_ids is b.output_ids
        assert deferred.is_stand_in(a.prompt_ids) and len(a.prompt_ids) == len(b.prompt_ids)

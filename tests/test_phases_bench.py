"""bench/phases_bench.py's breakdown of one ``simulate`` process: every phase it names is
found (the functions it wraps still exist under those names), none is negative, and together
they are the process's whole wall time. One cold and one warm process on the 200-request
sample; no timing is asserted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "mooncake_sample.jsonl"


@pytest.fixture(scope="module")
def pb() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(
        "phases_bench", ROOT / "bench" / "phases_bench.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_phases_add_up_to_the_process(pb: Any, tmp_path: Path) -> None:
    got = pb.measure("mooncake", SAMPLE, "lpm", repeat=1)
    for how in ("cold", "warm"):
        phases = got[how]
        assert set(phases) == {*pb.PHASES, "total"}
        assert all(phases[p] >= 0 for p in pb.PHASES), phases
        assert sum(phases[p] for p in pb.PHASES) == pytest.approx(phases["total"], abs=1e-6)
        assert phases["loop"] > 0 and phases["start"] > 0

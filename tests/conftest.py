"""Test-wide settings: under CI (CI=true) hypothesis runs derandomized, so a landing is
judged on the same examples every time; locally it explores new examples on every run.
``torch_one_thread``: the engine tests' tiny matmuls run on one thread (OpenMP spin-up costs
more than it gains on a shared box). ``built_blocks``: the Mooncake prompt builds a test made.
Every test runs with the on-disk prompt cache off (nothing written under the home folder, no
test's loads depending on another's); ``prompts_dir`` turns it on in a temporary folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _no_prompt_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSCHED_PROMPT_CACHE", "off")


@pytest.fixture
def defer_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every trace is over the eager limit, and prompts are built 16 requests at a time."""
    from radixsched.sim.workloads import deferred

    monkeypatch.setenv("RADIXSCHED_EAGER_PROMPTS_GB", "0")
    monkeypatch.setenv("RADIXSCHED_PROMPT_CACHE", "off")
    monkeypatch.setattr(deferred, "BATCH", 16)


@pytest.fixture
def prompts_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The prompt cache on, with its cache root in a temporary folder: its ``prompts/``."""
    monkeypatch.setenv("RADIXSCHED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RADIXSCHED_PROMPT_CACHE")
    monkeypatch.delenv("RADIXSCHED_CACHE_MAX_GB", raising=False)
    return tmp_path / "cache" / "prompts"


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    import torch  # lazily: the simulator's tests never import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def built_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records how many prompts each Mooncake prompt build writes (one entry a call, on the
    numpy path and the native one alike): a test of prompt reuse counts the builds."""
    from radixsched.sim.workloads import traces

    built: list[int] = []
    real = traces._fill_mooncake

    def counting(drafts: Any, block: int, vocab: int) -> Any:
        built.append(len(drafts))
        return real(drafts, block, vocab)

    monkeypatch.setattr(traces, "_fill_mooncake", counting)
    return built


@pytest.fixture(params=["python", "native"])
def radix_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a radix cache test module against both trees: ``native`` rebinds the module's
    ``RadixCache`` to ``NativeRadixCache`` (skipped when the extension is not built). A test
    marked ``python_tree`` reads or corrupts the Python tree's internals and runs once."""
    if request.param == "native":
        from radixsched.native import core

        if core() is None:
            pytest.skip("the native core is not built")
        if request.node.get_closest_marker("python_tree"):
            pytest.skip("reads the Python tree's internals")
        from radixsched.native.radix import NativeRadixCache

        monkeypatch.setattr(request.module, "RadixCache", NativeRadixCache)
    return str(request.param)

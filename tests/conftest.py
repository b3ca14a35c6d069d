"""Test-wide settings: under CI (CI=true) hypothesis runs derandomized, so a landing is
judged on the same examples every time; locally it explores new examples on every run.
``torch_one_thread``: the engine tests' tiny matmuls run on one thread (OpenMP spin-up costs
more than it gains on a shared box)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    import torch  # lazily: the simulator's tests never import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)

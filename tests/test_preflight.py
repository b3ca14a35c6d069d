"""``sim.preflight``'s throw-away schedulers: built on a pool of one page, they refuse what the
run's schedulers would refuse."""

from __future__ import annotations

from typing import Any

import pytest

from radixsched.cache import allocator
from radixsched.config import SchedulerConfig
from radixsched.sim.preflight import _check_schedulers
from radixsched.sim.settings.simconfig import SimConfig


def test_each_throw_away_scheduler_gets_a_pool_of_one_page(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[tuple[int, int]] = []
    real = allocator.TokenAllocator.__init__

    def init(self: Any, size: int, page_size: int = 1) -> None:
        sizes.append((size, page_size))
        real(self, size, page_size)

    monkeypatch.setattr(allocator.TokenAllocator, "__init__", init)
    assert _check_schedulers(SchedulerConfig(page_size=16), SimConfig(), ["fcfs", "lpm"]) == []
    assert sizes == [(16, 16), (16, 16)]


def test_a_combination_the_scheduler_refuses_is_still_reported() -> None:
    cfg = SchedulerConfig(disable_radix_cache=True)
    (err,) = _check_schedulers(cfg, SimConfig(), ["shortest-prefill-first"])
    assert "requires prefix caching" in err

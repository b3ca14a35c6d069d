"""Accelerators for the scheduling core, chosen when a scheduler is built, never rewired.

``build_scheduler(..., accelerate=True)`` gives a ``FastScheduler``: the reference
``Scheduler`` whose rounds do only the work that changed (incremental matching, kept orders,
an incremental dedup), whose decode runs on columns and jumps over steps in which only lengths
change, and whose middle chunks run back to back. Every one gives the reference's schedule
bit for bit (tests/test_equivalence.py); the simulator uses them, the engine and the server
run the reference.
"""

from __future__ import annotations

from typing import Any

from radixsched.cluster.disagg import ROLES
from radixsched.config import SchedulerConfig
from radixsched.fast.scheduler import FastScheduler
from radixsched.runner import ModelRunner
from radixsched.scheduler import Scheduler


def build_scheduler(
    config: SchedulerConfig, runner: ModelRunner, *, accelerate: bool = True, **kw: Any
) -> Scheduler:
    """A scheduler for ``runner``: the accelerated one, or the reference (``accelerate=False``),
    in the role its ``disaggregation_mode`` names."""
    cls = FastScheduler if accelerate else Scheduler
    kw.setdefault("role", ROLES[config.disaggregation_mode])
    return cls(config, runner, **kw)


__all__ = ["FastScheduler", "build_scheduler"]

"""Which core a scheduler runs on, chosen when it is built, never rewired.

``build_scheduler(..., accelerate=True)`` gives a ``NativeScheduler`` (``native/scheduler.py``):
the reference ``Scheduler`` run by the native core, whose rounds do only the work that changed
(incremental matching, kept orders, an incremental dedup, all in C++), whose decode runs on
columns and jumps over steps in which only lengths change, and whose middle chunks run back to
back. It gives the reference's schedule bit for bit (tests/test_equivalence.py). The simulator,
the offline engine and the server all build their schedulers here (a real model's runner has
no ``supports_multi_step``: its decode runs one step at a time, on the requests). Without the
extension (``RADIXSCHED_NATIVE=0``, or no build), with a policy or an eviction strategy
registered from outside the package, or with ``accelerate=False``, the scheduler is the
reference, with one notice saying why.
"""

from __future__ import annotations

from typing import Any

from radixsched.cluster.disagg import ROLES
from radixsched.config import SchedulerConfig
from radixsched.native import core, notice
from radixsched.native.radix import NATIVE_EVICTION
from radixsched.native.scheduler import NativeScheduler
from radixsched.policies import POLICIES
from radixsched.runner import ModelRunner
from radixsched.scheduler import Scheduler


def build_scheduler(
    config: SchedulerConfig, runner: ModelRunner, *, accelerate: bool = True, **kw: Any
) -> Scheduler:
    """A scheduler for ``runner``: the accelerated one, or the reference (``accelerate=False``;
    the native core off or not built; a policy or an eviction strategy registered from outside
    the package: each says so once on stderr), in the role its ``disaggregation_mode`` names."""
    cls = NativeScheduler if accelerate and _accelerates(config) else Scheduler
    kw.setdefault("role", ROLES[config.disaggregation_mode])
    return cls(config, runner, **kw)


def _accelerates(config: SchedulerConfig) -> bool:
    """Whether the native core can run ``config`` (else a notice says why not, once)."""
    if core() is None:  # core() gave the notice
        return False
    if not built_in(config.schedule_policy):
        notice(
            f"policy {config.schedule_policy!r} is registered outside radixsched: it runs on "
            "the reference core"
        )
        return False
    eviction = config.radix_eviction_policy.lower()
    if eviction not in NATIVE_EVICTION:
        notice(f"eviction policy {eviction!r} is not built in: it runs on the reference core")
        return False
    return True


def built_in(policy_name: str) -> bool:
    """Whether the policy's functions are radixsched's own (an unknown name: left to the
    scheduler, which refuses it)."""
    pol = POLICIES.get(policy_name)
    if pol is None:
        return True
    fn = pol.key if pol.key is not None else pol.order
    return getattr(fn, "__module__", "").startswith("radixsched.")


__all__ = ["NativeScheduler", "build_scheduler", "built_in"]

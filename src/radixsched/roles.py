"""The role a scheduler plays: co-located (the null role, the default) or one side of a split
prefill/decode deployment (``radixsched.cluster.disagg``). ``Role``'s hooks do what a co-located
scheduler does, a split role overrides those its side changes; built last, never swapped."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from radixsched.config import SchedulerConfig
from radixsched.request import Req

if TYPE_CHECKING:
    from radixsched.clock import Clock
    from radixsched.kv import KVManager
    from radixsched.queue import WaitingQueue
    from radixsched.runner import Batch, StepOutcome


class Host(Protocol):
    """What these hooks use of their scheduler (``scheduler.Scheduler``, which imports them)."""

    config: SchedulerConfig
    queue: WaitingQueue
    clock: Clock
    kv: KVManager
    processed_tokens: int

    def _forget(self, req: Req) -> None: ...
    def prefill_round(self) -> Batch | None: ...
    def run(self, batch: Batch) -> StepOutcome: ...
    def decode_round(self, horizon: float | None) -> StepOutcome | None: ...


class Role:
    """The hooks, as a co-located scheduler runs them."""

    mode: ClassVar[str] = "null"  # the ``disaggregation_mode`` this role serves
    prefills: ClassVar[bool] = True  # False: the instance never runs a prefill

    def __init__(self, sched: Host) -> None:
        self.sched = sched

    @classmethod
    def configure(cls, config: SchedulerConfig) -> SchedulerConfig:
        """The config the scheduler runs (read first); it must name this role's mode."""
        if (mode := config.disaggregation_mode) != cls.mode:
            raise ValueError(f"disaggregation_mode {mode!r} needs its own role, not {cls.__name__}")
        return config

    @property
    def queue_limit(self) -> int | None:
        """Waiting requests beyond which arrivals are refused (None: none; SGLang's too)."""
        return self.sched.config.max_queued_requests

    @property
    def idle(self) -> bool:
        """Nothing to compute outside the waiting queue and the running batch."""
        return True

    def enqueue(self, req: Req) -> None:
        """Where an accepted request waits."""
        self.sched.queue.add(req)

    def requeue(self, reqs: list[Req]) -> None:
        """Where retracted and preempted requests go (never facing the queue limit)."""
        s = self.sched
        s.queue.requeue(reqs, s.clock.now(), s.processed_tokens)

    def retracting(self, req: Req) -> None:
        """``req`` is retracted: its KV is released right after this."""

    def prefilled(self, req: Req) -> None:
        """``req`` finished by its first token: it never joins the running batch."""
        self.sched.kv.release(req, cache_kv=True)
        self.sched._forget(req)

    def step(self, horizon: float | None) -> StepOutcome | None:
        """One step of the instance: a prefill round, else a decode round."""
        s = self.sched
        batch = s.prefill_round()
        return s.run(batch) if batch is not None else s.decode_round(horizon)

    def drop(self, req: Req, *, cache_kv: bool) -> bool:
        """Take ``req`` out of the role's queues, releasing what it holds; False: in none."""
        return False

    def holders(self) -> list[Req]:
        """Requests that own KV outside the running batch and the chunked slot."""
        return []

    def check_integrity(self) -> None:
        """Raise ``IntegrityError`` when the role's queues hold what they must not."""


class CoLocated(Role):
    """Prefill and decode on one instance: every hook as ``Role`` defines it."""

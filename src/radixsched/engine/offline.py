"""The offline engine: ``Engine(runner, config).generate(requests)`` runs exactly the scheduler
loop the simulator and the HTTP server run, on whatever ``ModelRunner`` it is given.

Its scheduler is built by ``radixsched.native.build.build_scheduler``, as the simulator's and the
server's are: the native core where the extension is on, the reference otherwise
(``RADIXSCHED_NATIVE=0``, no build, or ``accelerate=False``); chosen once, never rewired. A
runner without ``supports_multi_step`` (a real model) decodes one step at a time on either.
The engine is co-located: a config naming a split prefill/decode role is refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixsched.clock import Clock, WallClock
from radixsched.config import SchedulerConfig
from radixsched.native.build import build_scheduler
from radixsched.request import FinishState, Req
from radixsched.roles import CoLocated
from radixsched.runner import ModelRunner
from radixsched.scheduler import AdmitResult, StepOutcome


@dataclass(frozen=True)
class GenerateOutput:
    rid: str
    output_ids: list[int]
    finish: FinishState | None
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    e2e_s: float | None
    admit: AdmitResult


class Engine:
    def __init__(
        self,
        runner: ModelRunner,
        config: SchedulerConfig | None = None,
        *,
        kv_slots: int | None = None,
        clock: Clock | None = None,
        context_len: int | None = None,
        accelerate: bool = True,
    ) -> None:
        self.config = config or SchedulerConfig()
        if kv_slots is None:
            pool = getattr(runner, "kv_pool_size", None)
            if pool is None:
                raise ValueError("kv_slots is required for a runner without a KV pool size")
            # The runner's pool holds the reserved padding page too.
            kv_slots = int(pool) - self.config.page_size
        ctx = context_len or int(getattr(runner, "max_context_len", 131072))
        self.scheduler = build_scheduler(
            self.config,
            runner,
            accelerate=accelerate,
            kv_slots=kv_slots,
            clock=clock if clock is not None else WallClock(),
            context_len=ctx,
            role=CoLocated,
        )

    def generate(
        self,
        requests: Sequence[Req],
        *,
        check_integrity: bool = False,
        on_step: Callable[[StepOutcome], None] | None = None,
    ) -> list[GenerateOutput]:
        """Run every request to completion; outputs in input order."""
        sched = self.scheduler
        admits = [sched.add_request(r) for r in requests]
        while not sched.is_idle:
            out = sched.step()
            if check_integrity:
                sched.check_integrity()
            if out is None:
                raise RuntimeError("scheduler made no progress with work pending")
            if on_step is not None:
                on_step(out)
        if check_integrity:
            sched.check_integrity()
        return [_output(r, a) for r, a in zip(requests, admits, strict=True)]


def _output(r: Req, admit: AdmitResult) -> GenerateOutput:
    t = r.times
    return GenerateOutput(
        rid=r.rid,
        output_ids=list(r.output_ids),
        finish=r.finish,
        prompt_tokens=r.prompt_len,
        cached_tokens=r.cached_tokens,
        ttft_s=None if t.first_token is None else t.first_token - t.arrival,
        e2e_s=None if t.finish is None else t.finish - t.arrival,
        admit=admit,
    )

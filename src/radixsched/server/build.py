"""Engines for the server: a model under a wall-clock scheduler in an (unstarted)
``EngineLoop``, and the ``ServedModel`` the HTTP layer reports. No FastAPI here: the engine's
child process builds its loop with ``engine_for_runner``.

The scheduler is ``radixsched.native.build.build_scheduler``'s, as the simulator's and the offline
engine's: the native core where the extension is on, else the reference (one notice); chosen
when built, never rewired. The server is co-located: a split prefill/decode role is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from radixsched.engine.build import torch_runner
from radixsched.server.loop import BatchRecorder, EngineLoop, Sink, post_to_event_loops
from radixsched.server.metrics import ServerMetrics
from radixsched.server.model import ServedModel, served_model

if TYPE_CHECKING:
    from radixsched.clock import WallClock
    from radixsched.config import SchedulerConfig
    from radixsched.engine.loader import LoadedModel
    from radixsched.runner import ModelRunner


def engine_for_model(
    loaded: LoadedModel,
    config: SchedulerConfig,
    *,
    kv_slots: int,
    context_len: int | None = None,
    served_model_name: str | None = None,
    tokenizer_path: str | None = None,
) -> tuple[EngineLoop, ServedModel]:
    """A ``TorchRunner`` over a fresh pool of ``kv_slots`` KV slots under a wall-clock
    scheduler, in an (unstarted) loop. Several engines may share one loaded model (the weights
    are read-only)."""
    runner = torch_runner(loaded, config, kv_slots, context_len=context_len, seed=0)
    engine = engine_for_runner(
        runner, config, kv_slots=kv_slots, context_len=runner.max_context_len
    )
    served = served_model(
        loaded,
        runner.max_context_len,
        served_model_name=served_model_name,
        tokenizer_path=tokenizer_path,
    )
    return engine, served


def engine_for_runner(
    runner: ModelRunner,
    config: SchedulerConfig,
    *,
    kv_slots: int,
    context_len: int,
    clock: WallClock | None = None,
    sink: Sink = post_to_event_loops,
    on_unhealthy: Callable[[], None] | None = None,
) -> EngineLoop:
    """A wall-clock scheduler (``build_scheduler``'s) over ``runner`` in an (unstarted)
    ``EngineLoop`` whose posts go to ``sink`` (default: the event loops of the requests'
    handles)."""
    from radixsched.clock import WallClock
    from radixsched.native.build import build_scheduler
    from radixsched.roles import CoLocated

    clock = clock if clock is not None else WallClock()
    recorder = BatchRecorder(runner)  # the scheduler is built on it: nothing is rewired later
    sched = build_scheduler(
        config, recorder, kv_slots=kv_slots, clock=clock, context_len=context_len, role=CoLocated
    )
    return EngineLoop(
        sched, metrics=ServerMetrics(), clock=clock, sink=sink, on_unhealthy=on_unhealthy
    )

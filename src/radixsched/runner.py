"""The model-runner contract: the only part of the loop that differs between the simulator
(``sim.cost.runner.CostModelRunner``: modelled time, no tensors) and the real engine
(``engine.runner.TorchRunner``: a PyTorch model over a KV pool tensor).

Contract for implementers:
- ``forward(batch)`` runs one forward pass over every entry of ``batch`` and returns, for each
  entry that produces a token (every decode entry, and extend entries whose
  ``produces_token`` is True: the last chunk of a prefill), the next token id, plus how long
  the step took (measured wall seconds for a real model, modelled seconds for a simulator).
- KV for an extend entry's new tokens must be written into ``new_slots`` (one slot per new
  token, in order). Its cached prefix lives in ``prefix_slots`` and must only be read.
- A decode entry's input token is written at ``slots[-1]``; ``slots`` covers positions
  ``0 .. position`` inclusive.
- The runner never allocates or frees KV slots and never touches the scheduler's state.

Extensions a runner may add: jumping over decode steps in which nothing but lengths change
(``radixsched.native.runner.MultiStepRunner``, the simulator's), and keeping a request's KV in
host memory for a decode instance of a split deployment (``radixsched.cluster.disagg``).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from radixsched.request import Req, SlotArray, TokenArray


class ForwardMode(enum.Enum):
    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"  # extend entries plus one decode token per running request


@dataclass(slots=True)
class ExtendEntry:
    req: Req
    prefix_len: int  # tokens whose KV already exists (cache hit or earlier chunks)
    new_token_ids: TokenArray  # tokens [prefix_len, prefix_len + len(new_token_ids))
    prefix_slots: SlotArray  # KV slots of positions [0, prefix_len)
    new_slots: SlotArray  # KV slots for the new tokens
    produces_token: bool  # True on the last chunk: sample the next token
    host_load_len: int = 0  # of the prefix, tokens loaded back from the host tier this step

    @property
    def num_new(self) -> int:
        return len(self.new_token_ids)


@dataclass(slots=True)
class DecodeEntry:
    req: Req
    token_id: int  # input token (the last generated one)
    position: int  # its position in prompt + output
    slots: SlotArray  # KV slots of positions [0, position]; slots[-1] is the new one


@dataclass(slots=True)
class Batch:
    extend: list[ExtendEntry]
    decode: list[DecodeEntry]

    @property
    def mode(self) -> ForwardMode:
        if self.extend and self.decode:
            return ForwardMode.MIXED
        return ForwardMode.EXTEND if self.extend else ForwardMode.DECODE

    @property
    def batch_size(self) -> int:
        return len(self.extend) + len(self.decode)


@dataclass(slots=True)
class StepResult:
    # Next token per producing entry, keyed by request id.
    next_tokens: dict[str, int]
    duration_s: float


@dataclass(slots=True)
class StepOutcome:
    mode: str  # "extend", "decode", "mixed"
    duration_s: float
    batch_size: int
    num_steps: int = 1  # > 1 when several forward passes ran in one step (accelerators)
    prefill_tokens: int = 0
    finished: list[Req] = field(default_factory=list)
    retracted: list[Req] = field(default_factory=list)
    _tokens: list[tuple[Req, list[int]]] = field(default_factory=list, repr=False)

    @property
    def new_tokens(self) -> list[tuple[Req, list[int]]]:
        """Tokens produced this step, per request, in batch order."""
        return self._tokens


class ModelRunner(ABC):
    """See the module docstring for the contract."""

    supports_multi_step: bool = False  # a MultiStepRunner (radixsched.native.runner) says True
    reads_kv_slots: bool = True  # False: the native core then counts slots (_native/pool.hpp)

    @abstractmethod
    def forward(self, batch: Batch) -> StepResult: ...

    def eos_token_ids(self) -> tuple[int, ...]:
        """Token ids that end generation unless ``ignore_eos``."""
        return ()

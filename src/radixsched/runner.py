"""The model-runner contract: the only part of the loop that differs between the simulator
(``sim.costmodel.CostModelRunner``: modelled time, no tensors) and the real engine
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
- ``decode_multi`` is optional (``supports_multi_step``): the simulator uses it to jump over
  decode steps in which nothing but lengths change; a real runner leaves it unsupported.
  A multi-step runner's tokens depend only on the request and the position, never on how
  steps were grouped, and ``tokens_at`` returns them again on demand (the accelerated
  scheduler writes decode tokens into requests only when they leave the batch).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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
    def extend_num_tokens(self) -> int:
        return sum(e.num_new for e in self.extend)

    @property
    def batch_size(self) -> int:
        return len(self.extend) + len(self.decode)


@dataclass(slots=True)
class StepResult:
    # Next token per producing entry, keyed by request id.
    next_tokens: dict[str, int]
    duration_s: float


@dataclass
class MultiDecodeResult:
    """``num_steps`` decode steps of the same batch at once (simulator fast path)."""

    tokens: npt.NDArray[np.int32]  # [batch, num_steps]
    step_durations_s: npt.NDArray[np.float64]  # [num_steps]


class ModelRunner(ABC):
    """See the module docstring for the contract."""

    supports_multi_step: bool = False

    @abstractmethod
    def forward(self, batch: Batch) -> StepResult: ...

    def decode_multi(
        self, reqs: Sequence[Req], seq_lens: npt.NDArray[np.int64], num_steps: int
    ) -> MultiDecodeResult:
        """Run ``num_steps`` decode steps of ``reqs`` whose current lengths (prompt + output,
        before the first of these steps) are ``seq_lens``. Only needed when
        ``supports_multi_step``; KV contents are not materialised."""
        raise RuntimeError(
            f"{type(self).__name__} runs one decode step at a time (supports_multi_step is False)"
        )

    def decode_durations(
        self, reqs: Sequence[Req], seq_lens: npt.NDArray[np.int64], num_steps: int
    ) -> npt.NDArray[np.float64]:
        """The step times ``decode_multi`` would report, without running it (the scheduler
        asks how far a jump may go before committing to it)."""
        return self.decode_multi(reqs, seq_lens, num_steps).step_durations_s

    def tokens_at(self, reqs: Sequence[Req], positions: npt.NDArray[np.int64]) -> np.ndarray:
        """The tokens ``decode_multi`` generates for each request at each position (index in
        prompt + output): ``positions`` is ``[len(reqs), steps]``, and so is the result. Only
        needed when ``supports_multi_step``."""
        raise RuntimeError(f"{type(self).__name__} cannot replay decode tokens")

    def eos_token_ids(self) -> tuple[int, ...]:
        """Token ids that end generation unless ``ignore_eos``."""
        return ()

    def offload_kv(self, req: Req, slots: SlotArray) -> None:
        """Copy ``req``'s KV held in ``slots`` (positions ``0 .. len(slots) - 1``) to host
        memory before the scheduler frees them: how a decode instance of a split deployment
        retracts (``radixsched.cluster.disagg``: it cannot prefill the request again). Needed
        only by decode-role schedulers; a runner whose KV has content keeps it until
        ``reload_kv``."""
        raise NotImplementedError(f"{type(self).__name__} cannot offload KV to host memory")

    def reload_kv(self, req: Req, slots: SlotArray) -> None:
        """Write back the KV ``offload_kv`` kept for ``req`` into ``slots`` (new slots, the
        same positions) and forget the host copy."""
        raise NotImplementedError(f"{type(self).__name__} cannot reload KV from host memory")

"""The runner contract of the decode jump: what a runner offers so that ``NativeScheduler`` can
run several decode steps of an unchanged batch at once (``supports_multi_step``).

A multi-step runner's tokens depend only on the request and the position, never on how steps
were grouped, and ``tokens_at`` returns them again on demand: the accelerated scheduler writes
decode tokens into requests only when they leave the batch. The simulator's
``CostModelRunner`` is one; a real model runs one step at a time and is not.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from radixsched.request import Req
from radixsched.runner import ModelRunner


@dataclass
class MultiDecodeResult:
    """``num_steps`` decode steps of the same batch at once."""

    tokens: npt.NDArray[np.int32]  # [batch, num_steps]
    step_durations_s: npt.NDArray[np.float64]  # [num_steps]


class MultiStepRunner(ModelRunner):
    supports_multi_step = True

    @abstractmethod
    def decode_multi(
        self, reqs: Sequence[Req], seq_lens: npt.NDArray[np.int64], num_steps: int
    ) -> MultiDecodeResult:
        """Run ``num_steps`` decode steps of ``reqs`` whose current lengths (prompt + output,
        before the first of these steps) are ``seq_lens``; KV contents are not materialised."""

    def decode_durations(
        self, reqs: Sequence[Req], seq_lens: npt.NDArray[np.int64], num_steps: int
    ) -> npt.NDArray[np.float64]:
        """The step times ``decode_multi`` would report, without running it (the scheduler
        asks how far a jump may go before committing to it)."""
        return self.decode_multi(reqs, seq_lens, num_steps).step_durations_s

    def native_decode_cost(self) -> Any | None:
        """A native step timer (``_core.DecodeCost``) giving exactly ``decode_durations``'s
        floats without a call into Python per jump, or None (the default: the scheduler asks
        ``decode_durations``)."""
        return None

    def native_prefill_cost(self) -> Any | None:
        """A native timer (``_core.PrefillCost``) of an extend-only step that loads nothing
        back from the host tier, giving exactly ``forward``'s duration, or None (the default:
        the scheduler runs ``forward``)."""
        return None

    def native_tokens(self) -> tuple[Mapping[str, int], int] | None:
        """``(hashes, vocab)`` when a request without stop ids or script generates, at position
        ``p``, ``splitmix64(hashes[rid] ^ (p * golden mod 2**64)) mod vocab`` (``sim/cost/splitmix.py``):
        the native core then computes those tokens itself. None (the default): ``tokens_at``."""
        return None

    def native_step(self) -> tuple[Any, Mapping[str, int], int] | None:
        """(``native_prefill_cost()``, then ``native_tokens()``'s hashes and vocabulary) where
        both are offered, else None: what a native extend-only step asks, in one call."""
        cost, tokens = self.native_prefill_cost(), self.native_tokens()
        if cost is None or tokens is None:
            return None
        return cost, tokens[0], tokens[1]

    @abstractmethod
    def tokens_at(self, reqs: Sequence[Req], positions: npt.NDArray[np.int64]) -> np.ndarray:
        """The tokens ``decode_multi`` generates for each request at each position (index in
        prompt + output): ``positions`` is ``[len(reqs), steps]``, and so is the result."""

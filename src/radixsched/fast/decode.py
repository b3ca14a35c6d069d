"""Columnar running state: the running batch's lengths as numpy columns, kept across decode
steps, so that a step (or a jump over many) costs a few whole-column operations.

``DecodeCols`` are the columns; ``FastRunningBatch`` keeps them in step with the batch's
membership. With deferred decode state (``FastScheduler``) the columns run ahead of the
requests: a jump advances only the columns and reserves the KV slots; each request's tokens,
token times and slots are written when it leaves the batch or someone reads it (``settle``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from radixsched.request import Req
from radixsched.running import RunningBatch, retraction_order


class DecodeCols(NamedTuple):
    reqs: list[Req]
    fill: np.ndarray  # prompt + output length (the next token's KV goes at fill - 1)
    have: np.ndarray  # len(kv_row): slots allocated (deferred: owed ones included)
    out_len: np.ndarray
    max_new: np.ndarray
    ignore_eos: np.ndarray  # bool
    stops: np.ndarray  # bool: the request may stop before max_new_tokens (stop ids or EOS)

    @property
    def can_stop(self) -> bool:
        return bool(self.stops.any())

    @staticmethod
    def of(reqs: list[Req], has_eos: bool) -> DecodeCols:
        rows = [
            (
                len(r.prompt_ids) + len(r.output_ids),
                len(r.kv_row),
                len(r.output_ids),
                r.sampling.max_new_tokens,
                r.sampling.ignore_eos,
                bool(r.sampling.stop_token_ids) or (has_eos and not r.sampling.ignore_eos),
            )
            for r in reqs
        ]
        a = np.array(rows, dtype=np.int64).reshape(len(rows), 6)
        return DecodeCols(
            list(reqs), a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4] != 0, a[:, 5] != 0
        )

    def take(self, mask: np.ndarray, reqs: list[Req]) -> DecodeCols:
        """The rows where ``mask`` is true, in order; ``reqs`` are those rows' requests."""
        return DecodeCols(reqs, *(c[mask] for c in self[1:]))

    def extended(self, reqs: list[Req], has_eos: bool) -> DecodeCols:
        """These rows followed by ``reqs``'s."""
        more = DecodeCols.of(reqs, has_eos)
        return DecodeCols(
            self.reqs + more.reqs,
            *(np.concatenate([a, b]) for a, b in zip(self[1:], more[1:], strict=True)),
        )

    def decode_tokens(self, clip: int) -> tuple[int, int]:
        """``RunningBatch.decode_tokens`` of these requests, vectorised."""
        rem = np.minimum(np.maximum(self.max_new - self.out_len, 0), clip)
        full = int(rem[self.ignore_eos].sum())
        return full, int(rem.sum()) - full

    def need(self, steps: int, page: int) -> np.ndarray:
        """Slots each row must allocate to decode ``steps`` more tokens: after ``k`` steps a
        request holds KV for positions ``[0, fill - 1 + k)``."""
        ends = self.fill + (steps - 1)
        if page > 1:
            ends = -(-ends // page) * page
        return np.maximum(ends - self.have, 0)

    def same_as(self, other: DecodeCols) -> bool:
        return (
            len(self.reqs) == len(other.reqs)
            and all(a is b for a, b in zip(self.reqs, other.reqs, strict=True))
            and all(np.array_equal(a, b) for a, b in zip(self[1:], other[1:], strict=True))
        )


class FastRunningBatch(RunningBatch):
    """The running batch with its columns (``cols``, None until a decode step builds them).
    Invariant: ``cols`` is None or lists exactly ``reqs``, in order, with their lengths as the
    requests will have them once settled."""

    def __init__(self, has_eos: bool, settle: Callable[[DecodeCols, int], None]) -> None:
        """``has_eos``: the model has EOS tokens; ``settle(cols, i)`` writes row ``i``'s
        deferred decode state into its request (``FastScheduler.settle``)."""
        super().__init__()
        self.has_eos, self.settle = has_eos, settle
        self.cols: DecodeCols | None = None
        self._tokens: tuple[DecodeCols, int, tuple[int, int]] | None = None  # decode_tokens memo

    def columns(self) -> DecodeCols:
        if self.cols is None:
            self.cols = DecodeCols.of(self.reqs, self.has_eos)
        return self.cols

    def extend(self, reqs: list[Req]) -> None:
        super().extend(reqs)
        if self.cols is not None and reqs:
            self.cols = self.cols.extended(reqs, self.has_eos)

    def remove(self, reqs: list[Req]) -> None:
        """Requests leave; their deferred state is written first, the survivors keep theirs."""
        if not reqs:
            return
        gone = {id(r) for r in reqs}
        keep = np.array([id(r) not in gone for r in self.reqs], dtype=np.bool_)
        if self.cols is not None:
            for i in np.flatnonzero(~keep).tolist():
                self.settle(self.cols, i)
        super().remove(reqs)
        if self.cols is not None:
            self.cols = self.cols.take(keep, list(self.reqs))

    def remove_at(self, positions: list[int]) -> None:
        """Remove the (settled) requests at ``positions`` (ascending)."""
        keep = np.ones(len(self.reqs), dtype=np.bool_)
        keep[positions] = False
        for i in reversed(positions):
            del self.reqs[i]
        if self.cols is not None:
            self.cols = self.cols.take(keep, list(self.reqs))

    def decode_tokens(self, clip: int) -> tuple[int, int]:
        """From the columns, memoised while they are the same object (every change replaces
        them)."""
        if not self.reqs:
            return (0, 0)
        cols, memo = self.columns(), self._tokens
        if memo is None or memo[0] is not cols or memo[1] != clip:
            memo = self._tokens = (cols, clip, cols.decode_tokens(clip))
        return memo[2]

    def progress(self) -> tuple[int, int]:
        if not self.reqs:
            return 0, 0
        cols = self.columns()
        return int(cols.out_len.sum()), int(cols.max_new.sum())

    def retraction_order(self, by_priority: bool, sign: int) -> list[Req]:
        out = self.columns().out_len.tolist() if self.reqs else []
        return retraction_order(self.reqs, out, by_priority, sign)

    def step_need(self, page: int) -> list[int]:
        return self.columns().need(1, page).tolist() if self.reqs else []

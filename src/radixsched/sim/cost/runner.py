"""The cost model as a ``ModelRunner``: step times from the model, stand-in output tokens
(deterministic per request and position), and multi-step decode jumps."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from radixsched.native import core
from radixsched.native.runner import MultiDecodeResult, MultiStepRunner
from radixsched.request import Req, SlotArray
from radixsched.runner import Batch, StepResult
from radixsched.sim.cost.roofline import (
    CostModel,
    IntArray,
    StepCostModel,
    _extend_sums,
    decode_shape,
    shape_of,
)
from radixsched.sim.cost.splitmix import (
    _GOLDEN,
    _GOLDEN_0D,
    _GOLDEN_INT,
    _MASK64,
    _splitmix64_inplace,
    _splitmix64_int,
)

# Vocabularies up to this size hold every token in an int32 without wrapping.
_INT32_VOCAB = 1 << 31
# Up to this many tokens of plain requests, ``tokens_at`` mixes on Python ints (cheaper than
# the arrays' fixed cost of about 7 us).
_SCALAR_MAX_TOKENS = 12
_RID_MEMO_SIZE = 1 << 16
_from_bytes = int.from_bytes  # (a global read: cheaper than the attribute, per request)


def _stand_in(rid_hash: int, position: int, vocab_size: int) -> int:
    """The stand-in token at ``position`` of a request without stop ids or script, on Python
    ints (``tokens_at`` on arrays: ``(p * golden) mod 2**64`` is what
    ``astype(uint64) * golden`` wraps to, also for a negative ``p``)."""
    return _splitmix64_int(rid_hash ^ ((position * _GOLDEN_INT) & _MASK64)) % vocab_size


def _stand_ins(rid_hash: int, positions: Iterable[int], vocab_size: int) -> list[int]:
    """``[_stand_in(rid_hash, p, vocab_size) for p in positions]``, one call fewer a token."""
    return [
        _splitmix64_int(rid_hash ^ ((p * _GOLDEN_INT) & _MASK64)) % vocab_size for p in positions
    ]


class _RidHashes(dict[str, int]):
    """``rid -> `` the little-endian 8-byte blake2b digest of ``f"{seed}/{rid}"`` for one
    seed, filled on first use and emptied when it reaches ``_RID_MEMO_SIZE`` entries (a plain
    dict lookup is the cheapest per-request read). A miss hashes from a copy of the state that
    has taken ``f"{seed}/"`` (blake2b is incremental, and UTF-8 encodes a concatenation as the
    concatenation of the encodings: the same digest, for about half the cost of hashing the
    whole string afresh)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self._seeded = hashlib.blake2b(f"{seed}/".encode(), digest_size=8)

    def __missing__(self, rid: str) -> int:
        if len(self) >= _RID_MEMO_SIZE:
            self.clear()
        state = self._seeded.copy()
        # (formatted as the whole string formats it: a str as it is, without the format)
        state.update(rid.encode() if type(rid) is str else f"{rid}".encode())
        h = self[rid] = _from_bytes(state.digest(), "little")
        return h


def _per_batch(cost: CostModel, b: int) -> tuple[float, float]:
    """What a decode step of ``b`` entries adds to its context's terms in ``_dense_step_s``:
    the efficiency factor and the fixed seconds (``tokens = entries = b``, nothing loaded back,
    no extend)."""
    return cost._efficiency_factor(b), cost._fixed_s(b, b, 0)


def _dense_rates(cost: StepCostModel) -> tuple[Any, tuple[float, ...]] | None:
    """(the native core, the dense roofline's six rates as ``_core.DecodeCost`` and
    ``_core.PrefillCost`` take them first) where ``cost`` is a dense roofline ``CostModel``
    with ``_finite_rates`` and the core is built; else None."""
    lib = core()
    if lib is None or type(cost) is not CostModel or not cost._dense or not cost._finite_rates:
        return None
    rates = (
        cost._linear_flops_per_token,
        cost._attn_flops_per_pair,
        cost._flops_per_s,
        float(cost._dense_weight_bytes),
        cost._kv_bytes_all_gpus,
        cost._bytes_per_s,
    )
    return lib, rates


def _native_decode_cost(cost: StepCostModel) -> Any | None:
    """``cost``'s decode steps in C++ (``_core.DecodeCost``: ``_dense_step_s`` on doubles, the
    same floats) where ``_dense_rates`` applies; else None."""
    dense = _dense_rates(cost)
    if dense is None:
        return None
    lib, rates = dense
    assert isinstance(cost, CostModel)
    return lib.DecodeCost(*rates, partial(_per_batch, cost))  # the cost: no reference cycle


def _native_prefill_cost(cost: StepCostModel) -> Any | None:
    """``cost``'s extend-only steps that load nothing back in C++ (``_core.PrefillCost``:
    ``_dense_step_s`` with ``_efficiency_factor`` and ``_fixed_s`` on doubles, the same floats)
    where ``_dense_rates`` applies and a host term of no tokens is 0.0 (a positive PCIe
    rate); else None."""
    dense = _dense_rates(cost)
    if dense is None or not cost.gpu.pcie_bw > 0:
        return None
    lib, rates = dense
    assert isinstance(cost, CostModel)
    return lib.PrefillCost(
        *rates,
        cost.prefill_eff_tokens,
        cost.step_overhead_s,
        cost.sched_step_s,
        cost.sched_per_req_s,
        cost.sched_per_prefill_s,
        None if cost.tp == 1 else cost.allreduce_s,  # allreduce_s is 0.0 at tp 1
    )


class CostModelRunner(MultiStepRunner):
    """Modelled time, plausible tokens: a request's ``scripted_output`` where it has one,
    else a deterministic stand-in drawn from ``hash(seed, rid, position)``, never one of its
    stop token ids. Tokens depend only on the request and position, never on batching, so
    every schedule yields the same tokens.

    Of a request only the hash of its ``rid`` is remembered (by ``rid`` and ``seed``); stop
    ids and scripts are read on every call. With a dense roofline ``CostModel``, step times
    are computed on Python floats, and a few tokens of requests without stop ids or script on
    Python ints: the same values as the array paths, bit for bit."""

    supports_multi_step = True
    reads_kv_slots = False  # modelled KV has no content

    def __init__(
        self, cost: StepCostModel, *, seed: int = 0, vocab_size: int | None = None
    ) -> None:
        self.cost = cost
        self.seed = seed
        self.vocab_size = vocab_size or cost.model.vocab_size
        if self.vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        self._rid_hashes = _RidHashes(seed)
        # ``native_tokens``' last recipe and the ``vocab_size`` object it was made of (none yet)
        self._recipe: tuple[_RidHashes, int] = (self._rid_hashes, 0)
        self._recipe_vocab: object = None
        # ``native_step``'s last answer and the (cost, vocab_size, seed) it was made of (none)
        self._step: tuple[Any, Mapping[str, int], int] | None = None
        self._step_of: tuple[object, object, object] = (None, None, None)
        self._native_for: StepCostModel | None = None  # the cost model _native_cost is of
        self._native_cost: tuple[Any, Any] = (None, None)  # (decode, prefill)

    def _natives(self) -> tuple[Any, Any]:
        """The cost model's native step timers, built once per cost model (``cost`` may be
        reassigned)."""
        cost = self.cost
        if cost is not self._native_for:
            self._native_for = cost
            self._native_cost = (_native_decode_cost(cost), _native_prefill_cost(cost))
        return self._native_cost

    # The three below run once a scheduler step or more: ``_natives`` and ``_hashes`` inline
    # (their fast cases; a call to each otherwise).
    def native_decode_cost(self) -> Any | None:
        """The cost model's decode steps in C++ where it is a dense roofline, else None."""
        if self.cost is self._native_for:
            return self._native_cost[0]
        return self._natives()[0]

    def native_prefill_cost(self) -> Any | None:
        """The cost model's extend-only steps in C++ (``_native_prefill_cost``), else None."""
        if self.cost is self._native_for:
            return self._native_cost[1]
        return self._natives()[1]

    def native_tokens(self) -> tuple[_RidHashes, int] | None:
        """The stand-ins' recipe for the native core (``MultiStepRunner.native_tokens``): what
        ``_stand_in`` computes, where every token fits an int32 as ``tokens_at``'s do. The
        last recipe is handed again while ``vocab_size`` is the object it was made of and its
        memo's seed is ``seed`` (``_recipe_of``)."""
        got = self._recipe
        if self.vocab_size is self._recipe_vocab and got[0].seed == self.seed:
            return got
        return self._recipe_of()

    def native_step(self) -> tuple[Any, Mapping[str, int], int] | None:
        """``MultiStepRunner.native_step``'s answer, the last one again while the cost model,
        the ``vocab_size`` and the ``seed`` are the objects it was made of (what it reads of
        this runner: ``native_prefill_cost`` is the cost model's, built once per object)."""
        made = self._step_of
        if made[0] is self.cost and made[1] is self.vocab_size and made[2] is self.seed:
            return self._step
        self._step = super().native_step()
        self._step_of = (self.cost, self.vocab_size, self.seed)
        return self._step

    def _recipe_of(self) -> tuple[_RidHashes, int] | None:
        vocab = int(self.vocab_size)
        if vocab > _INT32_VOCAB:
            return None
        self._recipe, self._recipe_vocab = (self._hashes(), vocab), self.vocab_size
        return self._recipe

    def _hashes(self) -> _RidHashes:
        memo = self._rid_hashes
        if memo.seed != self.seed:  # ``seed`` was reassigned
            memo = self._rid_hashes = _RidHashes(self.seed)
        return memo

    def _dense_roofline(self) -> CostModel | None:
        """The cost model when it is exactly a dense ``CostModel`` (its scalar paths apply)."""
        cost = self.cost
        if type(cost) is CostModel and cost._dense:
            return cost
        return None

    def tokens_at(self, reqs: Sequence[Req], positions: IntArray) -> npt.NDArray[np.int32]:
        """The token each request generates at each position (index in prompt + output):
        ``positions`` is ``[len(reqs), steps]``; so is the result."""
        n, vocab = len(reqs), int(self.vocab_size)
        # One pass: the rids of requests whose tokens are pure hashes (no stop ids, no script).
        rids = [r.rid for r in reqs if not r.sampling.stop_token_ids and r.scripted_output is None]
        plain = len(rids) == n and vocab <= _INT32_VOCAB
        rows = positions.ndim == 2 and len(positions) == n  # no broadcasting
        if plain and rows and positions.size <= _SCALAR_MAX_TOKENS and positions.dtype == np.int64:
            hashes = self._hashes()
            out = [
                _stand_ins(hashes[rid], ps, vocab)
                for rid, ps in zip(rids, positions.tolist(), strict=True)
            ]
            return np.array(out, dtype=np.int32).reshape(positions.shape)
        if len(rids) != n:
            rids = [r.rid for r in reqs]
        hashes = self._hashes()
        if rows:  # in place on the positions' copy: [n, steps] already
            mixed = positions.astype(np.uint64)
            np.multiply(mixed, _GOLDEN_0D, out=mixed)
            if n == 1:  # a 0-d operand broadcasts faster than a [1, 1] one
                column = np.array(hashes[rids[0]], dtype=np.uint64)
            else:
                column = np.fromiter(map(hashes.__getitem__, rids), np.uint64, n)[:, None]
            np.bitwise_xor(mixed, column, out=mixed)
        else:
            column = np.fromiter(map(hashes.__getitem__, rids), np.uint64, n)[:, None]
            mixed = column ^ (positions.astype(np.uint64) * _GOLDEN)
        _splitmix64_inplace(mixed)
        np.remainder(mixed, np.array(vocab, dtype=np.uint64), out=mixed)
        if plain:
            return mixed.astype(np.int32)  # every token is below 2**31: as via int64
        tokens = mixed.astype(np.int64)
        special = [
            i
            for i, r in enumerate(reqs)
            if r.sampling.stop_token_ids or r.scripted_output is not None
        ]
        for i in special:
            req = reqs[i]
            stops = req.sampling.stop_token_ids
            if stops:
                row = tokens[i]
                hit = np.isin(row, stops)
                while hit.any():  # at most len(stops) rounds
                    row[hit] = (row[hit] + 1) % vocab
                    hit = np.isin(row, stops)
            scripted = req.scripted_output
            if scripted is not None and len(scripted):
                out_idx = positions[i] - req.prompt_len
                has = (out_idx >= 0) & (out_idx < len(scripted))
                tokens[i, has] = scripted[out_idx[has]]
        return tokens.astype(np.int32)

    def forward(self, batch: Batch) -> StepResult:
        extend, decode = batch.extend, batch.decode
        cost = self._dense_roofline()
        if cost is None:
            duration = float(self.cost.step_times(shape_of(batch))[0])
        else:  # shape_of and step_times' one-step branch, without the StepShape
            if not extend and not decode:
                raise ValueError("empty batch")
            new, attn, _, kv, host = _extend_sums(extend)
            ctx = sum([d.position + 1 for d in decode]) if decode else 0
            entries = len(extend) + len(decode)
            duration = cost._dense_step_s(
                new + len(decode), attn + ctx, kv + ctx, host, entries, len(extend)
            )
        producing = [e for e in extend if e.produces_token]
        reqs = [e.req for e in producing]
        positions = [e.prefix_len + e.num_new for e in producing]
        if decode:
            reqs += [d.req for d in decode]
            positions += [d.position + 1 for d in decode]
        next_tokens: dict[str, int] = {}
        if not reqs:
            return StepResult(next_tokens, duration)
        vocab = int(self.vocab_size)
        if vocab <= _INT32_VOCAB:  # tokens_at's scalar path, one request at a time
            hashes = self._hashes()
            for r, pos in zip(reqs, positions, strict=True):
                if r.sampling.stop_token_ids or r.scripted_output is not None:
                    break
                next_tokens[r.rid] = _stand_in(hashes[r.rid], int(pos), vocab)
            else:
                return StepResult(next_tokens, duration)
        tokens = self.tokens_at(reqs, np.array(positions, dtype=np.int64)[:, None])
        next_tokens = {r.rid: int(t) for r, t in zip(reqs, tokens[:, 0], strict=True)}
        return StepResult(next_tokens, duration)

    def decode_multi(
        self, reqs: Sequence[Req], seq_lens: npt.NDArray[np.int64], num_steps: int
    ) -> MultiDecodeResult:
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        lens = np.asarray(seq_lens, dtype=np.int64)
        if len(lens) != len(reqs) or not len(reqs):
            raise ValueError(f"{len(reqs)} requests but {len(lens)} sequence lengths")
        durations = self.decode_durations(reqs, lens, num_steps)
        # Step k of request i generates the token at position seq_len + k.
        positions = lens[:, None] + np.arange(num_steps, dtype=np.int64)[None, :]
        return MultiDecodeResult(self.tokens_at(reqs, positions), durations)

    def decode_durations(
        self, reqs: Sequence[Req], seq_lens: npt.NDArray[np.int64], num_steps: int
    ) -> npt.NDArray[np.float64]:
        lens = np.asarray(seq_lens, dtype=np.int64)
        native = self.native_decode_cost()
        if native is not None:  # decode_shape's total context, then the steps in C++
            durations: npt.NDArray[np.float64] = native.durations(
                len(lens), int(np.add.reduce(lens, axis=None)), num_steps
            )
            return durations
        return self.cost.step_times(decode_shape(lens, num_steps)).astype(np.float64)

    def eos_token_ids(self) -> tuple[int, ...]:
        return ()

    def offload_kv(self, req: Req, slots: SlotArray) -> None:
        """Nothing to keep: modelled KV has no content (the copy is not timed). With
        ``reload_kv``, what a decode instance's runner offers (``cluster.disagg``)."""

    def reload_kv(self, req: Req, slots: SlotArray) -> None:
        """Nothing to write back (see ``offload_kv``)."""

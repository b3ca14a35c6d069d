"""``TorchRunner``: the real model behind the scheduler's ``ModelRunner`` contract.

KV pool: one tensor ``[layers, 2, kv_pool_size, kv_heads, head_dim]``. Its slot indices are the
scheduler allocator's slots and the radix cache's values, unchanged: slot 0 is the padding slot
(never allocated, never written with real KV; padded decode rows point at it and are masked),
slots ``1 .. kv_pool_size - 1`` are what the allocator hands out. The runner only writes a step's
``new_slots`` / decode ``slots[-1]`` and only reads ``prefix_slots`` / earlier decode slots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from radixsched.engine.loader import LoadedModel
from radixsched.engine.model import AttentionPlan, CausalLM, DecodeGroup, ExtendSegment
from radixsched.engine.sampling import request_seed, sample_tokens
from radixsched.request import SamplingParams
from radixsched.runner import Batch, ModelRunner, StepResult


@dataclass
class _Prepared:
    input_ids: torch.Tensor
    positions: torch.Tensor
    plan: AttentionPlan
    # Rows of the flat token sequence whose logits are needed, and who they belong to.
    rows: list[int]
    row_rids: list[str]
    row_params: list[SamplingParams]
    row_seeds: list[int]
    row_positions: list[int]  # position of the token each row generates


class TorchRunner(ModelRunner):
    """One forward per scheduler step over a fixed KV pool of ``kv_slots`` usable slots."""

    def __init__(
        self,
        loaded: LoadedModel,
        kv_slots: int,
        *,
        device: str | torch.device | None = None,
        seed: int = 0,
        max_context_len: int | None = None,
    ) -> None:
        if kv_slots < 1:
            raise ValueError(f"kv_slots must be >= 1, got {kv_slots}")
        self.loaded = loaded
        model: CausalLM = loaded.model
        if device is not None and torch.device(device) != model.device:
            model = model.to(torch.device(device))
        self.model = model
        self.config = loaded.config
        self.seed = seed
        # Slots incl. the padding slot 0: the scheduler's allocator must hand out 1..size-1.
        self.kv_pool_size = kv_slots + 1
        limit = self.config.max_position_embeddings
        self.max_context_len = limit if max_context_len is None else min(limit, max_context_len)
        self.kv_pool = model.new_kv_pool(self.kv_pool_size)
        eos = (*loaded.tokenizer.eos_token_ids, *self.config.eos_token_ids)
        self._eos = tuple(dict.fromkeys(eos))

    @property
    def device(self) -> torch.device:
        return self.model.device

    @staticmethod
    def kv_slots_for_bytes(loaded: LoadedModel, num_bytes: int) -> int:
        """How many KV slots fit in ``num_bytes`` at the model's dtype."""
        per_token = loaded.config.kv_bytes_per_token(loaded.model.dtype.itemsize)
        return max(num_bytes // per_token - 1, 1)

    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    # ---- the step ------------------------------------------------------------------------

    def forward(self, batch: Batch) -> StepResult:
        start = time.perf_counter()
        if batch.batch_size == 0:
            return StepResult(next_tokens={}, duration_s=0.0)
        prep = self._prepare(batch, all_tokens=False)
        logits = self._logits(prep)
        tokens = sample_tokens(logits, prep.row_params, prep.row_seeds, prep.row_positions)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepResult(
            next_tokens=dict(zip(prep.row_rids, tokens, strict=True)),
            duration_s=time.perf_counter() - start,
        )

    def forward_logits(self, batch: Batch, *, all_tokens: bool = False) -> dict[str, torch.Tensor]:
        """Run the step (writing KV like ``forward``) and return float32 CPU logits per request:
        ``[1, vocab]`` for producing entries, or with ``all_tokens`` ``[num_new, vocab]`` for
        every extend entry (one row per new token) and ``[1, vocab]`` per decode entry."""
        if batch.batch_size == 0:
            return {}
        prep = self._prepare(batch, all_tokens=all_tokens)
        logits = self._logits(prep).cpu()
        out: dict[str, list[torch.Tensor]] = {}
        for i, rid in enumerate(prep.row_rids):
            out.setdefault(rid, []).append(logits[i])
        return {rid: torch.stack(rows) for rid, rows in out.items()}

    @torch.no_grad()
    def _logits(self, prep: _Prepared) -> torch.Tensor:
        hidden = self.model(prep.input_ids, prep.positions, self.kv_pool, prep.plan)
        rows = torch.tensor(prep.rows, dtype=torch.int64, device=self.device)
        return self.model.logits(hidden.index_select(0, rows))

    # ---- building the flat step --------------------------------------------------------------

    def _check_slots(self, slots: np.ndarray, what: str) -> None:
        if len(slots) and (int(slots.min()) < 1 or int(slots.max()) >= self.kv_pool_size):
            raise ValueError(
                f"{what}: slots must lie in [1, {self.kv_pool_size}), "
                f"got [{int(slots.min())}, {int(slots.max())}]"
            )

    def _prepare(self, batch: Batch, *, all_tokens: bool) -> _Prepared:
        window = self.config.sliding_window
        ids: list[np.ndarray] = []
        positions: list[np.ndarray] = []
        write: list[np.ndarray] = []
        extends: list[ExtendSegment] = []
        prep = _Prepared(
            input_ids=torch.empty(0),
            positions=torch.empty(0),
            plan=AttentionPlan(write_slots=torch.empty(0), extends=[], decode=None),
            rows=[],
            row_rids=[],
            row_params=[],
            row_seeds=[],
            row_positions=[],
        )
        q_start = 0
        for e in batch.extend:
            n, p, rid = e.num_new, e.prefix_len, e.req.rid
            if n < 1 or len(e.new_slots) != n or len(e.prefix_slots) != p:
                raise ValueError(
                    f"{rid}: extend of {n} tokens with {len(e.new_slots)} new slots, "
                    f"prefix_len {p} with {len(e.prefix_slots)} prefix slots"
                )
            if p + n > self.max_context_len:
                raise ValueError(
                    f"{rid}: {p + n} tokens exceed max_context_len {self.max_context_len}"
                )
            kv_slots = np.concatenate([e.prefix_slots, e.new_slots]).astype(np.int64)
            self._check_slots(kv_slots, rid)
            ids.append(np.asarray(e.new_token_ids, dtype=np.int64))
            positions.append(np.arange(p, p + n, dtype=np.int64))
            write.append(np.asarray(e.new_slots, dtype=np.int64))
            extends.append(
                ExtendSegment(
                    q_start=q_start,
                    q_len=n,
                    kv_slots=torch.from_numpy(kv_slots).to(self.device),
                    mask=self._extend_mask(p, n, window),
                )
            )
            seed = request_seed(e.req.sampling, rid, self.seed)
            if all_tokens or e.produces_token:
                first = 0 if all_tokens else n - 1
                for k in range(first, n):
                    prep.rows.append(q_start + k)
                    prep.row_rids.append(rid)
                    prep.row_params.append(e.req.sampling)
                    prep.row_seeds.append(seed)
                    prep.row_positions.append(p + k + 1)
            q_start += n

        decode: DecodeGroup | None = None
        if batch.decode:
            lengths = [d.position + 1 for d in batch.decode]
            max_len = max(lengths)
            slot_rows = np.zeros((len(batch.decode), max_len), dtype=np.int64)
            for b, d in enumerate(batch.decode):
                if len(d.slots) != d.position + 1:
                    raise ValueError(
                        f"{d.req.rid}: decode at position {d.position} with {len(d.slots)} slots"
                    )
                if d.position >= self.max_context_len:
                    raise ValueError(
                        f"{d.req.rid}: position {d.position} >= max_context_len {self.max_context_len}"
                    )
                slots = np.asarray(d.slots, dtype=np.int64)
                self._check_slots(slots, d.req.rid)
                # Padding columns keep slot 0; the mask hides them.
                slot_rows[b, : len(slots)] = slots
                prep.rows.append(q_start + b)
                prep.row_rids.append(d.req.rid)
                prep.row_params.append(d.req.sampling)
                prep.row_seeds.append(request_seed(d.req.sampling, d.req.rid, self.seed))
                prep.row_positions.append(d.position + 1)
            ids.append(np.array([d.token_id for d in batch.decode], dtype=np.int64))
            pos = np.array([d.position for d in batch.decode], dtype=np.int64)
            positions.append(pos)
            write.append(slot_rows[np.arange(len(batch.decode)), pos])
            decode = DecodeGroup(
                q_start=q_start,
                kv_slots=torch.from_numpy(slot_rows).to(self.device),
                mask=self._decode_mask(np.asarray(lengths, dtype=np.int64), max_len, window),
            )

        write_slots = np.concatenate(write)
        if len(np.unique(write_slots)) != len(write_slots):
            raise ValueError("a KV slot is written twice in one step")
        prep.input_ids = torch.from_numpy(np.concatenate(ids)).to(self.device)
        prep.positions = torch.from_numpy(np.concatenate(positions)).to(self.device)
        prep.plan = AttentionPlan(
            write_slots=torch.from_numpy(write_slots).to(self.device),
            extends=extends,
            decode=decode,
        )
        return prep

    def _extend_mask(self, prefix: int, n: int, window: int | None) -> torch.Tensor | None:
        """Query i (position prefix+i) sees key j iff j <= prefix+i (and, with a sliding window,
        prefix+i - j < window). None when that is plain causal attention over the new tokens."""
        if prefix == 0 and (window is None or n <= window):
            return None
        q_pos = torch.arange(prefix, prefix + n, device=self.device)[:, None]
        k_pos = torch.arange(prefix + n, device=self.device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= q_pos - k_pos < window
        return mask

    def _decode_mask(
        self, lengths: np.ndarray, max_len: int, window: int | None
    ) -> torch.Tensor | None:
        if window is None and bool((lengths == max_len).all()):
            return None
        k_pos = np.arange(max_len)[None, :]
        mask = k_pos < lengths[:, None]
        if window is not None:
            mask &= (lengths[:, None] - 1) - k_pos < window
        return torch.from_numpy(mask)[:, None, None, :].to(self.device)

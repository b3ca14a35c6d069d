"""The simulator's GPU cost model: a roofline step-time model, an optional calibration table,
and ``CostModelRunner``, the ``ModelRunner`` the simulator drives (no tensors, no torch).

Roofline step time
------------------
Symbols: ``L`` layers, ``H`` attention heads, ``D`` head dim, ``A`` active parameters,
``b`` dtype bytes, ``tp`` tensor-parallel degree. Per extend entry with ``P`` cached tokens and
``N`` new tokens, per decode entry with context ``c = position + 1`` (its KV plus the new one)::

    FLOPs   = 2*A*T                                   T = new tokens + decode entries
            + 4*L*H*D * ( sum_extend (N*P + N*(N+1)/2) + sum_decode c )
    bytes   = W(T)                                    weights read once per step
            + kv_gpu * tp * ( sum_extend (P + N) + sum_decode c )
    compute = FLOPs / (peak * mfu * tp) * (1 + T0 / T)        T0 = prefill_eff_tokens
    memory  = bytes / (hbm_bw * mbu * tp)
    host    = kv_gpu * (tokens loaded back from the host tier) / pcie_bw
    allred  = 2*L * (link_latency + 2*(tp-1)/tp * T*hidden*b / link_bw)      (0 at tp = 1)
    sched   = sched_step_s + sched_per_req_s * entries + sched_per_prefill_s * extends
    step    = max(compute, memory) + step_overhead_s + sched + allred + host

- ``2*A`` FLOPs per token cover every matmul (embedding and LM head included, a ~3% overcount
  for 8B models). Attention costs ``4*H*D`` FLOPs per layer per (query, key) pair (QK^T and
  PV); new tokens attend causally, hence ``N*(N+1)/2`` pairs among themselves.
- ``W(T)`` is every weight for dense models. For MoE models it is the shared weights plus the
  experts that ``T`` tokens touch on average under uniform routing:
  ``E * (1 - (1 - k/E)^T)`` of ``E`` experts with ``k`` per token (Mixtral: ``k=2, E=8``).
- ``kv_gpu = 2*L*ceil(KV/tp)*D*b`` is one token's KV on one GPU; KV heads are replicated
  when ``tp`` exceeds their count. For ``tp`` dividing the KV heads,
  ``kv_gpu*tp = kv_bytes_per_token = 2*L*KV*D*b`` (131,072 bytes for Llama-3.1-8B in bf16).
- Matmuls over ``T`` tokens reach ``mfu * T / (T + T0)`` of peak: small prefills do not reach
  the large-GEMM fraction (decode steps, with ``T`` = batch entries, are memory-bound anyway
  for ``T0`` well below the roofline's ridge point).
- Tensor parallelism: two all-reduces per layer (after attention and after the MLP) of the
  step's hidden states, ring cost over the GPU link plus a fixed latency per collective, not
  overlapped. Multi-head latent attention (DeepSeek) caches one latent per token and layer,
  replicated on every rank.
- Scheduler CPU time the step does not hide: a constant plus a term per batch entry and per
  prefill entry (admission, building the extend).
- Host-tier load-back overlaps nothing: its copy time is added to the step.
- ``request_latency_s`` (HTTP, tokenization, detokenization, first-chunk flush) is no part of
  a step: the simulator delays each request's arrival at the scheduler by it and reports
  client-side TTFT and E2E (``sim.arrivals``).
- ``request_serial_s``: the front end handles one request at a time, so requests sent
  together reach the scheduler that far apart: a closed loop's clients, whose requests all
  finish in one step, send again together, and the first of them is prefilled alone while the
  others are still being parsed (measured on ``radixsched serve``: a closed loop of 4 runs
  prefill batches of 1 then 3, every round; arriving together they would be one batch of 4).
- Not modelled: activations' memory traffic, sampling, CUDA-graph padding, the LM head being
  run only on the last prefill token, all-reduce overlap with compute.

Constants (``CostModel`` fields; hardware numbers are in ``sim/presets.py``)
---------------------------------------------------------------------------
- ``mfu = 0.55``: achievable fraction of dense bf16 peak in prefill. A rounded choice: large
  bf16 GEMMs run at roughly 70-80% of peak on H100-class GPUs, and whole-model prefill loses
  more to attention kernels, norms and element-wise ops.
- ``mbu = 0.80``: achievable fraction of HBM bandwidth in decode. A rounded choice: streaming
  copies reach about 90% of the datasheet bandwidth; decode steps (skinny GEMMs, paged
  attention) lose more.
- ``step_overhead_s = 0.001``: per-step time the GPU does not hide (kernel launches and
  sampling under CUDA graphs, scheduler work an overlap scheduler leaves exposed). With the
  defaults a batch-1 Llama-3.1-8B decode step on an H100 takes 7.0 ms (143 tokens/s), of
  which the weight read at full datasheet bandwidth is 4.8 ms. Use ``--calibration`` when
  measured numbers are at hand.
- ``prefill_eff_tokens = 0`` (off): uncalibrated step times stay those of release 0.1.0
  (``tests/test_golden.py`` replays them bit for bit). GEMMs below a few hundred rows lose
  tiles and waves; a measured value (``radixsched calibrate`` fits it) is typically tens to a
  few hundred tokens, and 64 would keep 8,192-token chunks within 1% of ``mfu``.
- ``sched_step_s = sched_per_req_s = sched_per_prefill_s = 0``, ``request_latency_s = 0`` and
  ``request_serial_s = 0``:
  an overlap scheduler hides most CPU time and a client's own latency is unknown; uncalibrated
  predictions are optimistic by those amounts. ``radixsched calibrate`` fits them.
- ``mem_fraction_static = 0.88``: SGLang's flag: weights plus the KV pool may use this share
  of device memory; the rest is left to activations and CUDA graphs.

KV capacity: ``(memory_bytes * mem_fraction_static - W_total / tp) / kv_gpu`` tokens (for
``tp`` dividing the KV heads this is SGLang's ``(mem*tp*f - weights) / kv_bytes_per_token``),
or ``max_total_tokens`` when set. A model whose weights do not fit raises ``CostModelError``.

Calibration (``--calibration FILE``)
------------------------------------
A table of measured step times: CSV with a header, a JSON list of objects (or
``{"rows": [...]}``), or JSON Lines. Columns: ``kind`` (``prefill`` | ``decode``),
``batch_size``, ``num_tokens`` (new tokens of a prefill batch without cached prefix; the total
context tokens of a decode batch), ``ms``. Other columns are ignored. Lookup ``T(kind, B, n)``:

- Within a measured batch size, linear in tokens. Between two measured batch sizes, linear
  in batch size between the two rows' values.
- Outside a row's token range, or beyond the smallest/largest batch size, the roofline
  (batches of equal requests) is scaled by the measured/roofline ratio at the nearest measured
  point, so the curve is continuous at the table's edge and keeps the roofline's shape.
- A prefill step is ``T(prefill, entries, new tokens)`` plus the roofline's compute time of
  attention over cached prefixes (the table is measured without them). A mixed step counts its
  decode entries as one-token prefill entries and adds the roofline's memory time of their KV
  reads. A decode step is ``T(decode, entries, context tokens)``. Host load-back is added as
  in the roofline. If the table has no row of the kind a step needs, that step uses the roofline.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from radixsched.fast.runner import MultiDecodeResult, MultiStepRunner
from radixsched.request import Req, SlotArray
from radixsched.runner import Batch, ExtendEntry, StepResult
from radixsched.sim.presets import GPUSpec, ModelSpec, PresetError, get_gpu

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
StepKind = Literal["prefill", "decode"]


DEFAULT_MFU = 0.55
DEFAULT_MBU = 0.80
DEFAULT_STEP_OVERHEAD_S = 0.001
DEFAULT_MEM_FRACTION_STATIC = 0.88
DEFAULT_PREFILL_EFF_TOKENS = 0.0
DEFAULT_SCHED_STEP_S = 0.0
DEFAULT_SCHED_PER_REQ_S = 0.0
DEFAULT_SCHED_PER_PREFILL_S = 0.0
DEFAULT_REQUEST_LATENCY_S = 0.0
DEFAULT_REQUEST_SERIAL_S = 0.0

# Up to this many decode steps, a dense model's step times are a Python loop (cheaper than
# the arrays' fixed cost); more steps are evaluated on arrays. Both give the same floats.
_DECODE_LOOP_MAX_STEPS = 16


class CostModelError(ValueError):
    """The configuration cannot run (bad numbers, a model that does not fit)."""


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class StepShape:
    """Everything a step's time depends on, as exact integers. ``decode_ctx`` holds one value
    per step so that ``num_steps`` decode steps of one batch share a single evaluation."""

    num_extend: int = 0
    extend_tokens: int = 0  # new tokens over extend entries
    extend_attn_pairs: int = 0  # sum N*P + N*(N+1)/2: (query, key) pairs of extend attention
    extend_prefix_pairs: int = 0  # sum N*P: the pairs against cached prefixes
    extend_kv_tokens: int = 0  # sum P + N: KV the extends touch
    host_load_tokens: int = 0
    num_decode: int = 0
    decode_ctx: IntArray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))

    @property
    def num_tokens(self) -> int:
        return self.extend_tokens + self.num_decode

    @property
    def num_steps(self) -> int:
        return len(self.decode_ctx)


def _extend_sums(extend: Sequence[ExtendEntry]) -> tuple[int, int, int, int, int]:
    """``StepShape``'s extend fields of ``extend``: new tokens, attention pairs, prefix pairs,
    KV tokens, host-loaded tokens (``shape_of`` and ``CostModelRunner.forward`` share it)."""
    attn = prefix_pairs = kv = host = new = 0
    for e in extend:
        # Tokens loaded back from the host tier are copied, not computed: they count as prefix.
        h = e.host_load_len
        n, p = e.num_new - h, e.prefix_len + h
        new += n
        attn += n * p + n * (n + 1) // 2
        prefix_pairs += n * p
        kv += p + n
        host += e.host_load_len
    return new, attn, prefix_pairs, kv, host


def shape_of(batch: Batch) -> StepShape:
    """The ``StepShape`` of one forward pass over ``batch``."""
    if not batch.extend and not batch.decode:
        raise ValueError("empty batch")
    new, attn, prefix_pairs, kv, host = _extend_sums(batch.extend)
    ctx = sum(d.position + 1 for d in batch.decode)
    return StepShape(
        num_extend=len(batch.extend),
        extend_tokens=new,
        extend_attn_pairs=attn,
        extend_prefix_pairs=prefix_pairs,
        extend_kv_tokens=kv,
        host_load_tokens=host,
        num_decode=len(batch.decode),
        decode_ctx=np.array([ctx], dtype=np.int64),
    )


def decode_shape(seq_lens: IntArray, num_steps: int) -> StepShape:
    """``num_steps`` decode steps of requests whose lengths before the first step are
    ``seq_lens``: step ``k`` reads ``seq_len + k`` tokens of context per request."""
    b = len(seq_lens)
    total = int(np.asarray(seq_lens, dtype=np.int64).sum())
    ctx = total + np.arange(num_steps, dtype=np.int64) * b
    return StepShape(num_decode=b, decode_ctx=ctx)


class StepCostModel(Protocol):
    """What ``CostModelRunner`` and the simulator need from a cost model."""

    @property
    def gpu(self) -> GPUSpec: ...

    @property
    def model(self) -> ModelSpec: ...

    @property
    def tp(self) -> int: ...

    def kv_capacity_tokens(self) -> int: ...

    def step_times(self, shape: StepShape) -> FloatArray: ...

    def step_time(self, batch: Batch) -> float: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CostModel:
    """Roofline step-time model (see the module docstring for every formula and constant).
    ``load_cost_model`` builds one from preset names."""

    gpu: GPUSpec
    model: ModelSpec
    tp: int = 1
    mfu: float = DEFAULT_MFU
    mbu: float = DEFAULT_MBU
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC
    max_total_tokens: int | None = None  # KV pool size override (tokens)
    # Tokens at which a step's matmuls reach half of ``mfu`` (0: always ``mfu``).
    prefill_eff_tokens: float = DEFAULT_PREFILL_EFF_TOKENS
    sched_step_s: float = DEFAULT_SCHED_STEP_S  # scheduler CPU time per step, exposed
    sched_per_req_s: float = DEFAULT_SCHED_PER_REQ_S  # ... plus this per batch entry
    # ... plus this per prefill (extend) entry: admitting a request, building its extend
    sched_per_prefill_s: float = DEFAULT_SCHED_PER_PREFILL_S
    # Outside the GPU step (HTTP, tokenization, detokenization, first-chunk flush): added to
    # every request's TTFT and E2E by the simulator, not to any step.
    request_latency_s: float = DEFAULT_REQUEST_LATENCY_S
    # The server's front end (HTTP parsing, tokenization) takes each request for this long, one
    # at a time: requests reach the scheduler no closer together (``sim.arrivals``).
    request_serial_s: float = DEFAULT_REQUEST_SERIAL_S

    def __post_init__(self) -> None:
        heads = self.model.num_heads
        if self.tp < 1 or heads % self.tp:
            raise CostModelError(
                f"tp={self.tp} must be >= 1 and divide {self.model.name}'s {heads} heads"
            )
        for name in ("mfu", "mbu", "mem_fraction_static"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise CostModelError(f"{name} must be in (0, 1], got {value}")
        for name in (
            "step_overhead_s",
            "prefill_eff_tokens",
            "sched_step_s",
            "sched_per_req_s",
            "sched_per_prefill_s",
            "request_latency_s",
            "request_serial_s",
        ):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise CostModelError(f"{name} must be a finite number >= 0, got {value}")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise CostModelError(f"max_total_tokens must be >= 1, got {self.max_total_tokens}")

    # ---- derived constants (cached: the hot path reads them every step) ----------------
    @cached_property
    def kv_bytes_per_token_per_gpu(self) -> int:
        m = self.model
        if m.mla_kv_dim:  # one latent per token and layer, replicated on every rank
            return m.kv_bytes_per_token
        kv_heads = -(-m.num_kv_heads // self.tp)
        return 2 * m.num_layers * kv_heads * m.head_dim * m.kv_bytes

    @cached_property
    def _flops_per_s(self) -> float:
        return self.gpu.peak_flops * self.mfu * self.tp

    @cached_property
    def _bytes_per_s(self) -> float:
        return self.gpu.hbm_bw * self.mbu * self.tp

    @cached_property
    def _attn_flops_per_pair(self) -> float:
        m = self.model
        return float(4 * m.num_layers * m.num_heads * m.head_dim)

    def weight_bytes_read(self, num_tokens: int) -> float:
        """Weight bytes one step over ``num_tokens`` tokens reads (all GPUs together)."""
        if not self.model.is_moe:
            return self.model.weight_bytes
        return float(self._weight_bytes(np.array([num_tokens], dtype=np.float64))[0])

    def _weight_bytes(self, num_tokens: FloatArray) -> FloatArray:
        m = self.model
        if not m.is_moe:
            return np.full_like(num_tokens, m.weight_bytes)
        miss = 1.0 - m.experts_per_token / m.num_experts
        touched = m.num_experts * (1.0 - np.power(miss, num_tokens))
        result: FloatArray = (m.shared_params + touched * m.expert_params) * m.dtype_bytes
        return result

    def kv_capacity_tokens(self) -> int:
        if self.max_total_tokens is not None:
            return self.max_total_tokens
        m, g = self.model, self.gpu
        budget = g.memory_bytes * self.mem_fraction_static
        weights = m.weight_bytes / self.tp
        tokens = int((budget - weights) // self.kv_bytes_per_token_per_gpu)
        if tokens < 1:
            raise CostModelError(
                f"{m.name} does not fit: {weights / 1e9:.1f} GB of weights per GPU at tp={self.tp} "
                f"exceed {budget / 1e9:.1f} GB ({self.mem_fraction_static:.2f} of "
                f"{g.memory_bytes / 1e9:.1f} GB on {g.name}); raise --tp or use a bigger GPU"
            )
        return tokens

    # ---- step time ---------------------------------------------------------------------
    def step_times(self, shape: StepShape) -> FloatArray:
        """Modelled seconds of each step in ``shape`` (one per ``decode_ctx`` entry).

        Every operation is element-wise over steps, so a step's time does not depend on how
        many steps are evaluated together (``decode_multi`` relies on that equality)."""
        tokens = shape.num_tokens
        entries = shape.num_extend + shape.num_decode
        if len(shape.decode_ctx) == 1 and self._dense:
            # One step (every forward): the same operations on Python floats, which round
            # exactly like float64 arrays, without the array overhead.
            ctx = int(shape.decode_ctx[0])
            one = self._dense_step_s(
                tokens,
                shape.extend_attn_pairs + ctx,
                shape.extend_kv_tokens + ctx,
                shape.host_load_tokens,
                entries,
                shape.num_extend,
            )
            return np.array([one], dtype=np.float64)
        pairs = shape.extend_attn_pairs + shape.decode_ctx
        kv_tokens = shape.extend_kv_tokens + shape.decode_ctx
        linear = 2.0 * self.model.active_params * tokens
        compute = (linear + self._attn_flops_per_pair * pairs) / self._flops_per_s
        compute = compute * self._efficiency_factor(tokens)
        weight_bytes = self.weight_bytes_read(tokens)
        kv_bytes = kv_tokens * float(self.kv_bytes_per_token_per_gpu * self.tp)
        memory = (weight_bytes + kv_bytes) / self._bytes_per_s
        fixed = self._fixed_s(tokens, entries, shape.host_load_tokens, shape.num_extend)
        return np.maximum(compute, memory) + fixed

    def min_step_s(self) -> float:
        """A floor under every step's modelled time (0.0: none to rely on): a step reads at
        least the dense weights (a MoE step its shared ones) and adds the fixed overhead and
        the scheduler's per-step time; its other terms are never negative (the constants are
        checked; a GPU's link terms must be). 1% under, so that step times summed on a large
        clock never round below a multiple of it."""
        m, g = self.model, self.gpu
        weights = max(m.shared_params * m.dtype_bytes if m.is_moe else m.weight_bytes, 0.0)
        floor = 0.99 * (weights / self._bytes_per_s + self.step_overhead_s + self.sched_step_s)
        links_ok = g.link_latency_s >= 0 and g.link_bw > 0 and g.pcie_bw > 0
        return floor if links_ok and math.isfinite(floor) and floor >= 1e-6 else 0.0

    @cached_property
    def _dense(self) -> bool:
        return not self.model.is_moe

    @cached_property
    def _dense_weight_bytes(self) -> float:
        return self.model.weight_bytes

    @cached_property
    def _linear_flops_per_token(self) -> float:
        return 2.0 * self.model.active_params

    @cached_property
    def _kv_bytes_all_gpus(self) -> float:
        return float(self.kv_bytes_per_token_per_gpu * self.tp)

    def _dense_step_s(
        self,
        tokens: int,
        pairs: int,
        kv_tokens: int,
        host_tokens: int,
        entries: int,
        extends: int = 0,
    ) -> float:
        """One step of a dense model on Python floats: ``tokens`` new tokens plus decode
        entries, ``pairs`` attention pairs and ``kv_tokens`` KV tokens (decode context
        included), ``host_tokens`` loaded back from the host tier, ``entries`` batch entries
        of which ``extends`` are extends.
        The operations, in their order, of ``step_times`` on arrays, so the result is the
        same float."""
        compute = (
            self._linear_flops_per_token * tokens + self._attn_flops_per_pair * pairs
        ) / self._flops_per_s
        compute = compute * self._efficiency_factor(tokens)
        memory = (
            self._dense_weight_bytes + kv_tokens * self._kv_bytes_all_gpus
        ) / self._bytes_per_s
        return max(compute, memory) + self._fixed_s(tokens, entries, host_tokens, extends)

    def _efficiency_factor(self, tokens: int) -> float:
        """``mfu / efficiency(tokens)``: matmuls over ``T`` tokens reach
        ``mfu * T / (T + prefill_eff_tokens)`` of peak."""
        return 1.0 + self.prefill_eff_tokens / max(tokens, 1)

    def allreduce_s(self, tokens: int) -> float:
        """Tensor-parallel all-reduces of one step: two per layer (after attention and after
        the MLP) of ``tokens`` hidden states, ring cost ``2 (tp-1)/tp`` of the message over
        the GPU link plus the link's fixed latency each; 0 at ``tp == 1``."""
        if self.tp == 1:
            return 0.0
        m, g = self.model, self.gpu
        message = tokens * m.hidden_size * m.kv_bytes
        one = g.link_latency_s + 2.0 * (self.tp - 1) / self.tp * message / g.link_bw
        return 2.0 * m.num_layers * one

    def _fixed_s(self, tokens: int, entries: int, host_tokens: int, extends: int = 0) -> float:
        """What a step adds beyond its compute or memory time: exposed overhead, scheduler
        CPU time, all-reduces, host-tier load-back (one Python float for both paths)."""
        host = host_tokens * self.kv_bytes_per_token_per_gpu / self.gpu.pcie_bw
        sched = (
            self.sched_step_s + self.sched_per_req_s * entries + self.sched_per_prefill_s * extends
        )
        return self.step_overhead_s + sched + self.allreduce_s(tokens) + host

    @cached_property
    def _finite_rates(self) -> bool:
        """Every constant of ``_dense_step_s`` finite and both rates positive: no division by
        zero (an error on Python floats, ``inf`` on arrays) and no NaN (which ``max`` and
        ``np.maximum`` treat differently), so a loop of ``_dense_step_s`` over several steps
        gives the array path's floats."""
        consts = (
            self._flops_per_s,
            self._bytes_per_s,
            self._attn_flops_per_pair,
            self._linear_flops_per_token,
            self._dense_weight_bytes,
            self._kv_bytes_all_gpus,
        )
        positive = self._flops_per_s > 0 and self._bytes_per_s > 0
        return positive and all(math.isfinite(c) for c in consts)

    def _decode_times(self, num_decode: int, total_ctx: int, num_steps: int) -> FloatArray:
        """``step_times(decode_shape(seq_lens, num_steps))`` for ``num_decode`` requests whose
        lengths sum to ``total_ctx``: for a dense model one step is ``step_times``' own
        scalar branch, a few steps a loop of it when ``_finite_rates`` (the same floats,
        without the arrays' fixed cost)."""
        step, b = self._dense_step_s, num_decode
        if self._dense and num_steps == 1:
            return np.array([step(b, total_ctx, total_ctx, 0, b)], dtype=np.float64)
        if self._dense and self._finite_rates and num_steps <= _DECODE_LOOP_MAX_STEPS:
            ctxs = [total_ctx + k * b for k in range(num_steps)]
            return np.array([step(b, c, c, 0, b) for c in ctxs], dtype=np.float64)
        ctx = total_ctx + np.arange(num_steps, dtype=np.int64) * b
        return self.step_times(StepShape(num_decode=b, decode_ctx=ctx))

    def _host_s(self, shape: StepShape) -> float:
        return shape.host_load_tokens * self.kv_bytes_per_token_per_gpu / self.gpu.pcie_bw

    def step_time(self, batch: Batch) -> float:
        return float(self.step_times(shape_of(batch))[0])

    def step_terms(self, shape: StepShape) -> tuple[float, float, int, int, float]:
        """The pieces of one step's time that calibration fits separately: compute seconds
        at ``mfu = 1`` without the efficiency factor, memory seconds at ``mbu = 1``, tokens,
        batch entries, and the fixed seconds no fitted constant scales (all-reduces,
        host load-back, ``sched_step_s``). One step: ``decode_ctx[0]``."""
        ctx = int(shape.decode_ctx[0])
        tokens = shape.num_tokens
        pairs = shape.extend_attn_pairs + ctx
        linear = 2.0 * self.model.active_params * tokens
        compute = (linear + self._attn_flops_per_pair * pairs) / (self.gpu.peak_flops * self.tp)
        kv = (shape.extend_kv_tokens + ctx) * float(self.kv_bytes_per_token_per_gpu * self.tp)
        memory = (self.weight_bytes_read(tokens) + kv) / (self.gpu.hbm_bw * self.tp)
        host = shape.host_load_tokens * self.kv_bytes_per_token_per_gpu / self.gpu.pcie_bw
        other = self.allreduce_s(tokens) + host + self.sched_step_s
        return compute, memory, tokens, shape.num_extend + shape.num_decode, other

    def step_extends(self, shape: StepShape) -> int:
        return shape.num_extend

    def reference_times(
        self, kind: StepKind, batch_size: int, num_tokens: FloatArray
    ) -> FloatArray:
        """Roofline time of a batch of ``batch_size`` equal requests: ``num_tokens`` new tokens
        without cached prefix (prefill) or ``num_tokens`` context tokens in all (decode)."""
        n = np.asarray(num_tokens, dtype=np.float64)
        if kind == "prefill":
            tokens = n
            pairs = n * (n / batch_size + 1.0) / 2.0
        else:
            tokens = np.full_like(n, float(batch_size))
            pairs = n
        weights = self._weight_bytes(tokens)
        linear = 2.0 * self.model.active_params * tokens
        compute = (linear + self._attn_flops_per_pair * pairs) / self._flops_per_s
        compute = compute * (1.0 + self.prefill_eff_tokens / np.maximum(tokens, 1.0))
        memory = (
            weights + n * float(self.kv_bytes_per_token_per_gpu * self.tp)
        ) / self._bytes_per_s
        fixed = np.array(
            [
                self._fixed_s(int(t), batch_size, 0, batch_size if kind == "prefill" else 0)
                for t in np.atleast_1d(tokens)
            ],
            dtype=np.float64,
        ).reshape(np.shape(tokens))
        result: FloatArray = np.maximum(compute, memory) + fixed
        return result

    def prefix_attention_s(self, shape: StepShape) -> float:
        """Compute time of extend attention against cached prefixes."""
        return self._attn_flops_per_pair * shape.extend_prefix_pairs / self._flops_per_s

    def decode_kv_read_s(self, shape: StepShape) -> FloatArray:
        """Memory time of reading the decode entries' KV, per step."""
        per_token = float(self.kv_bytes_per_token_per_gpu * self.tp)
        result: FloatArray = shape.decode_ctx.astype(np.float64) * per_token / self._bytes_per_s
        return result

    def describe(self) -> dict[str, Any]:
        m, g = self.model, self.gpu
        return {
            "cost_model": "roofline",
            "gpu": g.name,
            "model": m.name,
            "tp": self.tp,
            "mfu": self.mfu,
            "mbu": self.mbu,
            "step_overhead_s": self.step_overhead_s,
            "prefill_eff_tokens": self.prefill_eff_tokens,
            "sched_step_s": self.sched_step_s,
            "sched_per_req_s": self.sched_per_req_s,
            "sched_per_prefill_s": self.sched_per_prefill_s,
            "request_latency_s": self.request_latency_s,
            "request_serial_s": self.request_serial_s,
            "link_bw": self.gpu.link_bw,
            "link_latency_s": self.gpu.link_latency_s,
            "mem_fraction_static": self.mem_fraction_static,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "kv_capacity_tokens": self.kv_capacity_tokens(),
        }


# ---- calibration -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    batch_size: int
    tokens: FloatArray  # ascending
    seconds: FloatArray


@dataclass(frozen=True)
class CalibrationTable:
    """Measured step times by kind, then by batch size (rows sorted by batch size)."""

    rows: dict[str, tuple[_Row, ...]]
    source: str

    @property
    def num_points(self) -> int:
        return sum(len(r.tokens) for rows in self.rows.values() for r in rows)


_COLUMNS = ("kind", "batch_size", "num_tokens", "ms")


def _parse_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool):
        raise CalibrationError(
            f"{where}: field {name!r}: expected a positive integer, got {value!r}"
        )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CalibrationError(
            f"{where}: field {name!r}: expected a positive integer, got {value!r}"
        ) from None
    if not number.is_integer() or number < 1:
        raise CalibrationError(
            f"{where}: field {name!r}: expected a positive integer, got {value!r}"
        )
    return int(number)


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(location, record) pairs in file order; location is ``file:line`` or ``file: row N``."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CalibrationError(f"{name}: cannot read calibration file: {exc.strerror}") from None
    suffix = path.suffix.lower()
    if suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CalibrationError(f"{name}:1: missing column(s) {', '.join(missing)}")
        # ``line_num`` counts physical lines read so far, i.e. this row's 1-based line.
        return [(f"{name}:{reader.line_num}", dict(row)) for row in reader]
    if suffix == ".jsonl":
        out: list[tuple[str, dict[str, Any]]] = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CalibrationError(f"{name}:{i}: invalid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise CalibrationError(f"{name}:{i}: expected a JSON object")
            out.append((f"{name}:{i}", obj))
        return out
    if suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"{name}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        if isinstance(doc, dict) and "rows" in doc:
            doc = doc["rows"]
        if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
            raise CalibrationError(f"{name}: expected a list of objects (or {{'rows': [...]}})")
        return [(f"{name}: row {i}", r) for i, r in enumerate(doc, 1)]
    raise CalibrationError(
        f"{name}: unknown calibration format {suffix!r} (use .csv, .json, .jsonl)"
    )


def load_calibration(path: str | Path) -> CalibrationTable:
    """Read and validate a calibration table (format in the module docstring)."""
    path = Path(path)
    return _table_from_records(_records(path), str(path))


def _records_from_rows(rows: Any, source: str) -> CalibrationTable:
    """A table from the ``rows`` list of a calibration document."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise CalibrationError(f"{source}: 'rows' must be a list of objects")
    return _table_from_records([(f"{source}: row {i}", r) for i, r in enumerate(rows, 1)], source)


def _table_from_records(records: list[tuple[str, dict[str, Any]]], source: str) -> CalibrationTable:
    points: dict[tuple[str, int], dict[int, tuple[float, str]]] = {}
    for where, rec in records:
        for col in _COLUMNS:
            if rec.get(col) in (None, ""):
                raise CalibrationError(f"{where}: missing field {col!r}")
        kind = str(rec["kind"]).strip().lower()
        if kind not in ("prefill", "decode"):
            raise CalibrationError(
                f"{where}: field 'kind': expected 'prefill' or 'decode', got {rec['kind']!r}"
            )
        b = _parse_int(rec["batch_size"], where, "batch_size")
        n = _parse_int(rec["num_tokens"], where, "num_tokens")
        try:
            ms = float(rec["ms"])
        except (TypeError, ValueError):
            ms = math.nan
        if not math.isfinite(ms) or ms <= 0:
            raise CalibrationError(
                f"{where}: field 'ms': expected a positive number, got {rec['ms']!r}"
            )
        row = points.setdefault((kind, b), {})
        if n in row:
            raise CalibrationError(
                f"{where}: duplicate point (kind={kind}, batch_size={b}, num_tokens={n}); "
                f"first given at {row[n][1]}"
            )
        row[n] = (ms / 1e3, where)
    if not points:
        raise CalibrationError(f"{source}: calibration table has no rows")
    rows: dict[str, list[_Row]] = {}
    for (kind, b), pts in sorted(points.items()):
        ns = sorted(pts)
        rows.setdefault(kind, []).append(
            _Row(
                b,
                np.array(ns, dtype=np.float64),
                np.array([pts[n][0] for n in ns], dtype=np.float64),
            )
        )
    return CalibrationTable({k: tuple(v) for k, v in rows.items()}, source)


@dataclass(frozen=True)
class CalibratedCostModel:
    """Step times from a measured table, the roofline ``base`` filling the gaps (rules in
    the module docstring). Capacity and presets come from ``base``."""

    base: CostModel
    table: CalibrationTable

    @property
    def gpu(self) -> GPUSpec:
        return self.base.gpu

    @property
    def model(self) -> ModelSpec:
        return self.base.model

    @property
    def tp(self) -> int:
        return self.base.tp

    def kv_capacity_tokens(self) -> int:
        return self.base.kv_capacity_tokens()

    def _row_value(self, kind: StepKind, row: _Row, n: FloatArray) -> FloatArray:
        clamped = np.clip(n, row.tokens[0], row.tokens[-1])
        measured = np.interp(clamped, row.tokens, row.seconds)
        ref = self.base.reference_times
        result: FloatArray = measured * (
            ref(kind, row.batch_size, n) / ref(kind, row.batch_size, clamped)
        )
        return result

    def lookup(self, kind: StepKind, batch_size: int, num_tokens: FloatArray) -> FloatArray:
        """``T(kind, batch_size, n)`` for each ``n``; the kind must have rows."""
        rows = self.table.rows[kind]
        n = np.asarray(num_tokens, dtype=np.float64)
        sizes = [r.batch_size for r in rows]
        i = bisect_left(sizes, batch_size)
        if i < len(sizes) and sizes[i] == batch_size:
            return self._row_value(kind, rows[i], n)
        if i == 0 or i == len(sizes):
            near = rows[0] if i == 0 else rows[-1]
            ref = self.base.reference_times
            scaled: FloatArray = self._row_value(kind, near, n) * (
                ref(kind, batch_size, n) / ref(kind, near.batch_size, n)
            )
            return scaled
        lo, hi = rows[i - 1], rows[i]
        w = (batch_size - lo.batch_size) / (hi.batch_size - lo.batch_size)
        mixed: FloatArray = (1.0 - w) * self._row_value(kind, lo, n) + w * self._row_value(
            kind, hi, n
        )
        return mixed

    def step_times(self, shape: StepShape) -> FloatArray:
        host = self.base._host_s(shape)
        if shape.num_extend == 0:
            if "decode" not in self.table.rows:
                return self.base.step_times(shape)
            ctx = shape.decode_ctx.astype(np.float64)
            result: FloatArray = self.lookup("decode", shape.num_decode, ctx) + host
            return result
        if "prefill" not in self.table.rows:
            return self.base.step_times(shape)
        entries = shape.num_extend + shape.num_decode
        tokens = np.full(shape.num_steps, float(shape.extend_tokens + shape.num_decode))
        t = self.lookup("prefill", entries, tokens) + self.base.prefix_attention_s(shape)
        if shape.num_decode:
            t = t + self.base.decode_kv_read_s(shape)
        out: FloatArray = t + host
        return out

    def step_time(self, batch: Batch) -> float:
        return float(self.step_times(shape_of(batch))[0])

    def describe(self) -> dict[str, Any]:
        info = self.base.describe()
        info["cost_model"] = "calibrated"
        info["calibration"] = self.table.source
        info["calibration_points"] = self.table.num_points
        return info


# Constants a calibration file may set (``sim.calibration_file``), by ``CostModel`` field.
CONSTANTS: dict[str, float] = {
    "mfu": DEFAULT_MFU,
    "mbu": DEFAULT_MBU,
    "step_overhead_s": DEFAULT_STEP_OVERHEAD_S,
    "prefill_eff_tokens": DEFAULT_PREFILL_EFF_TOKENS,
    "sched_step_s": DEFAULT_SCHED_STEP_S,
    "sched_per_req_s": DEFAULT_SCHED_PER_REQ_S,
    "sched_per_prefill_s": DEFAULT_SCHED_PER_PREFILL_S,
    "request_latency_s": DEFAULT_REQUEST_LATENCY_S,
    "request_serial_s": DEFAULT_REQUEST_SERIAL_S,
}


def resolve_specs(
    gpu: str, model: str, context_length: int | None = None
) -> tuple[GPUSpec, ModelSpec]:
    """The GPU and model specs for names (presets, or a config.json path for the model),
    with the model's context limit replaced by ``context_length`` when given."""
    from radixsched.sim.hfconfig import resolve_model

    try:
        gpu_spec, model_spec = get_gpu(gpu), resolve_model(model)
    except PresetError as exc:
        raise CostModelError(str(exc)) from None
    if context_length is not None:
        if context_length < 2:
            raise CostModelError(f"context_length must be >= 2, got {context_length}")
        model_spec = dataclasses.replace(model_spec, max_context_len=context_length)
    return gpu_spec, model_spec


def load_cost_model(
    *,
    gpu: str = "H100",
    model: str = "llama-3.1-8b",
    tp: int = 1,
    mfu: float | None = None,
    mbu: float | None = None,
    step_overhead_s: float | None = None,
    prefill_eff_tokens: float | None = None,
    sched_step_s: float | None = None,
    sched_per_req_s: float | None = None,
    sched_per_prefill_s: float | None = None,
    request_latency_s: float | None = None,
    request_serial_s: float | None = None,
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC,
    max_total_tokens: int | None = None,
    context_length: int | None = None,
    calibration: str | Path | None = None,
) -> CostModel | CalibratedCostModel:
    """The roofline model for preset names (case-insensitive) or a model's config.json.
    Constants left None take the calibration file's value (a fitted-constants file from
    ``radixsched calibrate``), else the defaults; a step-time table in the file (or a plain
    table file) calibrates step times. Raises ``CostModelError`` (unknown preset, bad numbers,
    a model that does not fit) or ``CalibrationError`` (a bad file); both are ``ValueError``s."""
    from radixsched.sim.calibration_file import read_calibration

    gpu_spec, model_spec = resolve_specs(gpu, model, context_length)
    cal = None if calibration is None else read_calibration(calibration)
    given = {
        "mfu": mfu,
        "mbu": mbu,
        "step_overhead_s": step_overhead_s,
        "prefill_eff_tokens": prefill_eff_tokens,
        "sched_step_s": sched_step_s,
        "sched_per_req_s": sched_per_req_s,
        "sched_per_prefill_s": sched_per_prefill_s,
        "request_latency_s": request_latency_s,
        "request_serial_s": request_serial_s,
    }
    constants = dict(CONSTANTS)
    if cal is not None:
        constants.update(cal.constants)
    constants.update({k: v for k, v in given.items() if v is not None})
    base = CostModel(
        gpu_spec,
        model_spec,
        tp=tp,
        mem_fraction_static=mem_fraction_static,
        max_total_tokens=max_total_tokens,
        **constants,
    )
    base.kv_capacity_tokens()  # fail now, with the reason, if the model does not fit
    if cal is None or cal.table is None:
        return base
    return CalibratedCostModel(base, cal.table)


# ---- the runner ------------------------------------------------------------------------


_GOLDEN_INT = 0x9E3779B97F4A7C15
_MIX1_INT, _MIX2_INT = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(_GOLDEN_INT)
_MIX1, _MIX2 = np.uint64(_MIX1_INT), np.uint64(_MIX2_INT)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)
# The same constants as 0-d arrays: a ufunc takes them faster than numpy scalars.
_GOLDEN_0D, _MIX1_0D, _MIX2_0D = (np.array(c, dtype=np.uint64) for c in (_GOLDEN, _MIX1, _MIX2))
_S27_0D, _S30_0D, _S31_0D = (np.array(c, dtype=np.uint64) for c in (_S27, _S30, _S31))
# Vocabularies up to this size hold every token in an int32 without wrapping.
_INT32_VOCAB = 1 << 31
# Up to this many tokens of plain requests, ``tokens_at`` mixes on Python ints (cheaper than
# the arrays' fixed cost of about 7 us).
_SCALAR_MAX_TOKENS = 12
_RID_MEMO_SIZE = 1 << 16


def splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """A strong 64-bit mixer (wrapping uint64 arithmetic on arrays), used for hashed tokens."""
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    result: npt.NDArray[np.uint64] = z ^ (z >> _S31)
    return result


def _splitmix64_inplace(z: npt.NDArray[np.uint64]) -> None:
    """``z[...] = splitmix64(z)`` for a uint64 array, with one temporary instead of seven."""
    np.add(z, _GOLDEN_0D, out=z)
    t = np.right_shift(z, _S30_0D)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _MIX1_0D, out=z)
    np.right_shift(z, _S27_0D, out=t)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _MIX2_0D, out=z)
    np.right_shift(z, _S31_0D, out=t)
    np.bitwise_xor(z, t, out=z)


def _splitmix64_int(x: int) -> int:
    """``splitmix64`` of one value in ``[0, 2**64)`` on Python ints, masked to 64 bits after
    every operation that can carry past them: the same value as the uint64 array path."""
    z = (x + _GOLDEN_INT) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1_INT) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2_INT) & _MASK64
    return z ^ (z >> 31)


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


@lru_cache(maxsize=1 << 16)
def _rid_hash(rid: str, seed: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{rid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class _RidHashes(dict[str, int]):
    """``rid -> _rid_hash(rid, seed)`` for one seed, filled on first use and emptied when it
    reaches ``_RID_MEMO_SIZE`` entries (a plain dict lookup is the cheapest per-request read)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed

    def __missing__(self, rid: str) -> int:
        if len(self) >= _RID_MEMO_SIZE:
            self.clear()
        h = self[rid] = _rid_hash(rid, self.seed)
        return h


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

    def __init__(
        self, cost: StepCostModel, *, seed: int = 0, vocab_size: int | None = None
    ) -> None:
        self.cost = cost
        self.seed = seed
        self.vocab_size = vocab_size or cost.model.vocab_size
        if self.vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        self._rid_hashes = _RidHashes(seed)

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
        cost = self._dense_roofline()
        if cost is not None:  # decode_shape's total context, then the steps on Python floats
            return cost._decode_times(len(lens), int(np.add.reduce(lens, axis=None)), num_steps)
        return self.cost.step_times(decode_shape(lens, num_steps)).astype(np.float64)

    def eos_token_ids(self) -> tuple[int, ...]:
        return ()

    def offload_kv(self, req: Req, slots: SlotArray) -> None:
        """Nothing to keep: modelled KV has no content (the copy is not timed). With
        ``reload_kv``, what a decode instance's runner offers (``cluster.disagg``)."""

    def reload_kv(self, req: Req, slots: SlotArray) -> None:
        """Nothing to write back (see ``offload_kv``)."""

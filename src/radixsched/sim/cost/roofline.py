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
  client-side TTFT and E2E (``sim.deploy.closed_loop``).
- ``request_serial_s``: the front end handles one request at a time, so requests sent
  together reach the scheduler that far apart: a closed loop's clients, whose requests all
  finish in one step, send again together, and the first of them is prefilled alone while the
  others are still being parsed (measured on ``radixsched serve``: a closed loop of 4 runs
  prefill batches of 1 then 3, every round; arriving together they would be one batch of 4).
- Not modelled: activations' memory traffic, sampling, CUDA-graph padding, the LM head being
  run only on the last prefill token, all-reduce overlap with compute.

Constants (``CostModel`` fields; hardware numbers are in ``sim/cost/hardware.py``)
---------------------------------------------------------------------------
- ``mfu = 0.55``: achievable fraction of dense bf16 peak in prefill, for GPUs without a
  measured curve. A rounded choice: large bf16 GEMMs run at roughly 70-80% of peak on
  H100-class GPUs, and whole-model prefill loses more to attention kernels, norms and
  element-wise ops. H100, H200 and A100 have their own ``mfu`` and ``prefill_eff_tokens``
  (``sim.cost.hardware.PREFILL_CURVES``, from published GEMM and attention measurements).
- ``mbu = 0.80``: achievable fraction of HBM bandwidth in decode. A rounded choice: streaming
  copies reach about 90% of the datasheet bandwidth; decode steps (skinny GEMMs, paged
  attention) lose more.
- ``step_overhead_s = 0.001``: per-step time the GPU does not hide (kernel launches and
  sampling under CUDA graphs, scheduler work an overlap scheduler leaves exposed). With the
  defaults a batch-1 Llama-3.1-8B decode step on an H100 takes 7.0 ms (143 tokens/s), of
  which the weight read at full datasheet bandwidth is 4.8 ms. Use ``--calibration`` when
  measured numbers are at hand.
- ``prefill_eff_tokens = 0`` (off) for GPUs without a measured curve; 64 on H100 and H200
  (measured: ``bench/gpu_step_bench.py``), 128 on A100 (``PREFILL_CURVES``). GEMMs below a
  few hundred rows lose tiles and waves;
  ``radixsched calibrate`` fits it. ``tests/test_golden.py`` replays release 0.1.0's step
  times with that release's constants (``mfu`` 0.55, no size term, no front-end latency)
  given explicitly.
- ``sched_step_s = sched_per_req_s = sched_per_prefill_s = 0`` and ``request_serial_s = 0``:
  an overlap scheduler hides most CPU time; uncalibrated predictions are optimistic by those
  amounts. ``radixsched calibrate`` fits them.
- ``request_latency_s``: 0 here; the simulator takes the engine mode's published front-end
  time (``sim.settings.engine_modes.FRONTEND_LATENCY_S``: 8.5 ms SGLang, 10 ms vLLM) unless
  a flag or a calibration file gives one.
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
  in the roofline. If the table has no row of the kind a step needs, that step uses the roofline."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from radixsched.runner import Batch, ExtendEntry
from radixsched.sim.cost.hardware import GPUSpec, ModelSpec

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


class CostModelError(ValueError):
    """The configuration cannot run (bad numbers, a model that does not fit)."""


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
    # at a time: requests reach the scheduler no closer together (``sim.deploy.closed_loop``).
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
        ``np.maximum`` treat differently), so ``_dense_step_s`` on doubles, step after step,
        gives the array path's floats (``CostModelRunner.native_decode_cost``)."""
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


# Constants a calibration file may set (``sim.cost.calibration_file``), by ``CostModel`` field.
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

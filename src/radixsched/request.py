"""The request model: what the scheduler reads and writes about one generation request.

Stored state is kept minimal (prompt, output, how far the KV is materialised, where the cached
prefix ends); everything else is a derived property, so counters cannot drift apart.

KV row layout of a request (positions are token positions in ``prompt + output``)::

    [0, cache_protected_len)           slots owned by the radix cache, pinned by ``lock_node``
    [cache_protected_len, kv_len)      slots owned by this request (computed KV)
    [kv_len, len(kv_row))              allocated but not yet written (page tail / this extend)

``prefix_len`` is where the next extend starts; ``extend_end`` where the admitted extend ends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

TokenArray = npt.NDArray[np.int32]
SlotArray = npt.NDArray[np.int64]

EMPTY_TOKENS: TokenArray = np.zeros(0, dtype=np.int32)
EMPTY_SLOTS: SlotArray = np.zeros(0, dtype=np.int64)


def as_tokens(ids: Any) -> TokenArray:
    """Token ids as a compact int32 array (no copy when already one)."""
    arr = np.asarray(ids, dtype=np.int32)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be one-dimensional, got shape {arr.shape}")
    return arr


class FinishReason(enum.Enum):  # values are OpenAI's finish_reason strings
    LENGTH = "length"  # max_new_tokens reached
    STOP = "stop"  # a stop token id or EOS was generated
    ABORT = "abort"  # aborted by the client, the queue limit, preemption policy or an error


@dataclass(frozen=True)
class FinishState:
    reason: FinishReason
    message: str = ""
    # HTTP status a server should map this finish to (aborts only; None = success).
    status_code: int | None = None
    matched_token: int | None = None


FINISHED_BY_LENGTH = FinishState(FinishReason.LENGTH)  # shared by all such requests (frozen)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not 0 <= self.temperature < float("inf"):  # NaN and inf too
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


@dataclass(eq=False, slots=True)
class ReqTimes:
    """Timestamps on the scheduler's clock (virtual seconds in the simulator)."""

    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    finish: float | None = None
    # Time each output token was produced (len == len(output_ids) while the request runs).
    token_times: list[float] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class Req:
    """One generation request. Identity is the object (``eq=False``); ``rid`` names it."""

    rid: str
    prompt_ids: TokenArray
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: int | None = None
    routing_key: str | None = None
    extra_key: str | None = None
    cache_salt: str | None = None
    tenant: str | None = None
    arrival_time: float = 0.0
    # Tokens the workload says this request will generate (simulator only; None = stand-in).
    scripted_output: TokenArray | None = None

    # ---- scheduler state -------------------------------------------------------------
    output_ids: list[int] = field(default_factory=list)
    # (Re)entry into the waiting queue: clock value and the processed-prefill-token counter.
    queue_entry_time: float = 0.0
    queue_entry_processed_tokens: int = 0
    # Seniority kept across retraction/preemption (SGLang re-stamps them, so a request retracted
    # again and again can starve): the first entry's values. Compat-sglang overwrites them.
    retraction_count: int = 0
    preemption_count: int = 0

    # ---- cache / KV state -----------------------------------------------------------
    prefix_len: int = 0
    extend_end: int = 0
    cache_protected_len: int = 0
    cache_inserted_len: int = 0
    num_matched_prefix_tokens: int = 0  # device + host match, capped (policies sort on it)
    host_hit_len: int = 0
    last_node: Any = None  # opaque cache handle where the device match ended
    lock_node: Any = None  # node this request holds a lock on (None = no lock)
    kv_row: SlotArray = field(default_factory=lambda: EMPTY_SLOTS)
    # Backing store of kv_row with spare capacity (kv_row is a view of its head), so decode
    # growth is amortised O(1) per token instead of a copy of the whole row.
    kv_buf: SlotArray = field(default_factory=lambda: EMPTY_SLOTS)
    kv_len: int = 0  # positions [0, kv_len) of kv_row hold computed KV
    # Accelerator state (``radixsched.native``); the reference core never reads or writes it.
    fast: Any = field(default=None, repr=False, compare=False)

    finish: FinishState | None = None
    times: ReqTimes = field(default_factory=ReqTimes)
    # Per-request counters for metrics.
    cached_tokens: int = 0  # prompt tokens served from the cache at first admission
    host_cached_tokens: int = 0  # of which loaded from the host tier
    computed_prefill_tokens: int = 0  # tokens actually prefilled (recomputation included)
    # The fair policy's tenant: ``tenant``, else ``routing_key``, else "". Fixed at
    # construction (a plain slot: fair rounds read it for every queued and running request).
    tenant_key: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.prompt_ids = as_tokens(self.prompt_ids)
        if self.cache_salt == "":
            self.cache_salt = None
        if len(self.prompt_ids) == 0:
            raise ValueError(f"request {self.rid}: empty prompt")
        self.times.arrival = self.arrival_time
        self.tenant_key = self.tenant or self.routing_key or ""
        self.queue_entry_time = self.arrival_time

    # ---- derived lengths ------------------------------------------------------------
    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_len(self) -> int:
        return len(self.output_ids)

    @property
    def fill_len(self) -> int:
        """Length of prompt + output: what a (re)prefill has to cover."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.sampling.max_new_tokens - len(self.output_ids), 0)

    @property
    def max_new_tokens(self) -> int:
        return self.sampling.max_new_tokens

    @property
    def finished(self) -> bool:
        return self.finish is not None

    @property
    def namespace(self) -> tuple[str | None, str | None] | None:
        """Cache namespace: requests in different namespaces never share a prefix."""
        if self.extra_key is None and self.cache_salt is None:
            return None
        return (self.extra_key, self.cache_salt)

    def fill_ids(self) -> TokenArray:
        """Prompt + output as one array (the prompt itself while there is no output)."""
        if not self.output_ids:
            return self.prompt_ids
        return np.concatenate([self.prompt_ids, np.asarray(self.output_ids, dtype=np.int32)])

    def fill_slice(self, lo: int, hi: int) -> TokenArray:
        """``fill_ids()[lo:hi]``, building only the slice (a view while it lies in the prompt)."""
        prompt = self.prompt_ids
        n = len(prompt)
        if hi <= n:
            return prompt[lo:hi]
        tail = np.asarray(self.output_ids[max(lo - n, 0) : hi - n], dtype=np.int32)
        return np.concatenate([prompt[lo:], tail]) if lo < n else tail

    def max_prefix_len(self, length: int | None = None) -> int:
        """Cap on a usable match: the last token is always computed (it samples the next one)."""
        n = self.fill_len if length is None else length
        return max(n - 1, 0)

    def check_invariants(self) -> None:
        assert 0 <= self.cache_protected_len <= self.kv_len <= len(self.kv_row) or (
            self.kv_len == 0 and self.cache_protected_len == 0
        ), (self.rid, self.cache_protected_len, self.kv_len, len(self.kv_row))
        assert self.prefix_len <= self.extend_end <= self.fill_len, (
            self.rid,
            self.prefix_len,
            self.extend_end,
            self.fill_len,
        )
        assert len(self.output_ids) <= self.sampling.max_new_tokens or self.finished

    def __repr__(self) -> str:
        return (
            f"Req({self.rid!r}, prompt={self.prompt_len}, out={self.output_len}/"
            f"{self.sampling.max_new_tokens}, prefix={self.prefix_len}, finished={self.finished})"
        )

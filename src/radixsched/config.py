"""Frozen configuration for the scheduling layer, with SGLang's flag names.

One source of truth: the CLI flags of ``simulate``, ``serve`` and ``generate`` are generated
from these dataclasses (``add_config_args`` / ``config_from_args``), so defaults and help never
drift from the code.

Where radixsched deviates from SGLang 0.5.23 to fix a known flaw (a cliff, a starvation, waste),
``compat="sglang"`` restores SGLang's behaviour. Every such switch is listed in ``COMPAT_NOTES``
and in the README.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, Union

Compat = Literal["radixsched", "sglang"]
# SGLang's ``--disaggregation-mode``: a co-located scheduler, or one role of a split deployment.
DisaggregationModeName = Literal["null", "prefill", "decode"]

# Where we deviate from SGLang, and what ``--compat sglang`` restores (README links here).
COMPAT_NOTES: dict[str, str] = {
    "prefix-match cap": "lpm/hrrn fall back to fcfs above 128 waiting requests "
    "(radixsched: no cap unless --max-prefix-match-queue is set)",
    "tie-breaks": "hrrn ties break by request id and routing-key non-matching requests sort "
    "by key string (radixsched: by arrival; hrrn then by request id)",
    "random": "random.shuffle of the whole queue every round (radixsched: a front-to-back "
    "Fisher-Yates drawn only as far as admission reads: the same distribution, and a round "
    "that admits nothing draws nothing)",
    "in-batch dedup": "first request in list order represents a shared prefix and duplicates "
    "may still be admitted in the same round (radixsched: the cheapest/oldest represents it "
    "and duplicates wait one round)",
    "retraction": "retracted/preempted requests lose their KV and seniority, and face the "
    "queue limit again (radixsched: KV checkpointed into the cache, seniority kept, never "
    "aborted by the queue limit)",
    "decode reservation": "newly admitted requests reserve their full max_new_tokens while "
    "running ones reserve remaining x new_token_ratio (radixsched: both use the latter)",
    "chunked admission": "a request that will be chunked needs its whole prompt plus decode "
    "budget to fit (radixsched: its first chunk plus a safe reservation)",
    "max-prefill-tokens": "soft when chunking is on (radixsched: enforced for every request "
    "after the first)",
    "eviction": "whole-leaf eviction, may overshoot by a whole leaf (radixsched: partial-leaf, "
    "at most one page over); splits reset creation time (radixsched: kept)",
    "not reproduced": "a chunk continuation that ignores memory and fails its allocation: "
    "both modes cap it at the memory that exists",
    "hrrn clock": "identical in both modes: only prefill tokens advance it",
    "prefill delayer": "wall-clock cap releases only the queue trigger, the first-round "
    "exemption fires once per process, a mixed pass always delays (radixsched: any delay is "
    "capped, the exemption re-arms, a mixed pass waits only while another rank would stall)",
    "in-flight prefixes": "a request whose prompt shares an uncached prefix with a request being "
    "prefilled in the same batch (a chunked prefix being filled in) is admitted and computes it "
    "twice (radixsched: it waits one round and reuses it from the cache)",
    "silent fallback": "none: a cache-aware policy without a cache always logs a warning",
    "queue order": "fcfs keeps the current list order, other ties keep the previous round's "
    "order, and lpm/hrrn above the cap keep their last order (radixsched: fcfs and every tie "
    "by queue entry time, then arrival)",
    "hrrn work": "uncached work counts the prompt only, so a retracted request can look free "
    "(radixsched: prompt + output, like shortest-prefill-first)",
    "policy matching": "cache-aware policies score with match_prefix (splits nodes, refreshes "
    "recency); dfs-weight ignores in-batch dedup (radixsched: read-only matching for every "
    "policy plus the waiting-prefix touch; dfs-weight orders match ends as if split there, and "
    "defers duplicates too)",
}


def _opt(default: Any, help_: str, **meta: Any) -> Any:
    """A field with its flag's help (and argparse extras such as ``choices``)."""
    return field(default=default, metadata={"help": help_, **meta})


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's settings, SGLang's flags by their names (each field is a flag)."""

    CLI_TITLE: ClassVar[str] = "scheduler (SGLang's flag names)"

    # ---- policy ---------------------------------------------------------------------
    schedule_policy: str = _opt("fcfs", "waiting-queue policy")
    seed: int = _opt(0, "seed for the random policy")
    enable_priority_scheduling: bool = _opt(False, "sort by request priority (fcfs and lof only)")
    schedule_low_priority_values_first: bool = _opt(
        False, "smaller priority values are more important"
    )
    abort_on_priority_when_disabled: bool = _opt(
        False, "reject requests that set a priority while priority scheduling is off"
    )
    default_priority_value: int | None = _opt(
        None, "priority given to requests without one (scheduling on)"
    )
    priority_scheduling_preemption_threshold: int = _opt(
        10, "preempt only when the priority difference exceeds this"
    )
    disable_priority_preemption: bool = _opt(False, "never preempt running requests for priority")
    max_prefix_match_queue: int | None = _opt(
        None, "lpm/hrrn fall back to fcfs above this queue length (default: never)"
    )
    in_batch_prefix_check_threshold: int = _opt(
        32, "in-batch dedup: only requests with a cache match <= this"
    )
    in_batch_prefix_deprioritize_threshold: int = _opt(
        32, "in-batch dedup: shared tokens that make a duplicate"
    )
    lpm_max_wait_s: float | None = _opt(
        None, "lpm starvation bound: serve in arrival order after this wait"
    )
    lpm_max_wait_tokens: int | None = _opt(
        None, "lpm starvation bound in processed prefill tokens since queue entry"
    )
    enable_waiting_prefix_refresh: bool = _opt(
        True, "touch queued prefixes every 32 rounds (cache-agnostic, lru)"
    )
    # ---- adder / budgets ------------------------------------------------------------
    chunked_prefill_size: int | None = _opt(
        8192, "chunk budget per prefill batch; <= 0 disables chunking"
    )
    max_prefill_tokens: int = _opt(16384, "input tokens per prefill batch")
    prefill_max_requests: int | None = _opt(None, "requests per prefill batch")
    max_running_requests: int | None = _opt(
        None, "running-request slots (default: from KV capacity)"
    )
    max_queued_requests: int | None = _opt(
        None, "waiting-queue limit; arrivals beyond it are rejected"
    )
    schedule_conservativeness: float = _opt(1.0, "scales the initial new-token ratio")
    enable_mixed_chunk: bool = _opt(False, "run decode tokens inside prefill batches")
    clip_max_new_tokens: int = _opt(4096, "cap on a request's decode reservation (tokens)")
    init_new_token_ratio: float = _opt(0.7, "initial new-token ratio")
    min_new_token_ratio_factor: float = _opt(0.14, "min ratio = init x this")
    new_token_ratio_decay_steps: int = _opt(
        600, "decode steps for the ratio to decay from init to min"
    )
    retract_decode_steps: int = _opt(20, "decode steps kept free for survivors after a retraction")
    retraction_policy: str = _opt(
        "length",
        "retraction victim order (newest: vLLM's recompute preemption)",
        choices=["length", "priority", "newest"],
    )
    # ---- cache ------------------------------------------------------------------------
    page_size: int = _opt(1, "tokens per KV page")
    cache_block_size: int = _opt(
        1,
        "a prefix-cache hit counts whole blocks of this many tokens (1 or a multiple of the "
        "page size; --engine-mode vllm: 16, vLLM's block size); KV stays in pages",
    )
    disable_radix_cache: bool = _opt(False, "no prefix reuse")
    radix_eviction_policy: str = _opt(
        "lru", "eviction strategy (lru, lfu, fifo, filo, mru, priority)"
    )
    # ---- prefill/decode disaggregation (radixsched.cluster.disagg) ---------------------------
    disaggregation_mode: DisaggregationModeName = _opt(  # noqa: RUF009 (a Field)
        "null",
        "'prefill': requests wait for the decode side's handshake and leave after their "
        "first token, their KV held until transferred; 'decode': requests arrive with "
        "their KV and never prefill ('null': co-located); set per role by "
        "simulate --disaggregation, never a flag",
        flag=False,
    )
    num_reserved_decode_tokens: int = _opt(
        512, "decode role: KV tokens kept free per active request at preallocation"
    )
    waiting_prefix_refresh_bootstrap_max: int = _opt(
        128,
        "prefill role: bootstrapping requests whose prefixes the waiting-prefix refresh "
        "touches ahead of the waiting queue",
    )
    # ---- behaviour ----------------------------------------------------------------------
    compat: Compat = _opt(  # noqa: RUF009 (a Field)
        "radixsched",
        "'sglang' reproduces SGLang 0.5.23's choices where radixsched fixes them",
        choices=["radixsched", "sglang"],
    )

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.cache_block_size < 1 or (
            self.cache_block_size > 1 and self.cache_block_size % self.page_size
        ):
            raise ValueError(
                f"cache_block_size must be 1 or a multiple of page_size ({self.page_size}), "
                f"got {self.cache_block_size}"
            )
        if self.schedule_conservativeness < 0:
            raise ValueError("schedule_conservativeness must be >= 0")
        if self.chunk_size is not None and self.chunk_size % self.page_size:
            raise ValueError(
                f"chunked_prefill_size ({self.chunked_prefill_size}) must be divisible by "
                f"page_size ({self.page_size})"
            )
        if self.max_prefill_tokens <= 0:
            raise ValueError("max_prefill_tokens must be > 0")
        if self.retraction_policy == "priority" and not self.enable_priority_scheduling:
            raise ValueError("--retraction-policy priority requires --enable-priority-scheduling")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError("max_queued_requests must be >= 0")
        modes = typing.get_args(DisaggregationModeName)
        if self.disaggregation_mode not in modes:
            raise ValueError(
                f"disaggregation_mode must be one of {', '.join(modes)}, "
                f"got {self.disaggregation_mode!r}"
            )
        if self.num_reserved_decode_tokens < 0:
            raise ValueError("num_reserved_decode_tokens must be >= 0")
        if self.waiting_prefix_refresh_bootstrap_max < 0:
            raise ValueError("waiting_prefix_refresh_bootstrap_max must be >= 0")

    @property
    def chunk_size(self) -> int | None:
        """The chunk budget, or None when chunked prefill is disabled."""
        c = self.chunked_prefill_size
        return None if c is None or c <= 0 else c

    @property
    def hit_unit(self) -> int:
        """Tokens a prefix-cache hit is counted in: whole pages, or whole blocks when hits
        count blocks (a block is whole pages)."""
        return max(self.page_size, self.cache_block_size)

    @property
    def sglang_compat(self) -> bool:
        return self.compat == "sglang"

    @property
    def enable_priority_preemption(self) -> bool:
        return self.enable_priority_scheduling and not self.disable_priority_preemption

    @property
    def priority_sign(self) -> int:
        """+1 when low values are more important, -1 otherwise (SGLang's convention)."""
        return 1 if self.schedule_low_priority_values_first else -1

    def replace(self, **changes: Any) -> SchedulerConfig:
        return dataclasses.replace(self, **changes)


# ---- CLI generation -----------------------------------------------------------------------

C = TypeVar("C")


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """(T, True) for ``T | None`` (or ``Optional[T]``), else (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _parse_optional_int(text: str) -> int | None:
    return None if text.lower() in ("none", "") else int(text)


def _parse_optional_float(text: str) -> float | None:
    return None if text.lower() in ("none", "") else float(text)


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


_METAVARS = {int: "N", float: "X"}


def add_config_args(
    parser: argparse.ArgumentParser,
    cls: type[Any],
    *,
    skip: set[str] | None = None,
    choices: dict[str, list[str]] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Add one ``--flag-name`` per field of a config dataclass (defaults from the class), in
    a group titled by the class's ``CLI_TITLE``. ``choices`` maps field names to their valid
    values (from the registries); ``overrides`` maps a field name to ``add_argument`` keywords
    replacing the generated ones (``help``, ``type``, ``metavar``) plus ``aliases``, more flag
    names for it (SGLang's spellings). A default is printed once: a help text that states its
    own default keeps it. A field whose metadata has ``flag=False`` is never a flag."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(getattr(cls, "CLI_TITLE", cls.__name__))
    for f in dataclasses.fields(cls):
        if (skip and f.name in skip) or f.metadata.get("flag") is False:
            continue
        extra = dict((overrides or {}).get(f.name, {}))
        flags = ["--" + f.name.replace("_", "-"), *extra.pop("aliases", [])]
        tp, optional = unwrap_optional(hints[f.name])
        help_ = str(extra.pop("help", f.metadata.get("help", "")))
        if "(default" not in help_:
            help_ += f" (default: {_default_text(f.default)})"
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_}
        if tp is bool:
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
            continue
        if typing.get_origin(tp) is Literal:
            kw["choices"] = list(typing.get_args(tp))
            kw["type"] = str
        elif tp is int:
            kw["type"] = _parse_optional_int if optional else int
        elif tp is float:
            kw["type"] = _parse_optional_float if optional else float
        else:
            kw["type"] = str
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if choices and f.name in choices:
            kw["choices"] = choices[f.name]
        if "choices" not in kw:
            kw["metavar"] = _METAVARS.get(tp, "NAME")
        kw.update(extra)
        group.add_argument(*flags, **kw)


def config_from_args(cls: type[C], args: argparse.Namespace, **overrides: Any) -> C:
    """Build ``cls`` from parsed args: only flags the user gave override the defaults."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(overrides)
    return cls(**values)


def resolve_max_running_requests(config: SchedulerConfig, capacity: int, context_len: int) -> int:
    """Per-replica request slots, as SGLang resolves them: the setting, else an estimate from
    the KV capacity and the context length (2048 to 4096); never above half the KV capacity."""
    if config.max_running_requests is not None:
        return max(1, min(config.max_running_requests, max(capacity // 2, 1)))
    estimated = min(max(int(capacity / max(context_len, 1) * 512), 2048), 4096)
    return max(1, min(estimated, capacity // 2))

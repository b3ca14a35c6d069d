"""What a measured run is: the requests a benchmark client recorded, how they arrived, and
what is known of how their prompts shared prefixes (``sim.calibrate.readers`` build these
from result files)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class ResultFileError(ValueError):
    """A result file that cannot be read; the message names the file (and line)."""


@dataclass(frozen=True)
class MeasuredRequest:
    prompt_len: int
    output_len: int
    ttft_s: float
    e2e_s: float
    sent_at: float | None = None  # seconds from the run's start
    # Prompt tokens the server reported as served from its prefix cache (GuideLLM 0.8).
    cached_tokens: int | None = None

    @property
    def itl_s(self) -> float | None:
        """Mean gap between output tokens (None below two tokens)."""
        if self.output_len < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_len - 1)


@dataclass(frozen=True)
class PrefixBucket:
    """Prompts that start with one of ``count`` shared prefixes of ``tokens`` tokens, a
    ``weight`` share of the requests (GuideLLM's synthetic ``prefix_buckets``; sglang's
    generated-shared-prefix groups)."""

    weight: float
    count: int
    tokens: int


@dataclass(frozen=True)
class MeasuredRun:
    name: str
    source: str  # "radixsched" | "sglang" | "vllm" | "guidellm"
    path: str
    requests: tuple[MeasuredRequest, ...]
    request_rate: float = math.inf  # requests/s; inf = all at once
    max_concurrency: int | None = None
    model: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    num_failed: int = 0
    # radixsched runs: how to regenerate the prompts (load_workload arguments, server limits).
    workload: dict[str, Any] = field(default_factory=dict)
    # How the prompts shared prefixes: () none, None unknown (request-unique prompts are
    # replayed, and ``structure_note`` says what that may cost).
    prefixes: tuple[PrefixBucket, ...] | None = ()
    structure_note: str | None = None
    # Output tokens per streamed chunk, on average (GuideLLM 0.6+ counts the chunks); None: not
    # recorded. Above about 1.5 the measured TTFT is the first chunk's, several tokens in.
    tokens_per_chunk: float | None = None
    tool_version: str | None = None  # the client's version, when the file names it
    # Each request's prompt ids, from the user's trace (``calibrate --workload``); None: not
    # known, the replay builds them from ``prefixes``.
    prompts: tuple[Any, ...] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "num_requests": len(self.requests),
            "num_failed": self.num_failed,
            "request_rate": self.request_rate if math.isfinite(self.request_rate) else "inf",
            "max_concurrency": self.max_concurrency,
        }

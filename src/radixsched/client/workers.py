"""The workers behind a router, as the load client sees them: which workers sglang-router
lists (``GET /workers``), and what each one's ``/metrics`` says it served during a run
(requests finished, prompt tokens, prompt tokens from its prefix cache). Parsing only; the
load client does the requests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixsched.server.metrics import CACHED_PROMPT_TOKENS, PREFIX, PROMPT_TOKENS

FINISHED_REQUESTS = f"{PREFIX}_requests_finished_total"


def router_worker_urls(body: str) -> tuple[str, ...]:
    """The healthy workers' base URLs in sglang-router's ``GET /workers`` answer (empty when
    the body is not such an answer)."""
    try:
        workers = json.loads(body).get("workers")
    except (ValueError, AttributeError):
        return ()
    if not isinstance(workers, list):
        return ()
    urls = [
        str(w["url"]).rstrip("/")
        for w in workers
        if isinstance(w, dict) and w.get("url") and w.get("is_healthy", True)
    ]
    return tuple(sorted(urls))


@dataclass(frozen=True)
class WorkerCounters:
    """A worker's running totals at one moment."""

    finished: float
    prompt: float
    cached: float


def worker_counters(text: str) -> WorkerCounters | None:
    """The totals in a worker's Prometheus text (None when it has no prompt-token counter)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums = {FINISHED_REQUESTS: 0.0, PROMPT_TOKENS: 0.0, CACHED_PROMPT_TOKENS: 0.0}
    seen = False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in sums:
                    sums[sample.name] += float(sample.value)
                    seen = seen or sample.name == PROMPT_TOKENS
    except ValueError:
        return None
    if not seen:
        return None
    return WorkerCounters(sums[FINISHED_REQUESTS], sums[PROMPT_TOKENS], sums[CACHED_PROMPT_TOKENS])


@dataclass(frozen=True)
class WorkerShare:
    """What one worker served during a run."""

    url: str
    requests: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": self.hit_rate,
        }


def worker_shares(
    before: Mapping[str, WorkerCounters | None], after: Mapping[str, WorkerCounters | None]
) -> tuple[WorkerShare, ...] | None:
    """Each worker's growth over the run; None unless every worker answered both times."""
    shares = []
    for url, end in after.items():
        start = before.get(url)
        if start is None or end is None:
            return None
        shares.append(
            WorkerShare(
                url=url,
                requests=round(end.finished - start.finished),
                prompt_tokens=round(end.prompt - start.prompt),
                cached_tokens=round(end.cached - start.cached),
            )
        )
    return tuple(shares)


def share_lines(shares: Sequence[WorkerShare]) -> list[str]:
    """One line per worker: requests and hit rate."""
    total = sum(s.requests for s in shares) or 1
    return [
        f"  worker {s.url}: {s.requests:,} requests ({s.requests / total:.0%}), hit rate "
        f"{s.hit_rate:.1%} ({s.cached_tokens:,} of {s.prompt_tokens:,} prompt tokens)"
        for s in shares
    ]

"""Prometheus metrics of one server (its own ``CollectorRegistry``, so apps never share state).

All updates happen on the scheduler thread right after a step (prometheus-client's metrics are
thread-safe; the HTTP thread only renders them). Latencies use the scheduler's wall clock, the
same timestamps ``Req.times`` records, so they match the simulator's definitions: TTFT =
first token - arrival, inter-token latency = gap between consecutive tokens of one request, e2e
= finish - arrival. The cache hit rate is the ratio of the two token counters
(``radixsched_cached_prompt_tokens_total / radixsched_prompt_tokens_total``), counted when a
request is first scheduled, exactly as ``SchedulerStats`` counts them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from radixsched.request import Req
    from radixsched.scheduler import Scheduler, StepOutcome

PREFIX = "radixsched"
PROMPT_TOKENS = f"{PREFIX}_prompt_tokens_total"
CACHED_PROMPT_TOKENS = f"{PREFIX}_cached_prompt_tokens_total"

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        counter = functools.partial(Counter, registry=r)
        gauge = functools.partial(Gauge, registry=r)
        histogram = functools.partial(Histogram, registry=r)
        # prometheus-client appends "_total" to counter names itself.
        self.prompt_tokens = counter(
            PROMPT_TOKENS.removesuffix("_total"),
            "Prompt tokens of requests that were scheduled (hit-rate denominator)",
        )
        self.cached_prompt_tokens = counter(
            CACHED_PROMPT_TOKENS.removesuffix("_total"),
            "Prompt tokens served from the prefix cache (hit-rate numerator)",
        )
        self.generation_tokens = counter(f"{PREFIX}_generation_tokens", "Tokens generated")
        self.requests_finished = counter(
            f"{PREFIX}_requests_finished",
            "Finished requests by finish reason (stop, length, abort)",
            ["finish_reason"],
        )
        self.requests_rejected = counter(
            f"{PREFIX}_requests_rejected",
            "Requests refused at admission, by HTTP status",
            ["status"],
        )
        self.num_waiting = gauge(f"{PREFIX}_num_waiting_requests", "Queued requests")
        self.num_running = gauge(
            f"{PREFIX}_num_running_requests", "Running requests (incl. a chunked one)"
        )
        self.kv_usage = gauge(f"{PREFIX}_kv_usage", "Share of KV slots used by requests or locked")
        self.cached_tokens = gauge(
            f"{PREFIX}_radix_cache_tokens", "Tokens held by the prefix cache"
        )
        self.ttft = histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=_LATENCY_BUCKETS,
        )
        self.itl = histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Gap between consecutive tokens of a request",
            buckets=_ITL_BUCKETS,
        )
        self.e2e = histogram(
            f"{PREFIX}_e2e_request_latency_seconds",
            "Arrival to finish of completed requests",
            buckets=_LATENCY_BUCKETS,
        )
        self._seen_prompt = 0
        self._seen_cached = 0

    def on_step(self, out: StepOutcome) -> None:
        for req, toks in out.new_tokens:
            self.generation_tokens.inc(len(toks))
            times = req.times.token_times
            for i in range(len(times) - len(toks), len(times)):
                if i == 0:
                    self.ttft.observe(max(times[0] - req.times.arrival, 0.0))
                elif i > 0:
                    self.itl.observe(max(times[i] - times[i - 1], 0.0))

    def on_finish(self, req: Req, reason: str) -> None:
        self.requests_finished.labels(finish_reason=reason).inc()
        t = req.times
        if reason != "abort" and t.finish is not None:
            self.e2e.observe(max(t.finish - t.arrival, 0.0))

    def on_reject(self, status: int) -> None:
        self.requests_rejected.labels(status=str(status)).inc()

    def sync(self, sched: Scheduler) -> None:
        """Gauges from the scheduler's state; token counters from its running totals."""
        stats = sched.stats
        if stats.prompt_tokens > self._seen_prompt:
            self.prompt_tokens.inc(stats.prompt_tokens - self._seen_prompt)
            self._seen_prompt = stats.prompt_tokens
        if stats.cached_prompt_tokens > self._seen_cached:
            self.cached_prompt_tokens.inc(stats.cached_prompt_tokens - self._seen_cached)
            self._seen_cached = stats.cached_prompt_tokens
        self.num_waiting.set(sched.num_waiting())
        self.num_running.set(sched.num_running())
        self.kv_usage.set(sched.kv_usage())
        self.cached_tokens.set(sched.cache.total_size())

    def render(self) -> bytes:
        return generate_latest(self.registry)


def parse_counter(text: str, name: str) -> float:
    """Value of an unlabelled sample ``name`` in Prometheus text exposition (0.0 if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0

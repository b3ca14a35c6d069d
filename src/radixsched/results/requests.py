"""Per-request measures: latency samples of finished requests, one row per request, hit rates,
and why requests failed."""

from __future__ import annotations

import itertools
import math
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias, cast

import numpy as np

from radixsched.native import core
from radixsched.request import FinishReason, Req
from radixsched.results.stats import FloatArray, _ratio

# ---- Per-request samples -------------------------------------------------------------------------


def _completed(reqs: Iterable[Req]) -> list[Req]:
    """Requests that finished without an abort; the latency samples cover only these."""
    abort = FinishReason.ABORT  # a local: enum member lookup is slow in a 1e5-request loop
    return [
        r
        for r in reqs
        if r.finish is not None and r.finish.reason is not abort and r.times.finish is not None
    ]


def meets_slo(
    done: Req, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None = None
) -> bool:
    """Whether ``done`` (a completed request) met every target given (seconds; None: no
    target). A request with one output token has no TPOT and meets any TPOT target."""
    t, n = done.times, done.output_len
    if t.first_token is None or t.finish is None:
        return False
    return not (
        (ttft_s is not None and t.first_token - t.arrival > ttft_s)
        or (e2e_s is not None and t.finish - t.arrival > e2e_s)
        or (tpot_s is not None and n > 1 and (t.finish - t.first_token) / (n - 1) > tpot_s)
    )


def _ttft(done: Sequence[Req]) -> FloatArray:
    """TTFT of each of ``done`` (``_completed`` requests) that produced a token."""
    return np.array(
        [r.times.first_token - r.times.arrival for r in done if r.times.first_token is not None],
        dtype=np.float64,
    )


# Tokens joined into one array at a time: a long trace has hundreds of millions of token times,
# and a copy of them all would double what the gaps take; 512 KB of float64 stays in the cache
# (a batch of 2**20 was 30% slower on a 600k-token run: fresh pages for each temporary).
_JOIN_TOKENS = 1 << 16


def token_gaps(token_times: Sequence[Sequence[float]]) -> FloatArray:
    """Every gap between consecutive token times within each sequence, sequence by sequence, in
    one array: ``later - earlier`` in float64, as a loop over them gives it. Consecutive
    sequences are joined into one array a batch at a time (one conversion, not one per
    request) and the gaps that span two of them dropped; the gaps are the only full-size copy."""
    seqs = [tt for tt in token_times if len(tt) > 1]
    lens = np.fromiter(map(len, seqs), dtype=np.intp, count=len(seqs))
    ends = np.cumsum(lens)
    total = int(ends[-1]) if len(seqs) else 0
    out = np.empty(total - len(seqs), dtype=np.float64)
    join = getattr(core(), "join_gaps", None)
    if join is not None and join(seqs, 0, len(seqs), out):  # natively, in one pass
        return out
    cuts = np.searchsorted(ends, np.arange(_JOIN_TOKENS, total, _JOIN_TOKENS), side="right")
    bounds = sorted({0, *cuts.tolist(), len(seqs)})
    at = 0
    for lo, hi in itertools.pairwise(bounds):
        flat = _joined(seqs[lo:hi], int(lens[lo:hi].sum()))
        gaps = flat[1:] - flat[:-1]
        # gaps[k] = flat[k + 1] - flat[k]: the gap at (a sequence's end) - 1 runs into the next.
        kept = np.delete(gaps, np.cumsum(lens[lo : hi - 1]) - 1)
        out[at : at + kept.size] = kept
        at += kept.size
    return out


def _joined(seqs: Sequence[Sequence[float]], total: int) -> FloatArray:
    """``seqs`` end to end as float64. Lists of floats are copied natively (``join_floats``),
    others go through one iterator; a finished request of a deferred run holds its times in
    an ``array('d')`` (``compact``): such arrays are joined as bytes, in one call."""
    if all(type(s) is list for s in seqs):
        out = np.empty(total, dtype=np.float64)
        mod = core()
        if mod is not None and mod.join_floats(seqs, out):
            return out
        return np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.float64, count=total)
    if all(type(s) is array and s.typecode == "d" for s in seqs):
        return np.frombuffer(b"".join(cast("list[array[float]]", seqs)), dtype=np.float64)
    return np.concatenate([np.asarray(s, dtype=np.float64) for s in seqs])


def _queue_wait(done: Sequence[Req]) -> FloatArray:
    return np.array(
        [
            r.times.first_scheduled - r.times.arrival
            for r in done
            if r.times.first_scheduled is not None
        ],
        dtype=np.float64,
    )


# Columns of the per-request output (``--requests-csv``), in order: one row per request and
# policy, as Vidur's request_metrics.csv and bench_serving's --output-details give. Times are
# seconds on the run's clock; a latency a request never reached is empty.
REQUEST_COLUMNS: tuple[str, ...] = (
    "policy", "request_id", "tenant", "routing_key", "priority", "replica", "arrival_s",
    "first_scheduled_s", "first_token_s", "finish_s", "queue_wait_s", "ttft_s", "tpot_s", "e2e_s",
    "prompt_tokens", "cached_tokens", "host_cached_tokens", "computed_prefill_tokens",
    "output_tokens", "retractions", "preemptions", "finish_reason", "error", "slo_met",
)  # fmt: skip
RequestRow: TypeAlias = dict[str, str | int | float | bool | None]


def request_rows(
    policy: str,
    reqs: Iterable[Req],
    replica_of: Mapping[str, int] | None = None,
    slo: SloTargets | None = None,
) -> list[RequestRow]:
    """One ``REQUEST_COLUMNS`` row per request, in arrival order."""
    abort = FinishReason.ABORT  # locals: a row is built per request of every policy
    active = slo is not None and slo.active
    ttft_slo = None if slo is None else slo.ttft_s
    tpot_slo = None if slo is None else slo.tpot_s
    rows: list[RequestRow] = []
    for r in sorted(reqs, key=lambda q: q.times.arrival):
        t, fin, n = r.times, r.finish, r.output_len
        arrival, scheduled, first_token, finish = (
            t.arrival,
            t.first_scheduled,
            t.first_token,
            t.finish,
        )
        done = fin is not None and fin.reason is not abort
        ttft = None if first_token is None else first_token - arrival
        tpot = (
            (finish - first_token) / (n - 1)
            if done and n > 1 and finish is not None and first_token is not None
            else None
        )
        met: bool | None = None
        if active:
            met = done and ttft is not None
            if met and ttft_slo is not None and ttft is not None:
                met = ttft <= ttft_slo
            if met and tpot_slo is not None and tpot is not None:
                met = tpot <= tpot_slo
        rows.append(
            {
                "policy": policy,
                "request_id": r.rid,
                "tenant": r.tenant,
                "routing_key": r.routing_key,
                "priority": r.priority,
                "replica": None if replica_of is None else replica_of.get(r.rid),
                "arrival_s": arrival,
                "first_scheduled_s": scheduled,
                "first_token_s": first_token,
                "finish_s": finish,
                "queue_wait_s": None if scheduled is None else scheduled - arrival,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": finish - arrival if done and finish is not None else None,
                "prompt_tokens": r.prompt_len,
                "cached_tokens": r.cached_tokens,
                "host_cached_tokens": r.host_cached_tokens,
                "computed_prefill_tokens": r.computed_prefill_tokens,
                "output_tokens": n,
                "retractions": r.retraction_count,
                "preemptions": r.preemption_count,
                "finish_reason": None if fin is None else fin.reason.value,
                "error": fin.message if fin is not None and not done else None,
                "slo_met": met,
            }
        )
    return rows


# ---- Cache and fairness --------------------------------------------------------------------------


class HitRates(NamedTuple):
    """Token-weighted hit rates; ``total == device + host`` up to rounding."""

    total: float
    device: float
    host: float
    cached_tokens: int
    prompt_tokens: int


def hit_rates(reqs: Iterable[Req]) -> HitRates:
    scheduled = [r for r in reqs if r.times.first_scheduled is not None]
    cached = sum(r.cached_tokens for r in scheduled)
    host = sum(r.host_cached_tokens for r in scheduled)
    prompt = sum(r.prompt_len for r in scheduled)
    return hit_rates_of(cached, host, prompt)


def hit_rates_of(cached: int, host: int, prompt: int) -> HitRates:
    """The rates of ``cached`` prompt tokens (``host`` of them from the host tier) over
    ``prompt``, the scheduled requests' sums."""
    return HitRates(
        total=_ratio(cached, prompt),
        device=_ratio(cached - host, prompt),
        host=_ratio(host, prompt),
        cached_tokens=cached,
        prompt_tokens=prompt,
    )


def failure_reasons(reqs: Iterable[Req]) -> list[tuple[str, int]]:
    """Why requests did not complete: (an example message, how many), most frequent first;
    messages that differ only in their numbers count as one reason."""
    groups: dict[str, tuple[str, int]] = {}
    abort = FinishReason.ABORT  # a local: read once, not once a request
    for r in reqs:
        if r.finish is None or r.finish.reason is not abort:
            continue
        message = r.finish.message or "aborted"
        key = re.sub(r"\d+", "N", message)
        example, n = groups.get(key, (message, 0))
        groups[key] = (example, n + 1)
    return sorted(groups.values(), key=lambda x: -x[1])


def failure_summary(reqs: Sequence[Req]) -> str:
    """One line: how many requests failed and why (the most frequent reason, an example)."""
    abort = FinishReason.ABORT  # the aborted ones in one pass (a few among a million)
    aborted = [r for r in reqs if r.finish is not None and r.finish.reason is abort]
    reasons = failure_reasons(aborted)
    if not reasons:
        return ""
    rejected = sum(1 for r in aborted if r.times.first_scheduled is None)
    failed = sum(n for _, n in reasons)
    how = (
        "rejected at admission"
        if rejected == failed
        else "aborted"
        if rejected == 0
        else f"failed ({rejected:,} rejected at admission)"
    )
    text = f"{failed:,} {how}, e.g. {reasons[0][0]!r}"
    if len(reasons) > 1:
        text += f" ({reasons[0][1]:,} like it, {len(reasons) - 1} other reasons)"
    return text


# ---- SLO goodput and load ------------------------------------------------------------------------


@dataclass(frozen=True)
class SloTargets:
    """Latency targets a request must meet to count as good (None: no target on that
    latency). Seconds, like every latency here; the CLI takes milliseconds."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("ttft", self.ttft_s), ("tpot", self.tpot_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"the {name} SLO must be a positive number, got {v}")

    @property
    def active(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def describe(self) -> str:
        parts = [
            f"{name} <= {v * 1e3:g} ms"
            for name, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s))
            if v is not None
        ]
        return " and ".join(parts)

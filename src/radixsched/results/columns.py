"""The table's columns: what each shows, which way is better, which results need it, and which
ones fit a terminal's width."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from radixsched.results.format import (
    Better,
    fmt_fraction,
    fmt_int,
    fmt_percent,
    fmt_points,
    fmt_rate,
    fmt_seconds,
)
from radixsched.results.metrics import PolicyResult


@dataclass(frozen=True)
class Column:
    """A column of the comparison: a result's value, which way is better, its format."""

    key: str  # stable identifier (CSV of the table, HTML ids)
    header: str
    get: Callable[[PolicyResult], float]
    better: Better
    fmt: Callable[[float], str]
    hint: str = ""  # one-line explanation (HTML tooltip, terminal legend)
    # Terminal priority: 0 = never in the terminal table (report only); 1 = always; larger
    # numbers are dropped first when the terminal is too narrow.
    terminal: int = 0


def _latency(key: str, header: str, field: str, stat: str, hint: str, terminal: int = 0) -> Column:
    def get(r: PolicyResult) -> float:
        return float(getattr(getattr(r, field), stat))

    return Column(key, header, get, Better.LOWER, fmt_seconds, hint, terminal)


# Column(key, header, get, better, fmt, hint, terminal=...), one per row of the table.
COLUMNS: tuple[Column, ...] = (
    Column("hit_rate", "hit rate", lambda r: r.hit_rate, Better.HIGHER, fmt_percent,
           "cached prompt tokens / prompt tokens", terminal=1),
    Column("hit_rate_gap", "gap", lambda r: r.hit_rate_gap, Better.LOWER, fmt_points,
           "optimal hit rate of the workload minus the achieved one"),
    _latency("ttft_p50", "TTFT p50", "ttft_s", "p50", "median time to first token", 1),
    _latency("ttft_p95", "TTFT p95", "ttft_s", "p95", "95th percentile time to first token"),
    _latency("ttft_p99", "TTFT p99", "ttft_s", "p99", "99th percentile time to first token", 1),
    _latency("ttft_std", "TTFT std", "ttft_s", "std", "standard deviation of TTFT"),
    _latency("tpot_p50", "TPOT p50", "tpot_s", "p50",
             "median time per output token after the first", 1),
    _latency("tpot_mean", "TPOT mean", "tpot_s", "mean", "mean time per output token"),
    _latency("itl_p50", "ITL p50", "itl_s", "p50", "median gap between consecutive tokens"),
    _latency("itl_p99", "ITL p99", "itl_s", "p99", "99th percentile inter-token gap"),
    _latency("e2e_p50", "E2E p50", "e2e_s", "p50", "median arrival-to-finish latency"),
    _latency("e2e_p99", "E2E p99", "e2e_s", "p99", "99th percentile arrival-to-finish latency", 3),
    _latency("queue_wait_p99", "queue p99", "queue_wait_s", "p99",
             "99th percentile wait before first scheduling (who starves)"),
    _latency("queue_wait_max", "queue max", "queue_wait_s", "max",
             "longest wait before first scheduling"),
    Column("requests_per_s", "req/s", lambda r: r.throughput.requests_per_s, Better.HIGHER,
           fmt_rate, "completed requests per second of makespan"),
    Column("output_tokens_per_s", "out tok/s", lambda r: r.throughput.output_tokens_per_s,
           Better.HIGHER, fmt_rate, "output tokens per second of makespan", terminal=1),
    Column("retractions", "retract", lambda r: float(r.retractions), Better.LOWER, fmt_int,
           "decode-memory retractions", terminal=2),
    Column("failed", "failed", lambda r: float(r.num_failed), Better.LOWER, fmt_int,
           "requests rejected at admission or aborted", terminal=1),
)  # fmt: skip

FAIRNESS_COLUMN = Column(
    "fairness_jain", "fair", lambda r: r.fairness_jain, Better.HIGHER, fmt_fraction,
    "Jain's index over tenants' served/demanded tokens at the fairness horizon (1 = equal)",
    terminal=2,
)  # fmt: skip

SLO_COLUMN = Column(
    "slo_attainment", "SLO met", lambda r: r.slo.attainment if r.slo is not None else 0.0,
    Better.HIGHER, fmt_percent, "share of all requests that completed within the SLO targets",
    terminal=1,
)  # fmt: skip


def _role_value(r: PolicyResult, key: str, stat: str | None = None) -> float:
    """A number of a split deployment's ``disaggregation`` entry (0 when there is none)."""
    data = r.extra.get("disaggregation")
    value = data.get(key) if isinstance(data, Mapping) else None
    if stat is not None:
        value = value.get(stat) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, int | float) else 0.0


def _role_latency(key: str, header: str, field: str, hint: str, terminal: int) -> Column:
    def get(r: PolicyResult) -> float:
        return _role_value(r, field, "p99")

    return Column(key, header, get, Better.LOWER, fmt_seconds, hint, terminal)


# Shown when a run split prefill and decode onto their own instances (``sim.deploy.disagg``).
DISAGG_COLUMNS: tuple[Column, ...] = (
    _role_latency("bootstrap_wait_p99", "held p99", "bootstrap_wait_s",
                  "99th percentile wait until the decode side had memory for the request (and "
                  "the handshake reached the prefill instance)", 3),
    _role_latency("prefill_queue_p99", "P queue p99", "prefill_queue_wait_s",
                  "99th percentile wait on the prefill instance before the prefill started", 2),
    _role_latency("transfer_p99", "xfer p99", "transfer_s",
                  "99th percentile KV transfer time, first token to landing (link queueing "
                  "included)", 2),
    _role_latency("decode_queue_p99", "D queue p99", "decode_queue_wait_s",
                  "99th percentile wait on the decode instance from the KV landing to its first "
                  "token", 4),
    Column("prefill_utilisation", "P util", lambda r: _role_value(r, "prefill_utilisation"),
           Better.NONE, fmt_percent,
           "mean share of the makespan the prefill instances spent running batches", 3),
    Column("decode_utilisation", "D util", lambda r: _role_value(r, "decode_utilisation"),
           Better.NONE, fmt_percent,
           "mean share of the makespan the decode instances spent running batches", 3),
)  # fmt: skip


def columns_for(results: Sequence[PolicyResult]) -> tuple[Column, ...]:
    """Every column the results fill: fairness only when some run had more than one tenant,
    SLO attainment only when targets were given."""
    cols = list(COLUMNS)
    if any(r.tenants for r in results):
        cols.append(FAIRNESS_COLUMN)
    if any("disaggregation" in r.extra for r in results):
        cols.extend(DISAGG_COLUMNS)
    if any(r.slo is not None for r in results):
        cols.insert(1, SLO_COLUMN)
    return tuple(cols)


def terminal_columns(results: Sequence[PolicyResult], width: int) -> tuple[Column, ...]:
    """The terminal table's columns: those with a terminal priority, the least important
    dropped first until the table fits ``width`` characters (see ``table_width``)."""
    cols = [c for c in columns_for(results) if c.terminal]
    pinned = {"hit_rate", "ttft_p99", "slo_attainment"}
    if any(r.num_failed for r in results):
        pinned.add("failed")
    while table_width(results, cols) > width:
        droppable = [i for i, c in enumerate(cols) if c.key not in pinned]
        if not droppable:
            break  # only what must be seen is left; rich squeezes it
        cols.pop(max(droppable, key=lambda i: (cols[i].terminal, i)))
    return tuple(cols)


def _cell_widths(results: Sequence[PolicyResult], cols: Sequence[Column]) -> list[int]:
    """Each column's width: its header (one line) or its widest value."""
    return [max([len(c.fmt(c.get(r))) for r in results] + [len(c.header)]) for c in cols]


def _policy_width(results: Sequence[PolicyResult]) -> int:
    return max([len(r.policy) for r in results] + [len("policy")])


def table_width(results: Sequence[PolicyResult], cols: Sequence[Column]) -> int:
    """Characters the terminal table takes: two spaces between columns, none outside."""
    widths = [_policy_width(results), *_cell_widths(results, cols)]
    return sum(widths) + 2 * (len(widths) - 1)


def best_rows(results: Sequence[PolicyResult], column: Column) -> frozenset[int]:
    """Indices of the rows holding the column's best value. Ties are judged on the displayed
    text, so two cells that read the same are both best or neither; nothing is highlighted
    with fewer than two rows, when every row reads the same, or for ``Better.NONE``. Rows of
    policies that served nothing are never best (their latencies are empty, not zero)."""
    if column.better is Better.NONE:
        return frozenset()
    rows = [i for i, r in enumerate(results) if not r.served_nothing]
    if len(rows) < 2:
        return frozenset()
    values = {i: column.get(results[i]) for i in rows}
    texts = {i: column.fmt(v) for i, v in values.items()}
    if len(set(texts.values())) == 1:
        return frozenset()
    best = max(values.values()) if column.better is Better.HIGHER else min(values.values())
    best_text = column.fmt(best)
    return frozenset(i for i, t in texts.items() if t == best_text)

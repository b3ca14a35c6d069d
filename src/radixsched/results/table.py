"""Comparison of policy results: a rich table, a recommendation, CSV and JSON output.

The table and the HTML report share ``COLUMNS`` (what is compared, which direction is better)
and ``policy_color`` (one colour per policy everywhere), so the two views never disagree."""

from __future__ import annotations

import csv
import dataclasses
import enum
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from radixsched.results.metrics import JSONValue, PolicyResult

if TYPE_CHECKING:
    from rich.console import Console

# Ten clearly distinct hues (Tableau 10, its pale yellow darkened for contrast on white);
# policies take colours by their position in the result list, so table, legend and charts
# agree, and charts add a dash pattern per position so that no two series look alike.
PALETTE: tuple[str, ...] = (
    "#4E79A7",
    "#F28E2B",
    "#59A14F",
    "#E15759",
    "#B07AA1",
    "#9C755F",
    "#B6992D",
    "#76B7B2",
    "#FF9DA7",
    "#79706E",
)


def policy_color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


class Better(enum.Enum):
    HIGHER = "higher"
    LOWER = "lower"
    NONE = "none"  # informational, never highlighted


# Beyond these magnitudes numbers are written in scientific notation (``1.00e+12``), so that
# no value of an extreme run (a rate of 1e-300, a latency of 1e300 s) takes a screenful.
_SMALLEST_PLAIN, _LARGEST_PLAIN = 1e-3, 1e9


def _extreme(x: float) -> str | None:
    """``x`` as text when it is not finite or too small or large to write out, else None."""
    if not math.isfinite(x):
        return str(x)
    if x != 0 and not _SMALLEST_PLAIN <= abs(x) < _LARGEST_PLAIN:
        return f"{x:.2e}"
    return None


def _sig3(x: float) -> str:
    """``x`` (non-zero) with three significant digits, trailing zeros kept (``28.0``, ``655``,
    ``0.0500``); from 1,000 up, whole numbers with a thousands separator; scientific notation
    below 0.001 and from 1e9 up."""
    extreme = _extreme(x)
    if extreme is not None:
        return extreme
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    text = f"{x:.{decimals}f}"
    if decimals > 0 and abs(float(text)) >= 10.0 ** (3 - decimals):
        text = f"{x:.{decimals - 1}f}"  # rounding reached the next decade (9.996 -> 10.0)
    elif decimals == 0 and abs(float(text)) >= 1000:
        text = f"{x:,.0f}"
    return text


def fmt_seconds(x: float) -> str:
    """Duration with a readable unit and three significant digits (whole seconds with a
    thousands separator from 1,000 s): ``28.0 s``, ``655 s``, ``1,617 s``, ``12.3 ms``."""
    if x == 0:
        return "0"
    if not math.isfinite(x) or not 1e-7 <= abs(x) < _LARGEST_PLAIN:
        return f"{_extreme(x) or x} s"
    for scale, unit in ((1e-6, "µs"), (1e-3, "ms"), (1.0, "s")):
        text = _sig3(x / scale)
        if "," not in text and (unit == "s" or abs(x) < scale * 1000) and abs(float(text)) < 1000:
            return f"{text} {unit}"
    return f"{x:,.0f} s"


def fmt_rate(x: float) -> str:
    if x == 0:
        return "0"
    extreme = _extreme(x)
    if extreme is not None:
        return extreme
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return _sig3(x)


def fmt_percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def fmt_points(x: float) -> str:
    """A hit-rate gap in percentage points."""
    return f"{100 * x:.1f} pp"


def fmt_int(x: float) -> str:
    if not math.isfinite(x) or abs(x) >= _LARGEST_PLAIN:
        return _extreme(x) or str(x)
    return f"{round(x):,}"


def fmt_fraction(x: float) -> str:
    return f"{x:.3f}"


@dataclass(frozen=True)
class Column:
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


COLUMNS: tuple[Column, ...] = (
    Column(
        "hit_rate",
        "hit rate",
        lambda r: r.hit_rate,
        Better.HIGHER,
        fmt_percent,
        "cached prompt tokens / prompt tokens",
        terminal=1,
    ),
    Column(
        "hit_rate_gap",
        "gap",
        lambda r: r.hit_rate_gap,
        Better.LOWER,
        fmt_points,
        "optimal hit rate of the workload minus the achieved one",
    ),
    _latency("ttft_p50", "TTFT p50", "ttft_s", "p50", "median time to first token", 1),
    _latency("ttft_p95", "TTFT p95", "ttft_s", "p95", "95th percentile time to first token"),
    _latency("ttft_p99", "TTFT p99", "ttft_s", "p99", "99th percentile time to first token", 1),
    _latency("ttft_std", "TTFT std", "ttft_s", "std", "standard deviation of TTFT"),
    _latency(
        "tpot_p50", "TPOT p50", "tpot_s", "p50", "median time per output token after the first", 1
    ),
    _latency("tpot_mean", "TPOT mean", "tpot_s", "mean", "mean time per output token"),
    _latency("itl_p50", "ITL p50", "itl_s", "p50", "median gap between consecutive tokens"),
    _latency("itl_p99", "ITL p99", "itl_s", "p99", "99th percentile inter-token gap"),
    _latency("e2e_p50", "E2E p50", "e2e_s", "p50", "median arrival-to-finish latency"),
    _latency("e2e_p99", "E2E p99", "e2e_s", "p99", "99th percentile arrival-to-finish latency", 3),
    _latency(
        "queue_wait_p99",
        "queue p99",
        "queue_wait_s",
        "p99",
        "99th percentile wait before first scheduling (who starves)",
    ),
    _latency(
        "queue_wait_max",
        "queue max",
        "queue_wait_s",
        "max",
        "longest wait before first scheduling",
    ),
    Column(
        "requests_per_s",
        "req/s",
        lambda r: r.throughput.requests_per_s,
        Better.HIGHER,
        fmt_rate,
        "completed requests per second of makespan",
    ),
    Column(
        "output_tokens_per_s",
        "out tok/s",
        lambda r: r.throughput.output_tokens_per_s,
        Better.HIGHER,
        fmt_rate,
        "output tokens per second of makespan",
        terminal=1,
    ),
    Column(
        "retractions",
        "retract",
        lambda r: float(r.retractions),
        Better.LOWER,
        fmt_int,
        "decode-memory retractions",
        terminal=2,
    ),
    Column(
        "failed",
        "failed",
        lambda r: float(r.num_failed),
        Better.LOWER,
        fmt_int,
        "requests rejected at admission or aborted",
        terminal=1,
    ),
)

FAIRNESS_COLUMN = Column(
    "fairness_jain",
    "fair",
    lambda r: r.fairness_jain,
    Better.HIGHER,
    fmt_fraction,
    "Jain's index over tenants' served/demanded tokens at the fairness horizon (1 = equal)",
    terminal=2,
)

SLO_COLUMN = Column(
    "slo_attainment",
    "SLO met",
    lambda r: r.slo.attainment if r.slo is not None else 0.0,
    Better.HIGHER,
    fmt_percent,
    "share of all requests that completed within the SLO targets",
    terminal=1,
)


def _role_value(r: PolicyResult, key: str, stat: str | None = None) -> float:
    """A number of a split deployment's ``disaggregation`` entry (0 when there is none)."""
    data = r.extra.get("disaggregation")
    value = data.get(key) if isinstance(data, Mapping) else None
    if stat is not None:
        value = value.get(stat) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, int | float) else 0.0


def _role_latency(key: str, header: str, field: str, hint: str, terminal: int) -> Column:
    return Column(
        key,
        header,
        lambda r: _role_value(r, field, "p99"),
        Better.LOWER,
        fmt_seconds,
        hint,
        terminal,
    )


# Shown when a run split prefill and decode onto their own instances (``sim.disagg``).
DISAGG_COLUMNS: tuple[Column, ...] = (
    _role_latency(
        "bootstrap_wait_p99",
        "held p99",
        "bootstrap_wait_s",
        "99th percentile wait until the decode side had memory for the request (and the "
        "handshake reached the prefill instance)",
        3,
    ),
    _role_latency(
        "prefill_queue_p99",
        "P queue p99",
        "prefill_queue_wait_s",
        "99th percentile wait on the prefill instance before the prefill started",
        2,
    ),
    _role_latency(
        "transfer_p99",
        "xfer p99",
        "transfer_s",
        "99th percentile KV transfer time, first token to landing (link queueing included)",
        2,
    ),
    _role_latency(
        "decode_queue_p99",
        "D queue p99",
        "decode_queue_wait_s",
        "99th percentile wait on the decode instance from the KV landing to its first token",
        4,
    ),
    Column(
        "prefill_utilisation",
        "P util",
        lambda r: _role_value(r, "prefill_utilisation"),
        Better.NONE,
        fmt_percent,
        "mean share of the makespan the prefill instances spent running batches",
        3,
    ),
    Column(
        "decode_utilisation",
        "D util",
        lambda r: _role_value(r, "decode_utilisation"),
        Better.NONE,
        fmt_percent,
        "mean share of the makespan the decode instances spent running batches",
        3,
    ),
)

WALL_COLUMN = Column(
    "wall_s",
    "wall s",
    lambda r: r.wall_s,
    Better.NONE,
    lambda x: f"{x:.2f}",
    "real seconds the simulator took (not a simulated metric)",
)


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


# ---------------------------------------------------------------------------------------------
# Recommendation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Objective:
    name: str
    get: Callable[[PolicyResult], float]
    better: Better  # HIGHER or LOWER
    fmt: Callable[[float], str]

    def score(self, r: PolicyResult) -> float:
        """Larger is better, whatever the direction."""
        v = self.get(r)
        return v if self.better is Better.HIGHER else -v


# The three axes a policy is judged on; the Pareto set is computed over exactly these.
HIT_RATE = Objective("hit rate", lambda r: r.hit_rate, Better.HIGHER, fmt_percent)
P99_TTFT = Objective("p99 TTFT", lambda r: r.ttft_s.p99, Better.LOWER, fmt_seconds)
THROUGHPUT = Objective(
    "throughput",
    lambda r: r.throughput.output_tokens_per_s,
    Better.HIGHER,
    lambda x: f"{fmt_rate(x)} output tok/s",
)
OBJECTIVES: tuple[Objective, ...] = (HIT_RATE, P99_TTFT, THROUGHPUT)


class Pick(NamedTuple):
    """The best policy on one objective, its value, and the other policies that equal it."""

    policy: str
    value: float
    tied_with: tuple[str, ...]


@dataclass(frozen=True)
class Recommendation:
    """Best policy per objective and the Pareto set, over the policies that served at least
    one request (``excluded`` lists the others), in input order; ``recommended`` is the
    policy the written recommendation (``text``) argues for, against ``baseline``."""

    hit_rate: Pick | None
    p99_ttft: Pick | None
    throughput: Pick | None
    pareto: tuple[str, ...]
    num_policies: int = 0
    recommended: str | None = None
    baseline: str | None = None
    text: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()

    @property
    def best_hit_rate(self) -> str | None:
        return self.hit_rate.policy if self.hit_rate else None

    @property
    def best_p99_ttft(self) -> str | None:
        return self.p99_ttft.policy if self.p99_ttft else None

    @property
    def best_throughput(self) -> str | None:
        return self.throughput.policy if self.throughput else None

    def lines(self) -> list[str]:
        """The written recommendation, then the best policy per objective and the Pareto set."""
        if self.num_policies == 0:
            return ["No results to compare."]
        out = list(self.text)
        picks = (self.hit_rate, self.p99_ttft, self.throughput)
        served = self.num_policies - len(self.excluded)
        if served < 2 or any(p is None for p in picks):
            return out
        if all(p is not None and len(p.tied_with) == served - 1 for p in picks):
            return out  # everything ties: the text says so
        best = []
        for obj, pick in zip(OBJECTIVES, picks, strict=True):
            assert pick is not None
            value = obj.fmt(pick.value)
            if len(pick.tied_with) == served - 1:
                best.append(f"{obj.name}: all tie ({value})")
            else:
                best.append(f"{obj.name}: {', '.join((pick.policy, *pick.tied_with))} ({value})")
        out.append("Best " + "; ".join(best) + ".")
        if len(self.pareto) == 1:
            out.append(f"Pareto set: {self.pareto[0]} (not beaten on any of the three)")
        else:
            out.append(f"Pareto set (hit rate, p99 TTFT, throughput): {', '.join(self.pareto)}")
        return out


# Relative difference below which two values count as equal when recommending. Simulated
# runs of one workload differ by noise of this order (throughput is over the makespan, which
# the last request's finish decides), and a 0.05% edge should not decide a recommendation.
TIE_REL_TOL = 1e-3
# A cost of the recommended policy is a metric at least this much worse than the baseline's.
COST_REL_TOL = 0.05


def _same(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=TIE_REL_TOL, abs_tol=1e-12)


def dominates(a: PolicyResult, b: PolicyResult) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one, where values
    within ``TIE_REL_TOL`` of each other are equal."""
    sa = [o.score(a) for o in OBJECTIVES]
    sb = [o.score(b) for o in OBJECTIVES]
    pairs = list(zip(sa, sb, strict=True))
    return all(x >= y or _same(x, y) for x, y in pairs) and any(
        x > y and not _same(x, y) for x, y in pairs
    )


def _pick(
    results: Sequence[PolicyResult],
    primary: Objective,
    order: Sequence[Objective] = OBJECTIVES,
) -> Pick:
    # The candidates are every policy equal to the best on the primary objective (within
    # TIE_REL_TOL); among them the other objectives decide in ``order``, then input order
    # (max keeps the first maximal element). ``tied_with`` lists the other candidates.
    top = max(primary.score(r) for r in results)
    candidates = [r for r in results if _same(primary.score(r), top)]
    others = [o for o in order if o is not primary]
    best = max(candidates, key=lambda r: tuple(o.score(r) for o in others))
    tied = tuple(r.policy for r in candidates if r is not best)
    return Pick(best.policy, primary.get(best), tied)


SLO_ATTAINMENT = Objective(
    "SLO attainment",
    lambda r: r.slo.attainment if r.slo is not None else 0.0,
    Better.HIGHER,
    fmt_percent,
)


@dataclass(frozen=True)
class _Metric:
    """A metric the written recommendation compares against the baseline."""

    name: str
    get: Callable[[PolicyResult], float]
    better: Better
    fmt: Callable[[float], str]


def _rel_change(new: float, old: float) -> float:
    return (new - old) / abs(old) if old else (math.inf if new else 0.0)


def _change_text(new: float, old: float) -> str:
    """``+30%``, ``-50%``, ``3.0x``; empty from a zero baseline (no ratio to give)."""
    if not old:
        return ""
    change = _rel_change(new, old)
    if abs(change) >= 1.5:
        return f"{new / old:.1f}x"
    return f"{100 * change:+.0f}%"


def _cost_metrics(results: Sequence[PolicyResult]) -> list[_Metric]:
    out = [
        _Metric("hit rate", lambda r: r.hit_rate, Better.HIGHER, fmt_percent),
        _Metric("p99 TTFT", lambda r: r.ttft_s.p99, Better.LOWER, fmt_seconds),
        _Metric("p50 TTFT", lambda r: r.ttft_s.p50, Better.LOWER, fmt_seconds),
        _Metric("p50 TPOT", lambda r: r.tpot_s.p50, Better.LOWER, fmt_seconds),
        _Metric("p99 E2E latency", lambda r: r.e2e_s.p99, Better.LOWER, fmt_seconds),
        _Metric("longest queue wait", lambda r: r.queue_wait_s.max, Better.LOWER, fmt_seconds),
        _Metric(
            "output throughput",
            lambda r: r.throughput.output_tokens_per_s,
            Better.HIGHER,
            lambda x: f"{fmt_rate(x)} tok/s",
        ),
        _Metric("retractions", lambda r: float(r.retractions), Better.LOWER, fmt_int),
        _Metric("failed requests", lambda r: float(r.num_failed), Better.LOWER, fmt_int),
    ]
    if any(r.tenants for r in results):
        out.append(_Metric("fairness", lambda r: r.fairness_jain, Better.HIGHER, fmt_fraction))
    if any(r.slo is not None for r in results):
        out.insert(0, _Metric("SLO attainment", SLO_ATTAINMENT.get, Better.HIGHER, fmt_percent))
    return out


def _differs(a: float, b: float) -> bool:
    return abs(_rel_change(a, b)) > COST_REL_TOL


def _worse(m: _Metric, rec: PolicyResult, base: PolicyResult) -> bool:
    a, b = m.get(rec), m.get(base)
    if m.fmt(a) == m.fmt(b):
        return False
    if m.better is Better.HIGHER:
        return a < b and _rel_change(a, b) < -COST_REL_TOL
    return a > b and _rel_change(a, b) > COST_REL_TOL


def _written(
    served: Sequence[PolicyResult], rec: PolicyResult, base: PolicyResult | None, slo: bool
) -> list[str]:
    """Which policy, why, at what cost, with the numbers (against ``base``)."""
    if base is None:
        return [
            f"Only {rec.policy} served requests: nothing to compare it with "
            "(--policy all compares every policy)."
        ]
    if slo:
        why = (
            f"the most requests within the SLO: {fmt_percent(SLO_ATTAINMENT.get(rec))} "
            f"(goodput {fmt_rate(rec.slo.goodput_requests_per_s if rec.slo else 0.0)} req/s)"
        )
    else:
        why = "the lowest p99 TTFT among the policies no other beats on hit rate, p99 TTFT and "
        why += "throughput at once"
    if all(all(_same(o.score(r), o.score(rec)) for o in OBJECTIVES) for r in served):
        return [
            f"All {len(served)} policies perform alike here (hit rate {fmt_percent(rec.hit_rate)}, "
            f"p99 TTFT {fmt_seconds(rec.ttft_s.p99)}, "
            f"{fmt_rate(rec.throughput.output_tokens_per_s)} output tok/s): the waiting-queue "
            "policy does not matter for this workload; keep the default, fcfs."
        ]
    lines = [f"Recommended: {rec.policy}, {why}."]
    numbers = []
    headline = {"SLO attainment", "hit rate", "p99 TTFT", "output throughput"}
    for m in _cost_metrics(served):
        a, b = m.get(rec), m.get(base)
        if m.name not in headline and (m.fmt(a) == m.fmt(b) or not _differs(a, b)):
            continue
        change = "" if m.fmt(a) == m.fmt(b) or not _change_text(a, b) else f", {_change_text(a, b)}"
        numbers.append(f"{m.name} {m.fmt(a)} ({base.policy} {m.fmt(b)}{change})")
    lines.append(f"Against {base.policy}: " + "; ".join(numbers) + ".")
    costs = [
        f"{m.name} {m.fmt(m.get(rec))} vs {m.fmt(m.get(base))}"
        for m in _cost_metrics(served)
        if _worse(m, rec, base)
    ]
    if costs:
        lines.append(f"Cost against {base.policy}: " + "; ".join(costs) + ".")
    else:
        lines.append(f"Cost: none: at least as good as {base.policy} on every metric compared.")
    equal = [
        r.policy
        for r in served
        if r is not rec and all(_same(o.score(r), o.score(rec)) for o in OBJECTIVES)
    ]
    if equal:
        lines.append(f"Equivalent on all three objectives: {', '.join(equal)}.")
    return lines


def recommend(results: Sequence[PolicyResult]) -> Recommendation:
    if not results:
        return Recommendation(None, None, None, ())
    served = [r for r in results if not r.served_nothing]
    excluded = tuple(r.policy for r in results if r.served_nothing)
    if not served:
        return Recommendation(
            None,
            None,
            None,
            (),
            num_policies=len(results),
            text=("No policy served any request: nothing to recommend.",),
            excluded=excluded,
        )
    pareto = [
        r
        for i, r in enumerate(served)
        if not any(dominates(q, r) for j, q in enumerate(served) if j != i)
    ]
    slo = any(r.slo is not None for r in served)
    if slo:
        chosen = _pick(served, SLO_ATTAINMENT, (P99_TTFT, THROUGHPUT, HIT_RATE))
    else:
        chosen = _pick(pareto, P99_TTFT, (P99_TTFT, THROUGHPUT, HIT_RATE))
    rec = next(r for r in served if r.policy == chosen.policy)
    others = [r for r in served if r is not rec]
    base = next((r for r in others if r.policy == "fcfs"), others[0] if others else None)
    text = _written(served, rec, base, slo)
    if excluded:
        text.append(f"Not compared (served no request): {', '.join(excluded)}.")
    return Recommendation(
        hit_rate=_pick(served, HIT_RATE),
        p99_ttft=_pick(served, P99_TTFT),
        throughput=_pick(served, THROUGHPUT),
        pareto=tuple(r.policy for r in pareto),
        num_policies=len(results),
        recommended=rec.policy,
        baseline=None if base is None else base.policy,
        text=tuple(text),
        excluded=excluded,
    )


# ---------------------------------------------------------------------------------------------
# Warnings
# ---------------------------------------------------------------------------------------------


def load_warnings(results: Sequence[PolicyResult]) -> list[str]:
    """Overload warnings: one line saying what arrived, one per overloaded policy, one with
    what to do. Empty when no run was overloaded (``metrics.LoadCheck``)."""
    over = [r for r in results if r.load is not None and r.load.overloaded]
    if not over:
        return []
    load = over[0].load
    assert load is not None
    names = "every policy" if len(over) == len(results) > 1 else ", ".join(r.policy for r in over)
    lines = [
        f"overloaded ({names}): requests arrived at {fmt_rate(load.offered_requests_per_s)} "
        f"req/s for {fmt_seconds(load.arrival_span_s)}, faster than they were served, and the "
        "queue grew:"
    ]
    width = max(len(r.policy) for r in over)
    for r in over:
        lc = r.load
        assert lc is not None
        lines.append(
            f"  {r.policy:<{width}}  served {fmt_rate(lc.served_requests_per_s)} req/s "
            f"(offered {lc.load_ratio:.1f}x that); {lc.backlog:,} of {r.num_requests:,} "
            f"requests not started when the last arrived; peak queue {r.peak_queue_len:,}"
        )
    lines.append(
        "  Latencies mostly measure queueing: lower --request-rate, or add capacity "
        "(--dp, --tp, --gpu)."
    )
    return lines


def served_nothing_lines(
    results: Sequence[PolicyResult], reasons: Mapping[str, str] | None = None
) -> list[str]:
    """Policies that completed no request, grouped by reason (the main one, when known)."""
    groups: dict[tuple[int, str], list[str]] = {}
    for r in results:
        if r.served_nothing:
            key = (r.num_requests, (reasons or {}).get(r.policy, ""))
            groups.setdefault(key, []).append(r.policy)
    out = []
    for (n, why), names in groups.items():
        if len(names) == len(results) > 1:
            head = f"no policy ({', '.join(names)}) served any of the {n:,} requests"
        else:
            head = f"{', '.join(names)} served none of the {n:,} requests"
        out.append(head + (f": {why}" if why else ""))
    return out


# ---------------------------------------------------------------------------------------------
# Rendering and files
# ---------------------------------------------------------------------------------------------


def _arrow(better: Better) -> str:
    return {Better.HIGHER: " ↑", Better.LOWER: " ↓", Better.NONE: ""}[better]


def _header(c: Column) -> str:
    """A column's header in the HTML report (the terminal's directions are in its legend)."""
    return c.header + _arrow(c.better)


def legend_line(cols: Sequence[Column], results: Sequence[PolicyResult]) -> str:
    """What the table's columns mean, in one line."""
    keys = {c.key for c in cols}
    higher = [c.header for c in cols if c.better is Better.HIGHER]
    parts = [f"higher is better for {', '.join(higher)}, lower for the rest; best in green"]
    if "hit_rate" in keys and results:
        parts.append(
            f"hit rate = cached/prompt tokens (optimal {fmt_percent(results[0].optimal_hit_rate)})"
        )
    if "tpot_p50" in keys:
        parts.append("TPOT = time per output token after the first")
    if "retractions" in keys:
        parts.append("retract = requests retracted for decode memory")
    if "failed" in keys:
        parts.append("failed = rejected + aborted")
    if "slo_attainment" in keys:
        parts.append("SLO met = share of requests within the SLO")
    if "fairness_jain" in keys:
        parts.append("fair = Jain's index of tenants' service (1 = equal)")
    if keys & {c.key for c in DISAGG_COLUMNS}:
        parts.append(
            "held = waiting for decode memory, P/D queue = waiting on the prefill/decode "
            "instance, xfer = KV transfer, util = busy share of the makespan"
        )
    return "; ".join(parts) + "."


class Runtime(NamedTuple):
    """How long the runs of one command took together, and in how many processes."""

    elapsed_s: float
    processes: int


def runtime_line(results: Sequence[PolicyResult], runtime: Runtime | None = None) -> str:
    """The simulator's own runtime: each run's event loop, and the real time of them all
    (their sum when they ran one after another)."""
    per = ", ".join(f"{r.policy} {r.wall_s:.2f} s" for r in results)
    if runtime is None or runtime.processes <= 1:
        total = sum(r.wall_s for r in results)
        return f"Simulator runtime (real time): {total:.2f} s ({per})"
    return (
        f"Simulator runtime (real time): {runtime.elapsed_s:.2f} s for {len(results)} policies "
        f"in {runtime.processes} processes ({per})"
    )


def render_comparison(
    results: Sequence[PolicyResult],
    console: Console,
    *,
    title: str | None = None,
    show_wall: bool = True,
    runtime: Runtime | None = None,
) -> Recommendation:
    """Print the comparison as one table that fits the console (the least important columns
    dropped on a narrow one, and named), a legend line, the simulator's own runtime once
    (``runtime``: the runs' real time, when they ran side by side), and the written
    recommendation; returns the recommendation."""
    from rich import box
    from rich.table import Table

    cols = terminal_columns(results, console.width)
    dropped = [c for c in columns_for(results) if c.terminal and c not in cols]
    best = [best_rows(results, c) for c in cols]
    table = Table(
        title=title or "Policy comparison",
        header_style="bold",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("policy", no_wrap=True, min_width=_policy_width(results))
    for c, w in zip(cols, _cell_widths(results, cols), strict=True):
        table.add_column(c.header, justify="right", min_width=w, no_wrap=True)
    for i, r in enumerate(results):
        cells = [f"[bold {policy_color(i)}]{_rich_escape(r.policy)}[/]"]
        for c, b in zip(cols, best, strict=True):
            text = (
                "-"
                if r.served_nothing and c.key not in ("failed", "retractions")
                else c.fmt(c.get(r))
            )
            cells.append(f"[bold green]{text}[/]" if i in b else text)
        table.add_row(*cells)
    console.print(table)
    legend = legend_line(cols, results)
    if dropped:
        legend += f" Not shown at this width: {', '.join(c.header for c in dropped)} (see --json)."
    console.print(_rich_escape(legend), style="dim")
    if show_wall and results:
        console.print(_rich_escape(runtime_line(results, runtime)), style="dim")
    rec = recommend(results)
    for line in rec.lines():
        console.print(_rich_escape(line))
    return rec


def _rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def flatten_result(result: PolicyResult) -> dict[str, str | int | float | bool | None]:
    """One CSV row: nested objects become dotted keys (``ttft_s.p99``); the per-tenant list is
    left out (it is in the JSON), other lists are JSON-encoded."""
    row: dict[str, str | int | float | bool | None] = {}

    def walk(prefix: str, value: JSONValue) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(value, list):
            row[prefix] = json.dumps(value)
        else:
            row[prefix] = value

    data = result.to_json()
    data.pop("tenants", None)
    walk("", data)
    return row


def write_csv(results: Sequence[PolicyResult], path: str | Path) -> None:
    """One row per policy; columns are the union of every row's keys in first-seen order."""
    rows = [flatten_result(r) for r in results]
    fields: dict[str, None] = {}
    for row in rows:
        fields.update(dict.fromkeys(row))
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), restval="")
        writer.writeheader()
        writer.writerows(rows)


def to_jsonable(value: Any) -> JSONValue:
    """Plain JSON data from configs and workload descriptions: dataclasses and mappings become
    objects, enums their value, paths and unknown objects strings, tuples/sets lists, numpy
    arrays and scalars Python lists and numbers; non-finite floats become None so the output is strict JSON."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [to_jsonable(v) for v in items]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy array or scalar
        return to_jsonable(value.tolist())
    return str(value)


def write_json(
    path: str | Path,
    workload_info: Mapping[str, Any],
    config: Mapping[str, Any],
    results: Sequence[PolicyResult],
    meta: Mapping[str, Any] | None = None,
) -> None:
    """``{"meta": ..., "workload": ..., "config": ..., "results": [PolicyResult.to_json(),
    ...]}``; ``meta`` says what was run (version, time, command)."""
    doc = {
        "meta": to_jsonable(meta or {}),
        "workload": to_jsonable(workload_info),
        "config": to_jsonable(config),
        "results": [to_jsonable(r.to_json()) for r in results],
    }
    with Path(path).open("w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, allow_nan=False)
        f.write("\n")


def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def is_parquet(path: str | Path) -> bool:
    return Path(path).suffix.lower() in (".parquet", ".pq")


def write_requests(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Per-request rows (``metrics.REQUEST_COLUMNS``) as CSV, or as Parquet when the file name
    ends in ``.parquet`` (needs pyarrow). Empty values are empty CSV cells / Parquet nulls."""
    from radixsched.results.metrics import REQUEST_COLUMNS

    if is_parquet(path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = (
            pa.Table.from_pylist([dict(r) for r in rows])
            if rows
            else pa.table({c: pa.array([], type=pa.null()) for c in REQUEST_COLUMNS})
        )
        pq.write_table(table, str(path))
        return
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(REQUEST_COLUMNS), restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})

"""Comparison of policy results: a rich table, a recommendation, CSV and JSON output.

The table and the HTML report share ``COLUMNS`` (what is compared, which direction is better)
and ``policy_color`` (one colour per policy everywhere), so the two views never disagree.
"""

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

from radixsched.sim.metrics import JSONValue, PolicyResult

if TYPE_CHECKING:
    from rich.console import Console

# Colour-blind-safe categorical palette (Okabe-Ito order, then Tableau extras); policies take
# colours by their position in the result list, so table, legend and charts agree.
PALETTE: tuple[str, ...] = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#D55E00",
    "#56B4E9",
    "#8C6D31",
    "#7F7F7F",
    "#17BECF",
    "#BCBD22",
)


def policy_color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


class Better(enum.Enum):
    HIGHER = "higher"
    LOWER = "lower"
    NONE = "none"  # informational, never highlighted


def fmt_seconds(x: float) -> str:
    """Duration with a readable unit and three significant digits."""
    if x == 0:
        return "0"
    ax = abs(x)
    if ax < 1e-3:
        return f"{x * 1e6:.3g} µs"
    if ax < 1:
        return f"{x * 1e3:.3g} ms"
    if ax < 1000:
        return f"{x:.3g} s"
    return f"{x:,.0f} s"


def fmt_rate(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def fmt_percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def fmt_points(x: float) -> str:
    """A hit-rate gap in percentage points."""
    return f"{100 * x:.1f} pp"


def fmt_int(x: float) -> str:
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
    hint: str = ""  # one-line explanation (HTML tooltip)


COLUMNS: tuple[Column, ...] = (
    Column(
        "hit_rate",
        "hit rate",
        lambda r: r.hit_rate,
        Better.HIGHER,
        fmt_percent,
        "cached prompt tokens / prompt tokens",
    ),
    Column(
        "hit_rate_gap",
        "gap",
        lambda r: r.hit_rate_gap,
        Better.LOWER,
        fmt_points,
        "optimal hit rate of the workload minus the achieved one",
    ),
    Column(
        "ttft_p50",
        "TTFT p50",
        lambda r: r.ttft_s.p50,
        Better.LOWER,
        fmt_seconds,
        "median time to first token",
    ),
    Column(
        "ttft_p99",
        "TTFT p99",
        lambda r: r.ttft_s.p99,
        Better.LOWER,
        fmt_seconds,
        "99th percentile time to first token",
    ),
    Column(
        "tpot_mean",
        "TPOT mean",
        lambda r: r.tpot_s.mean,
        Better.LOWER,
        fmt_seconds,
        "mean time per output token after the first",
    ),
    Column(
        "queue_wait_p99",
        "queue p99",
        lambda r: r.queue_wait_s.p99,
        Better.LOWER,
        fmt_seconds,
        "99th percentile wait before first scheduling (who starves)",
    ),
    Column(
        "queue_wait_max",
        "queue max",
        lambda r: r.queue_wait_s.max,
        Better.LOWER,
        fmt_seconds,
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
    ),
    Column(
        "retractions",
        "retract",
        lambda r: float(r.retractions),
        Better.LOWER,
        fmt_int,
        "decode-memory retractions",
    ),
    Column(
        "wall_s",
        "wall s",
        lambda r: r.wall_s,
        Better.NONE,
        lambda x: f"{x:.2f}",
        "real seconds the simulation took",
    ),
)

FAIRNESS_COLUMN = Column(
    "fairness_jain",
    "fair",
    lambda r: r.fairness_jain,
    Better.HIGHER,
    fmt_fraction,
    "Jain's index over tenants' served/demanded tokens at the fairness horizon (1 = equal)",
)


def columns_for(results: Sequence[PolicyResult]) -> tuple[Column, ...]:
    """The table's columns; fairness only when some run had more than one tenant."""
    if any(r.tenants for r in results):
        return (*COLUMNS[:-1], FAIRNESS_COLUMN, COLUMNS[-1])
    return COLUMNS


def best_rows(results: Sequence[PolicyResult], column: Column) -> frozenset[int]:
    """Indices of the rows holding the column's best value. Ties are judged on the displayed
    text, so two cells that read the same are both best or neither; nothing is highlighted
    with fewer than two rows, when every row reads the same, or for ``Better.NONE``."""
    if column.better is Better.NONE or len(results) < 2:
        return frozenset()
    values = [column.get(r) for r in results]
    texts = [column.fmt(v) for v in values]
    if len(set(texts)) == 1:
        return frozenset()
    best = max(values) if column.better is Better.HIGHER else min(values)
    best_text = column.fmt(best)
    return frozenset(i for i, t in enumerate(texts) if t == best_text)


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
    """Best policy per objective (None without results) and the Pareto set, in input order."""

    hit_rate: Pick | None
    p99_ttft: Pick | None
    throughput: Pick | None
    pareto: tuple[str, ...]
    num_policies: int = 0

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
        out: list[str] = []
        for obj, pick in zip(
            OBJECTIVES, (self.hit_rate, self.p99_ttft, self.throughput), strict=True
        ):
            if pick is None:
                return ["No results to compare."]
            value = obj.fmt(pick.value)
            if self.num_policies > 1 and len(pick.tied_with) == self.num_policies - 1:
                out.append(f"Best {obj.name}: all policies tie ({value})")
            elif pick.tied_with:
                names = ", ".join((pick.policy, *pick.tied_with))
                out.append(f"Best {obj.name}: {names} (tie, {value})")
            else:
                out.append(f"Best {obj.name}: {pick.policy} ({value})")
        if len(self.pareto) == 1:
            out.append(f"Pareto set: {self.pareto[0]} (not beaten on any of the three)")
        else:
            out.append(f"Pareto set (hit rate, p99 TTFT, throughput): {', '.join(self.pareto)}")
        return out


# Relative difference below which two values count as equal when recommending. Simulated
# runs of one workload differ by noise of this order (throughput is over the makespan, which
# the last request's finish decides), and a 0.05% edge should not decide a recommendation.
TIE_REL_TOL = 1e-3


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


def _pick(results: Sequence[PolicyResult], primary: Objective) -> Pick:
    # The candidates are every policy equal to the best on the primary objective (within
    # TIE_REL_TOL); among them the other objectives decide in OBJECTIVES order, then input
    # order (max keeps the first maximal element). ``tied_with`` lists the other candidates.
    top = max(primary.score(r) for r in results)
    candidates = [r for r in results if _same(primary.score(r), top)]
    others = [o for o in OBJECTIVES if o is not primary]
    best = max(candidates, key=lambda r: tuple(o.score(r) for o in others))
    tied = tuple(r.policy for r in candidates if r is not best)
    return Pick(best.policy, primary.get(best), tied)


def recommend(results: Sequence[PolicyResult]) -> Recommendation:
    if not results:
        return Recommendation(None, None, None, ())
    pareto = tuple(
        r.policy
        for i, r in enumerate(results)
        if not any(dominates(q, r) for j, q in enumerate(results) if j != i)
    )
    return Recommendation(
        hit_rate=_pick(results, HIT_RATE),
        p99_ttft=_pick(results, P99_TTFT),
        throughput=_pick(results, THROUGHPUT),
        pareto=pareto,
        num_policies=len(results),
    )


# ---------------------------------------------------------------------------------------------
# Rendering and files
# ---------------------------------------------------------------------------------------------


def _arrow(better: Better) -> str:
    return {Better.HIGHER: " ↑", Better.LOWER: " ↓", Better.NONE: ""}[better]


def column_chunks(widths: Sequence[int], first: int, available: int) -> list[list[int]]:
    """Split column indices into consecutive groups that each fit ``available`` characters
    beside the first (policy) column; every column is 3 characters wider than its content
    (padding and separator). A column wider than the space on its own still gets a group."""
    chunks: list[list[int]] = [[]]
    used = first + 3
    for i, w in enumerate(widths):
        if chunks[-1] and used + w + 3 > available:
            chunks.append([])
            used = first + 3
        chunks[-1].append(i)
        used += w + 3
    return chunks


def render_comparison(
    results: Sequence[PolicyResult], console: Console, *, title: str | None = None
) -> Recommendation:
    """Print the comparison table and the recommendation; returns the recommendation.

    Cells never wrap or get cut: on a terminal too narrow for all columns the table is
    printed in several parts, each starting with the policy column."""
    from rich import box
    from rich.table import Table

    cols = columns_for(results)
    texts = [[c.fmt(c.get(r)) for r in results] for c in cols]
    best = [best_rows(results, c) for c in cols]
    headers = [c.header + _arrow(c.better) for c in cols]
    # Headers wrap at spaces, so a column needs its widest value or its longest header word.
    widths = [
        max([len(t) for t in col_texts] + [len(w) for w in h.split()])
        for col_texts, h in zip(texts, headers, strict=True)
    ]
    first = max([len(r.policy) for r in results] + [len("policy")])
    chunks = column_chunks(widths, first, console.width)
    for part, chunk in enumerate(chunks):
        name = title or "Policy comparison"
        if len(chunks) > 1:
            name = f"{name} ({part + 1}/{len(chunks)})"
        table = Table(title=name, header_style="bold", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("policy", no_wrap=True, min_width=first)
        for k in chunk:
            table.add_column(headers[k], justify="right", min_width=widths[k])
        for i, r in enumerate(results):
            cells = [f"[bold {policy_color(i)}]{_rich_escape(r.policy)}[/]"]
            for k in chunk:
                text = texts[k][i]
                cells.append(f"[bold green]{text}[/]" if i in best[k] else text)
            table.add_row(*cells)
        console.print(table)
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
) -> None:
    """``{"workload": ..., "config": ..., "results": [PolicyResult.to_json(), ...]}``."""
    doc = {
        "workload": to_jsonable(workload_info),
        "config": to_jsonable(config),
        "results": [to_jsonable(r.to_json()) for r in results],
    }
    with Path(path).open("w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, allow_nan=False)
        f.write("\n")

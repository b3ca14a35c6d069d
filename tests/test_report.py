"""Comparison table, recommendation/Pareto logic, CSV/JSON output and the HTML report
(rendered in headless Chromium when it is installed: Debian package ``chromium``)."""

from __future__ import annotations

import csv
import enum
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from radixsched.policies import POLICIES
from radixsched.request import FinishReason, FinishState, Req
from radixsched.results.charts import plotly_js
from radixsched.results.columns import COLUMNS, DISAGG_COLUMNS, Column, best_rows
from radixsched.results.format import PALETTE, Better, fmt_rate, fmt_seconds
from radixsched.results.metrics import (
    ADDITIONAL_KEYS,
    REQUIRED_KEYS,
    PolicyResult,
    Throughput,
    summarize,
)
from radixsched.results.recommend import dominates, load_warnings, recommend
from radixsched.results.report import cdf_points, identical_groups, render_report, write_report
from radixsched.results.series import TimeSeries
from radixsched.results.service import TenantResult
from radixsched.results.stats import Stats
from radixsched.results.table import render_comparison
from radixsched.results.writers import write_csv, write_json
from samples import ttft_samples


def result(policy: str, hit: float, p99: float, tput: float, **kw: object) -> PolicyResult:
    s = Stats(mean=p99 / 2, std=p99 / 4, p50=p99 / 2, p90=p99, p95=p99, p99=p99, max=p99, n=10)
    base = PolicyResult(
        policy=policy,
        hit_rate=hit,
        optimal_hit_rate=0.9,
        prefill_tokens_computed=1000,
        num_requests=10,
        ttft_s=s,
        tpot_s=s,
        itl_s=s,
        e2e_s=s,
        queue_wait_s=s,
        throughput=Throughput(tput / 100, tput * 10, tput),
        makespan_s=10.0,
        retractions=0,
        preemptions=0,
        wall_s=0.1,
        num_completed=10,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


# ---- recommendation --------------------------------------------------------------------------


def test_recommend_and_pareto() -> None:
    a = result("a", hit=0.5, p99=1.0, tput=100.0)
    b = result("b", hit=0.6, p99=2.0, tput=100.0)  # better hit, worse TTFT than a: both Pareto
    c = result("c", hit=0.4, p99=3.0, tput=90.0)  # a beats it on all three
    rec = recommend([a, b, c])
    assert rec.hit_rate is not None and rec.hit_rate.policy == "b"
    assert rec.p99_ttft is not None and rec.p99_ttft.policy == "a"
    # a and b tie on throughput; the tie breaks on hit rate (the next objective).
    assert rec.throughput is not None and rec.throughput.policy == "b"
    assert rec.pareto == ("a", "b")
    assert rec.throughput is not None and rec.throughput.tied_with == ("a",)
    assert rec.hit_rate is not None and rec.hit_rate.value == 0.6 and rec.hit_rate.tied_with == ()
    lines = rec.lines()
    # The recommendation: the Pareto policy with the lowest p99 TTFT, against the first policy.
    assert rec.recommended == "a" and rec.baseline == "b"
    assert lines[0].startswith("Recommended: a, the lowest p99 TTFT")
    assert lines[1].startswith("Against b: hit rate 50.0% (b 60.0%, -17%); p99 TTFT 1.00 s")
    assert lines[2] == "Cost against b: hit rate 50.0% vs 60.0%."
    assert lines[-2:] == [
        "Best hit rate: b (60.0%); p99 TTFT: a (1.00 s); throughput: b, a (100 output tok/s).",
        "Pareto set (hit rate, p99 TTFT, throughput): a, b",
    ]
    assert dominates(a, c) and not dominates(c, a)
    assert not dominates(a, b) and not dominates(b, a)


def test_pareto_single_winner_and_identical_results() -> None:
    a = result("a", hit=0.7, p99=1.0, tput=200.0)
    b = result("b", hit=0.6, p99=1.0, tput=200.0)  # equal on two, worse on one: dominated
    assert recommend([a, b]).pareto == ("a",)
    twin = result("twin", hit=0.7, p99=1.0, tput=200.0)  # identical: neither dominates
    assert recommend([a, twin]).pareto == ("a", "twin")
    tie = recommend([a, twin]).hit_rate  # full tie: first in input order
    assert tie is not None and tie.policy == "a"
    assert "Pareto set: a" in "\n".join(recommend([a, b]).lines())
    same = recommend([a, twin]).lines()
    assert len(same) == 1 and same[0].startswith("All 2 policies perform alike here")


def test_recommend_treats_noise_as_a_tie() -> None:
    # Throughputs 0.04% apart are a tie (TIE_REL_TOL): b's tiny edge neither makes it the
    # throughput pick nor keeps it in the Pareto set, since a beats it on hit rate and TTFT.
    a = result("a", hit=0.6, p99=1.0, tput=2580.0)
    b = result("b", hit=0.5, p99=2.0, tput=2581.0)
    rec = recommend([a, b])
    assert rec.pareto == ("a",)
    assert rec.throughput is not None
    assert (rec.throughput.policy, rec.throughput.tied_with) == ("a", ("b",))
    assert dominates(a, b)
    c = result("c", hit=0.5, p99=2.0, tput=2700.0)  # 4.6% faster: a real edge
    assert recommend([a, c]).pareto == ("a", "c")


objective_values = st.tuples(
    st.sampled_from([0.2, 0.5, 0.8]),
    st.sampled_from([0.5, 1.0, 2.0]),
    st.sampled_from([50.0, 100.0, 150.0]),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(objective_values, min_size=1, max_size=6))
def test_pareto_set_properties(values: list[tuple[float, float, float]]) -> None:
    rs = [result(f"p{i}", *v) for i, v in enumerate(values)]
    pareto = set(recommend(rs).pareto)
    assert pareto  # a finite set always has an undominated member
    for r in rs:
        if r.policy in pareto:
            assert not any(dominates(q, r) for q in rs)
        else:
            assert any(dominates(q, r) for q in rs if q.policy in pareto)
    rec = recommend(rs)
    assert rec.hit_rate is not None and rec.hit_rate.value == max(v[0] for v in values)
    assert rec.p99_ttft is not None and rec.p99_ttft.value == min(v[1] for v in values)


def test_recommend_empty() -> None:
    rec = recommend([])
    assert (rec.hit_rate, rec.p99_ttft, rec.throughput, rec.pareto) == (
        None,
        None,
        None,
        (),
    )
    assert rec.lines() == ["No results to compare."]


def test_policies_that_served_nothing_are_never_best() -> None:
    served = result("lpm", hit=0.3, p99=9.0, tput=10.0)
    # Nothing completed: every latency is an empty 0, which must not read as the best TTFT.
    empty = result("fcfs", hit=0.0, p99=0.0, tput=0.0, num_completed=0)
    rec = recommend([empty, served])
    assert rec.excluded == ("fcfs",) and rec.recommended == "lpm"
    assert rec.p99_ttft is not None and rec.p99_ttft.policy == "lpm"
    assert any("Not compared (served no request): fcfs" in ln for ln in rec.lines())
    col = next(c for c in COLUMNS if c.key == "ttft_p99")
    assert best_rows([empty, served, result("x", 0.3, 10.0, 10.0)], col) == {1}
    nothing = recommend([empty, replace(empty, policy="lof")])
    assert nothing.recommended is None
    assert nothing.lines() == ["No policy served any request: nothing to recommend."]


def test_written_recommendation_names_the_cost() -> None:
    base = result("fcfs", hit=0.4, p99=4.0, tput=100.0)
    # lpm is faster and hits more, but starves someone: its longest queue wait is 3x fcfs's.
    lpm = result("lpm", hit=0.8, p99=2.0, tput=130.0)
    lpm = replace(lpm, queue_wait_s=lpm.queue_wait_s._replace(max=12.0))
    text = recommend([base, lpm]).text
    assert text[0].startswith("Recommended: lpm")
    assert "hit rate 80.0% (fcfs 40.0%, +100%)" in text[1]
    assert "p99 TTFT 2.00 s (fcfs 4.00 s, -50%)" in text[1]
    assert "output throughput 130 tok/s (fcfs 100 tok/s, +30%)" in text[1]
    assert text[2] == "Cost against fcfs: longest queue wait 12.0 s vs 4.00 s."


def test_slo_attainment_decides_the_recommendation_when_given() -> None:
    from radixsched.results.service import SloResult

    def slo(att: float) -> SloResult:
        return SloResult(100.0, None, int(att * 10), 10, att, att)

    fast = result("fast", hit=0.5, p99=1.0, tput=100.0, slo=slo(0.6))
    good = result("good", hit=0.5, p99=2.0, tput=100.0, slo=slo(0.9))
    rec = recommend([fast, good])
    assert rec.recommended == "good"
    assert rec.text[0].startswith("Recommended: good, the most requests within the SLO: 90.0%")


# ---- table -----------------------------------------------------------------------------------


def column(key: str) -> Column:
    return next(c for c in COLUMNS if c.key == key)


def test_best_rows_directions_and_ties() -> None:
    rs = [
        result("a", hit=0.5, p99=1.0, tput=100.0),
        result("b", hit=0.6, p99=2.0, tput=100.0),
        result("c", hit=0.6, p99=3.0, tput=90.0),
    ]
    assert best_rows(rs, column("hit_rate")) == {1, 2}  # higher is better, tie highlighted twice
    assert best_rows(rs, column("ttft_p99")) == {0}  # lower is better
    assert best_rows(rs, column("retractions")) == set()  # all equal: nothing to highlight
    wall = Column("wall_s", "wall s", lambda r: r.wall_s, Better.NONE, str)
    assert best_rows(rs, wall) == set()  # informational column
    assert best_rows(rs[:1], column("hit_rate")) == set()  # a single row is not a comparison
    # Values that print the same are a tie even if the floats differ.
    close = [
        result("x", 0.5, 0.020001, 1.0),
        result("y", 0.5, 0.019999, 1.0),
        result("z", 0.5, 1.0, 1.0),
    ]
    assert best_rows(close, column("ttft_p99")) == {0, 1}
    assert {c.better for c in (*COLUMNS, *DISAGG_COLUMNS)} == set(Better)


def test_render_comparison_prints_table_and_recommendation() -> None:
    console = Console(record=True, width=220, color_system=None)
    rs = [result("fcfs", 0.2, 3.0, 50.0), result("lpm[x]", 0.7, 1.0, 60.0)]
    rec = render_comparison(rs, console)
    text = console.export_text()
    assert "lpm[x]" in text  # markup in a policy name is escaped, not interpreted
    assert "70.0%" in text and "1.00 s" in text
    assert "Recommended: lpm[x]" in text and "Best hit rate: lpm[x]" in text
    assert rec.pareto == ("lpm[x]",)
    # The simulator's own runtime once, below the table, never as a column.
    assert text.count("Simulator runtime (real time): 0.20 s") == 1 and "wall" not in text


def test_a_console_without_styles_gets_the_same_text_unhighlighted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    from rich.highlighter import ReprHighlighter

    rs = [result("fcfs", 0.2, 3.0, 50.0), result("lpm", 0.7, 1.0, 60.0)]
    shown = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="truecolor")
    render_comparison(rs, shown)
    colored = shown.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[1;36m60" in colored  # a terminal's numbers are highlighted, as ever

    def never(self: object, text: object) -> None:
        raise AssertionError("highlighted for a console that shows no styles")

    monkeypatch.setattr(ReprHighlighter, "highlight", never)
    plain = Console(file=io.StringIO(), width=100)  # a file: no color system
    render_comparison(rs, plain)
    text = plain.file.getvalue()  # type: ignore[attr-defined]
    assert text == re.sub(r"\x1b\[[0-9;]*m", "", colored) and "\x1b" not in text


@pytest.mark.parametrize("width", [100, 80, 60])
def test_one_table_fits_the_terminal(width: int) -> None:
    console = Console(record=True, width=width, color_system=None)
    rs = [
        result("shortest-prefill-first", 0.2, 3000.0, 50.0, retractions=1234),
        result("lpm", 0.7, 0.0123, 6000.0, num_completed=7),
    ]
    render_comparison(rs, console)
    lines = console.export_text().splitlines()
    assert max(len(ln) for ln in lines) <= width
    header = [ln for ln in lines if ln.startswith("policy ")]
    assert len(header) == 1 and "TTFT p99" in header[0]
    assert "failed" in header[0]  # some requests failed: that column stays
    legend = " ".join(" ".join(lines).split())
    assert "higher is better for hit rate" in legend and "best in green" in legend
    if width < 100:
        assert "Not shown at this width:" in legend


def test_fmt_seconds_units() -> None:
    assert [fmt_seconds(x) for x in (0.0, 2e-5, 0.0123, 1.5, 28.0, 655.2, 1617.3, 12345.0)] == [
        "0",
        "20.0 µs",
        "12.3 ms",
        "1.50 s",
        "28.0 s",
        "655 s",
        "1,617 s",
        "12,345 s",
    ]
    # Three significant digits everywhere, also where rounding reaches the next unit.
    assert [fmt_seconds(x) for x in (0.9997, 0.0009996, 9.996, 99.96)] == [
        "1.00 s",
        "1.00 ms",
        "10.0 s",
        "100 s",
    ]
    assert [fmt_rate(x) for x in (0.5, 12.34, 4245.3)] == ["0.500", "12.3", "4,245"]


def test_policy_colours_are_distinct() -> None:
    def rgb(c: str) -> tuple[int, ...]:
        return tuple(int(c[i : i + 2], 16) for i in (1, 3, 5))

    cols = [rgb(c) for c in PALETTE[: len(POLICIES)]]
    for i, a in enumerate(cols):
        for b in cols[i + 1 :]:
            assert sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5 > 60, (a, b)


def test_overload_warning_lines() -> None:
    from radixsched.results.service import LoadCheck

    busy = result("fcfs", 0.5, 1.0, 100.0, load=LoadCheck(6.1, 2.0, 654.0, 2200, 1.0, True))
    calm = result("lpm", 0.5, 1.0, 100.0, load=LoadCheck(1.0, 2.0, 10.0, 0, 1.0, False))
    lines = load_warnings([busy, calm])
    assert lines[0].startswith("overloaded (fcfs): requests arrived at 6.10 req/s for 654 s")
    assert "served 2.00 req/s (offered 3.0x that); 2,200 of 10 requests" in lines[1]
    assert "radixsched plan" in lines[-1]  # how many GPUs the load needs
    assert load_warnings([calm]) == []


# ---- CSV / JSON ------------------------------------------------------------------------------


def test_write_csv_columns(tmp_path: Path) -> None:
    rs = [result("a", 0.5, 1.0, 100.0), result("b", 0.6, 2.0, 90.0, extra={"steps": 3})]
    path = tmp_path / "r.csv"
    write_csv(rs, path)
    with path.open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = reader.fieldnames
    stats = ["mean", "std", "p50", "p90", "p95", "p99", "max"]
    expected = ["policy", "hit_rate", "optimal_hit_rate", "prefill_tokens_computed", "num_requests"]
    for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_wait_s"):
        expected += [f"{k}.{s}" for s in stats]
    expected += [
        "throughput.requests_per_s",
        "throughput.input_tokens_per_s",
        "throughput.output_tokens_per_s",
        "makespan_s",
        "retractions",
        "preemptions",
        "wall_s",
    ]
    expected += [k for k in ADDITIONAL_KEYS if k != "tenants"]
    assert header == [*expected, "steps"]
    assert [r["policy"] for r in rows] == ["a", "b"]
    assert float(rows[1]["ttft_s.p99"]) == 2.0
    assert rows[0]["steps"] == "" and rows[1]["steps"] == "3"


class Mode(enum.Enum):
    FAST = "fast"


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_gb: float


def test_write_json_structure(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    cfg = {"gpu": Gpu("H100", 80.0), "mode": Mode.FAST, "timeout": float("inf"), "out": tmp_path}
    write_json(path, {"name": "wl", "sizes": (1, 2)}, cfg, [result("a", 0.5, 1.0, 100.0)])
    doc = json.loads(path.read_text())  # strict JSON: inf became null
    assert list(doc) == ["meta", "workload", "config", "results"]
    assert doc["workload"] == {"name": "wl", "sizes": [1, 2]}
    assert doc["config"] == {
        "gpu": {"name": "H100", "hbm_gb": 80.0},
        "mode": "fast",
        "timeout": None,
        "out": str(tmp_path),
    }
    assert list(doc["results"][0]) == [*REQUIRED_KEYS, *ADDITIONAL_KEYS]


# ---- HTML report -----------------------------------------------------------------------------


def test_identical_groups() -> None:
    a, b = np.arange(3.0), np.arange(3.0) + 1
    groups = identical_groups({"x": [a], "y": [b], "z": [a.copy()], "w": [b.copy()], "v": [a[:2]]})
    assert groups == [["x", "z"], ["y", "w"]]


def test_cdf_points() -> None:
    x, y = cdf_points([3.0, 1.0, 2.0, 4.0])
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0] and y.tolist() == [0.25, 0.5, 0.75, 1.0]
    x, y = cdf_points(np.arange(10_000.0), max_points=100)
    assert x.size <= 100 and x[0] == 0.0 and x[-1] == 9999.0 and y[-1] == 1.0
    assert cdf_points([])[0].size == 0


def sim_run(policy: str, seed: int, n: int = 200) -> tuple[PolicyResult, TimeSeries, np.ndarray]:
    """A plausible run of hand-rolled requests and a long sampled series."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        t = i * 0.05
        r = Req(f"{policy}-{i}", np.ones(100, dtype=np.int32), tenant=f"t{i % 2}", arrival_time=t)
        start = t + float(rng.exponential(0.3))
        times = list(start + 0.1 + np.cumsum(rng.uniform(0.01, 0.03, 5)))
        r.output_ids = [1] * len(times)
        r.times.first_scheduled, r.times.first_token = start, times[0]
        r.times.token_times, r.times.finish = times, times[-1]
        r.cached_tokens = int(rng.integers(0, 90))
        r.finish = FinishState(FinishReason.LENGTH)
        reqs.append(r)
    ts = TimeSeries()
    for k in range(5000):
        ts.append(k * 0.002, int(rng.integers(0, 20)), 4, 0.5, 40 * k, 100 * k)
    res = summarize(
        policy, reqs, ts, optimal_hit_rate=0.8, wall_s=0.2, retractions=1, preemptions=0
    )
    return res, ts, ttft_samples(reqs)


WORKLOAD = {"name": "tiny <synthetic>", "num_requests": 200, "seed": 0}
CONFIG = {
    "model": {"name": "llama-3-8b", "layers": 32},
    "gpu": {"name": "H100"},
    "scheduler": {
        "schedule_policy": "lpm",
        "chunked_prefill_size": 8192,
        "max_running_requests": None,
    },
}


def make_report(tmp_path: Path) -> Path:
    runs = [
        sim_run("fcfs", 1),
        sim_run("lpm<script>alert(1)</script>", 2),
        sim_run("dfs-weight", 3),
    ]
    results = [r for r, _, _ in runs]
    series = {r.policy: s for r, s, _ in runs}
    ttft = {r.policy: t for r, _, t in runs}
    return write_report(tmp_path / "report.html", WORKLOAD, CONFIG, results, series, ttft)


def test_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    html = make_report(tmp_path).read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "<script>alert(1)</script>" not in html
    assert "lpm&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "tiny &lt;synthetic&gt;" in html
    # plotly.js is inlined once; around it nothing is fetched: no external scripts, styles,
    # images or links, and no URL but the SVG namespace.
    lib = f'<script type="text/javascript">{plotly_js()}</script>'
    assert html.count(lib) == 1
    page = html.replace(lib, "")
    assert not re.search(r"<(link|img|iframe)\b", page)
    assert not re.search(r"\b(src|href)\s*=", page)
    assert not re.search(r"url\(", page)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}
    for chart in ("chart-ttft", "chart-hit-rate", "chart-queue", "chart-kv"):
        assert f'id="{chart}"' in page
    assert 'id="comparison"' in page and 'id="tenants"' in page and 'id="recommendation"' in page
    assert "chunked_prefill_size" in page and "H100" in page
    # The comparison table has E2E, ITL, p95 and std columns, not only the terminal's.
    for key in ("e2e_p99", "itl_p50", "ttft_p95", "ttft_std"):
        assert f'data-col="{key}"' in page, key


def test_charts_downsample_and_split_kv_usage_per_policy() -> None:
    from radixsched.results.report import kv_figure, time_figure
    from radixsched.results.series import REPORT_MAX_POINTS

    runs = [sim_run("a", 1), sim_run("b", 2), sim_run("c", 3)]
    sampled = {r.policy: s.downsampled(REPORT_MAX_POINTS) for r, s, _ in runs}
    names = list(sampled)
    fig = time_figure("q", "waiting", names, sampled, "queue_len")
    assert [t.name for t in fig.data] == names
    assert all(len(t.x) <= REPORT_MAX_POINTS for t in fig.data)  # 5,000 samples each
    kv = kv_figure(names, sampled)
    # One panel (own y axis) per policy: nine series near 100% never make one band.
    assert len({t.yaxis for t in kv.data}) == 3
    assert [a.text for a in kv.layout.annotations] == names
    # Series of different policies differ in colour and, beyond the first two, in dash.
    styles = {(t.line.color, t.line.dash) for t in fig.data}
    assert len(styles) == 3


def test_identical_curves_get_a_note(tmp_path: Path) -> None:
    r, series, ttft = sim_run("lpm", 1)
    twin = replace(r, policy="dfs-weight")
    html = render_report(
        {}, {}, [r, twin], {"lpm": series, "dfs-weight": series}, {"lpm": ttft, "dfs-weight": ttft}
    )
    assert "Identical curves, drawn on top of each other: lpm = dfs-weight." in html


def test_report_shows_warnings_and_what_was_run(tmp_path: Path) -> None:
    r, series, ttft = sim_run("lpm", 1)
    meta = {"version": "9.9.9", "created": "2030-01-01T00:00:00+00:00", "command": "radixsched x"}
    html = render_report({}, {}, [r], {"lpm": series}, {"lpm": ttft}, warnings=["overloaded: x"],
                         meta=meta)  # fmt: skip
    assert 'id="warnings"' in html and "overloaded: x" in html
    assert "radixsched 9.9.9" in html and "2030-01-01T00:00:00+00:00" in html


def test_report_caps_tenant_rows(tmp_path: Path) -> None:
    share = Stats(0.1, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 1)
    tenants = tuple(
        TenantResult(f"session-{k}", 1, 0.5, share, share, 100, 100 - k, (100 - k) / 100)
        for k in range(40)
    )
    r = result("lpm", 0.5, 1.0, 10.0, tenants=tenants, fairness_jain=0.99)
    html = render_report({}, {}, [r], {}, {})
    assert html.count("session-") == 12
    assert "session-39" in html and "session-0<" not in html  # least served are kept
    assert "12 least served" in html


def test_report_with_no_data(tmp_path: Path) -> None:
    out = write_report(tmp_path / "empty.html", {}, {}, [], {}, {})
    html = out.read_text().replace(plotly_js(), "")
    assert html.count('"text":"no data"') == 4 and "No results." in html


def find_chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run_chromium(page: Path, profile: Path) -> tuple[str, str]:
    """Load ``page`` headless with every network path closed; returns (DOM after load, log)."""
    chromium = find_chromium()
    assert chromium is not None
    proc = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def console_messages(log: str) -> list[str]:
    return [line for line in log.splitlines() if ":CONSOLE" in line]


needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not installed (Debian: apt-get install -y chromium)",
)


@needs_chromium
def test_report_renders_in_chromium_without_errors(tmp_path: Path) -> None:
    dom, log = run_chromium(make_report(tmp_path), tmp_path / "profile")
    assert console_messages(log) == []
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None
    assert 'data-ready="1"' in body.group(0)  # the inline script ran to its end
    assert 'data-charts="4"' in body.group(0)  # and found four drawn Plotly charts
    assert "data-errors" not in body.group(0)  # and no error reached window.onerror
    assert '<table id="comparison"' in dom and '<table id="tenants"' in dom
    # Plotly drew every chart: an SVG per chart, a line per policy and chart.
    assert dom.count('class="main-svg"') >= 4
    assert dom.count('class="scatterlayer') >= 4
    assert len(re.findall(r'<path class="js-line"', dom)) >= 12


@needs_chromium
def test_chromium_check_catches_a_broken_page(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    _, log = run_chromium(page, tmp_path / "profile")
    assert any("undefinedFunction" in m for m in console_messages(log))


@needs_chromium
def test_legend_click_hides_the_policy_in_every_chart(tmp_path: Path) -> None:
    page = make_report(tmp_path)
    clicked = tmp_path / "clicked.html"
    click = (
        "<script>document.querySelector('.legend button[data-series=\"0\"]').click();"
        "var v = Array.prototype.map.call(document.querySelectorAll('.js-plotly-plot'),"
        " function (d) { return d.data.map(function (t) { return [t.meta, t.visible]; }); });"
        "document.body.setAttribute('data-visible', JSON.stringify(v));</script>"
    )
    clicked.write_text(page.read_text().replace("</body>", click + "</body>"))
    dom, log = run_chromium(clicked, tmp_path / "profile")
    assert console_messages(log) == []
    m = re.search(r'data-visible="([^"]*)"', dom)
    assert m is not None
    charts = json.loads(m.group(1).replace("&quot;", '"'))
    assert len(charts) == 4
    for traces in charts:
        for meta, visible in traces:
            if meta == 0:
                assert visible is False  # the first policy, hidden in every chart
            elif meta is not None:
                assert visible is not False

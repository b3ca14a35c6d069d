"""A sweep's rows: one per point, the best point per metric, and the CSV and JSON files."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixsched.sim.sweep.config import (
    NONDETERMINISTIC_KEYS,
    RunFn,
    Scalar,
    Settings,
    SweepConfig,
    _metric_value,
    _scalar,
    _shown,
)
from radixsched.sim.sweep.executors import (
    LocalExecutor,
    OnResult,
    RunOutcome,
    SweepExecutor,
    simulate_point,
)
from radixsched.sim.sweep.report import render_sweep_report


@dataclass
class SweepResult:
    config: SweepConfig
    points: list[Settings]
    outcomes: list[RunOutcome]

    @property
    def num_failed(self) -> int:
        return sum(1 for o in self.outcomes if o.error is not None)

    def best_run(self, rows: Sequence[Mapping[str, Scalar]] | None = None) -> int | None:
        """The run that does best on the config's ``best`` metric (None without one)."""
        best = self.config.best
        return None if best is None else best.pick(self.rows() if rows is None else rows)

    def best_text(self) -> str | None:
        """``best by M (max): run 3 (deployment=2P:6D) with 1.23; ...`` the others' values."""
        best, rows = self.config.best, self.rows()
        i = self.best_run(rows)
        if best is None or i is None:
            return None
        shown = _shown(self.points[i], self.config.varied)
        others = "; ".join(
            f"{_shown(self.points[j], self.config.varied) or f'run {j}'}: {_fmt(v)}"
            for j, r in enumerate(rows)
            if j != i and (v := _metric_value(r, best.metric)) is not None
        )
        value = _metric_value(rows[i], best.metric)
        return (
            f"best by {best.metric} ({best.goal}): run {i}"
            + (f" ({shown})" if shown else "")
            + f" with {_fmt(value)}"
            + (f"; {others}" if others else "")
        )

    def rows(self) -> list[dict[str, Scalar]]:
        """One row per run: ``run``, the varied settings, deterministic metrics, ``error``."""
        rows: list[dict[str, Scalar]] = []
        for i, (p, o) in enumerate(zip(self.points, self.outcomes, strict=True)):
            row: dict[str, Scalar] = {"run": i}
            for key in self.config.varied:
                row[key] = _scalar(p[key])
            for k, v in (o.metrics or {}).items():
                if k not in NONDETERMINISTIC_KEYS and k not in row:
                    row[k] = v
            row["error"] = o.error
            rows.append(row)
        return rows

    def write(self, out_dir: str | Path, meta: Mapping[str, Any] | None = None) -> dict[str, Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        rows = self.rows()
        paths = {
            "csv": out / "sweep.csv",
            "json": out / "sweep.json",
            "report": out / "report.html",
        }
        fields: dict[str, None] = {}
        for row in rows:
            fields.update(dict.fromkeys(row))
        fields.pop("error", None)
        fields["error"] = None
        with paths["csv"].open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(fields), restval="")
            writer.writeheader()
            writer.writerows(rows)
        best = self.best_run(rows)
        doc = {
            "meta": dict(meta or {}),
            "sweep": _json_value(self.config.to_json()),
            "best": None
            if best is None or self.config.best is None
            else {
                "run": best,
                "metric": self.config.best.metric,
                "goal": self.config.best.goal,
                "value": _json_scalar(rows[best].get(self.config.best.metric)),
                "settings": {
                    k: _json_scalar(_scalar(self.points[best][k])) for k in self.config.varied
                },
            },
            "rows": [{k: _json_scalar(v) for k, v in r.items()} for r in rows],
            "timing": [
                {
                    "run": i,
                    "run_wall_s": o.wall_s,
                    **{
                        k: _json_scalar(v)
                        for k, v in (o.metrics or {}).items()
                        if k in NONDETERMINISTIC_KEYS
                    },
                }
                for i, o in enumerate(self.outcomes)
            ],
        }
        # Serialised first: a value JSON cannot hold fails before the file is truncated.
        text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
        paths["json"].write_text(text, encoding="utf-8")
        paths["report"].write_text(render_sweep_report(self, meta), encoding="utf-8")
        return paths


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _json_scalar(v: Scalar) -> Scalar:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _json_value(v: Any) -> Any:
    """``v`` with every non-finite float as ``_json_scalar`` writes it (a config may hold
    ``.inf``: ``request_rate``, ``lpm_max_wait_s``)."""
    if isinstance(v, Mapping):
        return {k: _json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
    return _json_scalar(v) if isinstance(v, float) else v


def run_sweep(
    config: SweepConfig,
    *,
    run_fn: RunFn = simulate_point,
    executor: SweepExecutor | None = None,
    on_result: OnResult | None = None,
) -> SweepResult:
    """Run every point of ``config`` with ``run_fn`` on ``executor`` (default: in-process)."""
    points = config.points()
    runs = [config.settings_of(p) for p in points]
    outcomes = (executor or LocalExecutor(1)).map(run_fn, runs, on_result)
    if len(outcomes) != len(points):
        raise RuntimeError(f"executor returned {len(outcomes)} outcomes for {len(points)} runs")
    return SweepResult(config, points, outcomes)

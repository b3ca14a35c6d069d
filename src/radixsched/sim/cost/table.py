"""Measured step times as a cost model: a calibration table (CSV or JSON rows of kind,
batch_size, num_tokens, ms) read and interpolated over, falling back to the roofline outside
what was measured."""

from __future__ import annotations

import csv
import json
import math
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from radixsched.runner import Batch
from radixsched.sim.cost.hardware import GPUSpec, ModelSpec
from radixsched.sim.cost.roofline import CostModel, FloatArray, StepKind, StepShape, shape_of


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and line."""


# ---- calibration -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    batch_size: int
    tokens: FloatArray  # ascending
    seconds: FloatArray


@dataclass(frozen=True)
class CalibrationTable:
    """Measured step times by kind, then by batch size (rows sorted by batch size)."""

    rows: dict[str, tuple[_Row, ...]]
    source: str

    @property
    def num_points(self) -> int:
        return sum(len(r.tokens) for rows in self.rows.values() for r in rows)


_COLUMNS = ("kind", "batch_size", "num_tokens", "ms")


def _parse_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool):
        raise CalibrationError(
            f"{where}: field {name!r}: expected a positive integer, got {value!r}"
        )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CalibrationError(
            f"{where}: field {name!r}: expected a positive integer, got {value!r}"
        ) from None
    if not number.is_integer() or number < 1:
        raise CalibrationError(
            f"{where}: field {name!r}: expected a positive integer, got {value!r}"
        )
    return int(number)


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(location, record) pairs in file order; location is ``file:line`` or ``file: row N``."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CalibrationError(f"{name}: cannot read calibration file: {exc.strerror}") from None
    suffix = path.suffix.lower()
    if suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        if missing := [c for c in _COLUMNS if c not in (reader.fieldnames or [])]:
            raise CalibrationError(f"{name}:1: missing column(s) {', '.join(missing)}")
        # ``line_num`` counts physical lines read so far, i.e. this row's 1-based line.
        return [(f"{name}:{reader.line_num}", dict(row)) for row in reader]
    if suffix == ".jsonl":
        out: list[tuple[str, dict[str, Any]]] = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CalibrationError(f"{name}:{i}: invalid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise CalibrationError(f"{name}:{i}: expected a JSON object")
            out.append((f"{name}:{i}", obj))
        return out
    if suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"{name}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        if isinstance(doc, dict) and "rows" in doc:
            doc = doc["rows"]
        if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
            raise CalibrationError(f"{name}: expected a list of objects (or {{'rows': [...]}})")
        return [(f"{name}: row {i}", r) for i, r in enumerate(doc, 1)]
    raise CalibrationError(
        f"{name}: unknown calibration format {suffix!r} (use .csv, .json, .jsonl)"
    )


def load_calibration(path: str | Path) -> CalibrationTable:
    """Read and validate a calibration table (format in the module docstring)."""
    path = Path(path)
    return _table_from_records(_records(path), str(path))


def _records_from_rows(rows: Any, source: str) -> CalibrationTable:
    """A table from the ``rows`` list of a calibration document."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise CalibrationError(f"{source}: 'rows' must be a list of objects")
    return _table_from_records([(f"{source}: row {i}", r) for i, r in enumerate(rows, 1)], source)


def _table_from_records(records: list[tuple[str, dict[str, Any]]], source: str) -> CalibrationTable:
    points: dict[tuple[str, int], dict[int, tuple[float, str]]] = {}
    for where, rec in records:
        for col in _COLUMNS:
            if rec.get(col) in (None, ""):
                raise CalibrationError(f"{where}: missing field {col!r}")
        kind = str(rec["kind"]).strip().lower()
        if kind not in ("prefill", "decode"):
            raise CalibrationError(
                f"{where}: field 'kind': expected 'prefill' or 'decode', got {rec['kind']!r}"
            )
        b = _parse_int(rec["batch_size"], where, "batch_size")
        n = _parse_int(rec["num_tokens"], where, "num_tokens")
        try:
            ms = float(rec["ms"])
        except (TypeError, ValueError):
            ms = math.nan
        if not math.isfinite(ms) or ms <= 0:
            raise CalibrationError(
                f"{where}: field 'ms': expected a positive number, got {rec['ms']!r}"
            )
        row = points.setdefault((kind, b), {})
        if n in row:
            raise CalibrationError(
                f"{where}: duplicate point (kind={kind}, batch_size={b}, num_tokens={n}); "
                f"first given at {row[n][1]}"
            )
        row[n] = (ms / 1e3, where)
    if not points:
        raise CalibrationError(f"{source}: calibration table has no rows")
    rows: dict[str, list[_Row]] = {}
    for (kind, b), pts in sorted(points.items()):
        ns = sorted(pts)
        rows.setdefault(kind, []).append(
            _Row(
                b,
                np.array(ns, dtype=np.float64),
                np.array([pts[n][0] for n in ns], dtype=np.float64),
            )
        )
    return CalibrationTable({k: tuple(v) for k, v in rows.items()}, source)


@dataclass(frozen=True)
class CalibratedCostModel:
    """Step times from a measured table, the roofline ``base`` filling the gaps (rules in
    the module docstring). Capacity and presets come from ``base``."""

    base: CostModel
    table: CalibrationTable

    @property
    def gpu(self) -> GPUSpec:
        return self.base.gpu

    @property
    def model(self) -> ModelSpec:
        return self.base.model

    @property
    def tp(self) -> int:
        return self.base.tp

    def kv_capacity_tokens(self) -> int:
        return self.base.kv_capacity_tokens()

    def _row_value(self, kind: StepKind, row: _Row, n: FloatArray) -> FloatArray:
        clamped = np.clip(n, row.tokens[0], row.tokens[-1])
        measured = np.interp(clamped, row.tokens, row.seconds)
        ref = self.base.reference_times
        result: FloatArray = measured * (
            ref(kind, row.batch_size, n) / ref(kind, row.batch_size, clamped)
        )
        return result

    def lookup(self, kind: StepKind, batch_size: int, num_tokens: FloatArray) -> FloatArray:
        """``T(kind, batch_size, n)`` for each ``n``; the kind must have rows."""
        rows = self.table.rows[kind]
        n = np.asarray(num_tokens, dtype=np.float64)
        sizes = [r.batch_size for r in rows]
        i = bisect_left(sizes, batch_size)
        if i < len(sizes) and sizes[i] == batch_size:
            return self._row_value(kind, rows[i], n)
        if i == 0 or i == len(sizes):
            near = rows[0] if i == 0 else rows[-1]
            ref = self.base.reference_times
            scaled: FloatArray = self._row_value(kind, near, n) * (
                ref(kind, batch_size, n) / ref(kind, near.batch_size, n)
            )
            return scaled
        lo, hi = rows[i - 1], rows[i]
        w = (batch_size - lo.batch_size) / (hi.batch_size - lo.batch_size)
        mixed: FloatArray = (1.0 - w) * self._row_value(kind, lo, n) + w * self._row_value(
            kind, hi, n
        )
        return mixed

    def step_times(self, shape: StepShape) -> FloatArray:
        host = self.base._host_s(shape)
        if shape.num_extend == 0:
            if "decode" not in self.table.rows:
                return self.base.step_times(shape)
            ctx = shape.decode_ctx.astype(np.float64)
            result: FloatArray = self.lookup("decode", shape.num_decode, ctx) + host
            return result
        if "prefill" not in self.table.rows:
            return self.base.step_times(shape)
        entries = shape.num_extend + shape.num_decode
        tokens = np.full(shape.num_steps, float(shape.extend_tokens + shape.num_decode))
        t = self.lookup("prefill", entries, tokens) + self.base.prefix_attention_s(shape)
        if shape.num_decode:
            t = t + self.base.decode_kv_read_s(shape)
        out: FloatArray = t + host
        return out

    def step_time(self, batch: Batch) -> float:
        return float(self.step_times(shape_of(batch))[0])

    def describe(self) -> dict[str, Any]:
        info = self.base.describe()
        info["cost_model"] = "calibrated"
        info["calibration"] = self.table.source
        info["calibration_points"] = self.table.num_points
        return info

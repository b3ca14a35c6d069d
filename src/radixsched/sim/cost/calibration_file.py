"""Calibration files: what ``radixsched calibrate`` writes and ``simulate --calibration`` reads.

Two kinds of file are accepted by ``--calibration``:

- a step-time table (CSV, JSON list or ``{"rows": [...]}``, JSON Lines; ``sim.cost.table``);
- a calibration document, a JSON object::

    {"format": "radixsched-calibration", "version": 2,
     "fitted_on": {"model", "gpu", "tp", "engine", "engine_version", "date",
                   "radixsched_version", "runs": [{"name", "source", "num_requests", ...}]},
     "constants": {"mfu", "mbu", "step_overhead_s", "prefill_eff_tokens", "sched_step_s",
                   "sched_per_req_s", "sched_per_prefill_s", "request_latency_s",
                   "request_serial_s"},
     "fit": [per-run errors], "holdout": [per-run errors predicted by a fit without
     that run], "summary": {"in_sample": {...}, "held_out": {...} | null},
     "at_bounds": [constants that ended at a bound: model mismatches],
     "rows": [optional step-time table]}

  Version 1 (before the held-out errors) is read too. Constants it lacks keep their
  defaults; flags given on the command line win over it.

``check_fitted_on`` names the differences between what a file was fitted on and what a
simulation models (another model or GPU): ``simulate`` prints them as warnings."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixsched.sim.cost.roofline import CONSTANTS
from radixsched.sim.cost.table import (
    CalibrationError,
    CalibrationTable,
    _records_from_rows,
    load_calibration,
)

FORMAT = "radixsched-calibration"
VERSION = 2  # what this build writes
READABLE_VERSIONS = (1, 2)  # 2 added "holdout", "summary", "at_bounds"; constants unchanged


@dataclass(frozen=True)
class Calibration:
    source: str
    constants: dict[str, float] = field(default_factory=dict)
    table: CalibrationTable | None = None
    fitted_on: dict[str, Any] = field(default_factory=dict)


# Upper bounds of the constants a file may set (the rest: seconds, at most ``_MAX_SECONDS``),
# and of a step table's times: beyond them a value is no measurement, and the simulation's
# times would overflow.
_MAX_SECONDS = 3600.0
_MAX_CONSTANT = {"mfu": 1.0, "mbu": 1.0, "prefill_eff_tokens": 1e7}
_GZIP_MAGIC = b"\x1f\x8b"
# Keys of the result files ``radixsched calibrate`` reads (``sim.calibrate.readers``).
_RESULT_KEYS = ("ttfts", "input_lens", "benchmarks", "requests", "results", "runs")


def _show(value: Any) -> str:
    """``value`` for a message, anything long cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CalibrationError(f"{path}: cannot read calibration file: {e.strerror or e}") from None
    if data[:2] == _GZIP_MAGIC:
        raise CalibrationError(f"{path}: gzip-compressed: decompress it first (gunzip)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CalibrationError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def _loads(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise CalibrationError(f"{path}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise CalibrationError(f"{path}: invalid JSON: {e}") from None


def _not_calibration(doc: Mapping[str, Any], path: Path) -> str:
    """Why the JSON object ``doc`` is not a calibration file."""
    if doc.get("format") == "radixsched-bench-sweep" or any(k in doc for k in _RESULT_KEYS):
        return (
            f"{path}: a benchmark result, not a calibration file: fit one on it with "
            f"'radixsched calibrate {path} --output cal.json'"
        )
    fmt = doc.get("format")
    what = "" if fmt is None else f" (format {fmt!r})"
    return (
        f"{path}: not a calibration file{what}: expected a {FORMAT!r} document, a list of "
        "step-time rows or {'rows': [...]}"
    )


def _constants(doc: Mapping[str, Any], where: str) -> dict[str, float]:
    raw = doc.get("constants", {})
    if not isinstance(raw, Mapping):
        raise CalibrationError(f"{where}: 'constants' must be an object")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if key not in CONSTANTS:
            raise CalibrationError(
                f"{where}: unknown constant {key!r}; valid: {', '.join(CONSTANTS)}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalibrationError(
                f"{where}: constant {key!r}: expected a number, got {_show(value)}"
            )
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float
            number = math.inf
        if not math.isfinite(number) or number < 0:
            raise CalibrationError(
                f"{where}: constant {key!r}: expected a finite number >= 0, got {_show(value)}"
            )
        limit = _MAX_CONSTANT.get(key, _MAX_SECONDS)
        if key in ("mfu", "mbu") and not 0 < number <= limit:
            raise CalibrationError(
                f"{where}: constant {key!r}: expected a number in (0, 1], got {_show(value)}"
            )
        if number > limit:
            unit = "tokens" if key == "prefill_eff_tokens" else "seconds"
            raise CalibrationError(
                f"{where}: constant {key!r}: expected at most {limit:g} ({unit}), "
                f"got {_show(value)}"
            )
        out[key] = number
    return out


def _check_table(table: CalibrationTable) -> CalibrationTable:
    """The table, unless a step time is beyond any measurement."""
    for kind, rows in table.rows.items():
        for row in rows:
            for n, t in zip(row.tokens, row.seconds, strict=True):
                if t > _MAX_SECONDS:
                    raise CalibrationError(
                        f"{table.source}: step time of {t * 1e3:g} ms (kind {kind}, batch_size "
                        f"{row.batch_size}, num_tokens {int(n)}): expected at most "
                        f"{_MAX_SECONDS * 1e3:g} ms"
                    )
    return table


def _table_file(p: Path, text: str) -> CalibrationTable:
    """A step-time table in a CSV or JSON Lines file (``sim.cost.table.load_calibration``)."""
    if p.suffix.lower() == ".jsonl":
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            obj = json.loads(first) if first else None
        except (ValueError, RecursionError):
            obj = None  # load_calibration says where and why
        if isinstance(obj, dict) and "kind" not in obj and any(k in obj for k in _RESULT_KEYS):
            raise CalibrationError(_not_calibration(obj, p))
    try:
        return _check_table(load_calibration(p))
    except CalibrationError:
        raise
    except RecursionError:
        raise CalibrationError(f"{p}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts, ...
        raise CalibrationError(f"{p}: {e}") from None


def read_calibration(path: str | Path) -> Calibration:
    """Read either kind of calibration file (see the module docstring); ``CalibrationError``
    (naming the file, and the line or field) when it cannot be used."""
    p = Path(path)
    text = _read_text(p)
    if not text.strip():
        raise CalibrationError(f"{p}: empty calibration file")
    if p.suffix.lower() != ".json":
        if text.startswith("\ufeff"):  # (the reader of tables would take it for a column's)
            raise CalibrationError(
                f"{p}: starts with a byte-order mark (Excel's 'CSV UTF-8'): save it as UTF-8 "
                "without one"
            )
        return Calibration(str(p), table=_table_file(p, text))
    doc = _loads(text.removeprefix("\ufeff"), p)
    if isinstance(doc, dict) and doc.get("format") == FORMAT:
        return _document(doc, p)
    if isinstance(doc, dict) and "rows" not in doc:
        raise CalibrationError(_not_calibration(doc, p))
    rows = doc["rows"] if isinstance(doc, dict) else doc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise CalibrationError(f"{p}: expected a list of objects (or {{'rows': [...]}})")
    return Calibration(str(p), table=_check_table(_records_from_rows(rows, str(p))))


def _document(doc: Mapping[str, Any], p: Path) -> Calibration:
    """A calibration document (the module docstring's layout)."""
    version = doc.get("version")
    readable = ", ".join(str(v) for v in READABLE_VERSIONS)
    if version is None:
        raise CalibrationError(f"{p}: no 'version' (this build reads versions {readable})")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:  # (True == 1)
        newer = (
            ": written by a newer radixsched?"
            if isinstance(version, int) and not isinstance(version, bool) and version > VERSION
            else ""
        )
        raise CalibrationError(
            f"{p}: calibration version {version!r} is not supported (this build reads "
            f"versions {readable}){newer}"
        )
    rows = doc.get("rows")
    table = None
    if rows is not None and rows != []:  # (an empty list: no table)
        table = _check_table(_records_from_rows(rows, str(p)))
    fitted = doc.get("fitted_on", {})
    if not isinstance(fitted, Mapping):
        raise CalibrationError(f"{p}: 'fitted_on' must be an object")
    return Calibration(
        str(p), constants=_constants(doc, str(p)), table=table, fitted_on=dict(fitted)
    )


def write_calibration(
    path: str | Path,
    *,
    constants: Mapping[str, float],
    fitted_on: Mapping[str, Any],
    fit: list[dict[str, Any]] | None = None,
    rows: list[dict[str, Any]] | None = None,
    honesty: Mapping[str, Any] | None = None,
) -> None:
    """Write a calibration document; ``ValueError`` (nothing written) when a number in it is
    not finite, ``OSError`` when the file cannot be written. ``honesty``: the fit's
    ``holdout``, ``summary`` and ``at_bounds`` entries (the module docstring)."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "fitted_on": dict(fitted_on),
        "constants": {k: float(v) for k, v in constants.items()},
    }
    if fit is not None:
        doc["fit"] = fit
    for key in ("holdout", "summary", "at_bounds"):
        if honesty is not None and key in honesty:
            doc[key] = honesty[key]
    if rows is not None:
        doc["rows"] = rows
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    # Written beside, then renamed over: a failed write leaves an earlier file as it was.
    target = Path(path).resolve()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _same_preset(kind: str, fitted: str, used: str) -> bool:
    from radixsched.sim.cost.hardware import PresetError, _normalize, get_gpu
    from radixsched.sim.cost.models import get_model

    lookup = get_gpu if kind == "gpu" else get_model
    try:
        return lookup(fitted).name == lookup(used).name
    except PresetError:
        return _normalize(fitted) == _normalize(used)


def check_fitted_on(cal: Calibration, *, model: str, gpu: str) -> list[str]:
    """Warnings when ``cal`` was fitted on another model or GPU than the one simulated
    (names compared as the presets compare them; nothing to say when the file is silent)."""
    out = []
    for what, used in (("model", model), ("gpu", gpu)):
        fitted = cal.fitted_on.get(what)
        if fitted and not _same_preset(what, str(fitted), used):
            out.append(
                f"calibration {cal.source} was fitted on {what} {fitted!r}, but this simulation "
                f"models {used!r}: its constants may not transfer"
            )
    return out

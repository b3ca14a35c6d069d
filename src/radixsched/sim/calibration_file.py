"""Calibration files: what ``radixsched calibrate`` writes and ``simulate --calibration`` reads.

Two kinds of file are accepted by ``--calibration``:

- a step-time table (CSV, JSON list or ``{"rows": [...]}``, JSON Lines; ``sim.costmodel``);
- a calibration document, a JSON object::

    {"format": "radixsched-calibration", "version": 1,
     "fitted_on": {"model", "gpu", "tp", "engine", "engine_version", "date",
                   "radixsched_version", "runs": [{"name", "source", "num_requests", ...}]},
     "constants": {"mfu", "mbu", "step_overhead_s", "prefill_eff_tokens", "sched_step_s",
                   "sched_per_req_s", "sched_per_prefill_s", "request_latency_s",
                   "request_serial_s"},
     "fit": [per-run errors], "rows": [optional step-time table]}

  Constants it lacks keep their defaults; flags given on the command line win over it.

``check_fitted_on`` names the differences between what a file was fitted on and what a
simulation models (another model or GPU): ``simulate`` prints them as warnings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixsched.sim.costmodel import (
    CONSTANTS,
    CalibrationError,
    CalibrationTable,
    _records_from_rows,
    load_calibration,
)

FORMAT = "radixsched-calibration"
VERSION = 1


@dataclass(frozen=True)
class Calibration:
    source: str
    constants: dict[str, float] = field(default_factory=dict)
    table: CalibrationTable | None = None
    fitted_on: dict[str, Any] = field(default_factory=dict)


def _is_document(path: Path) -> dict[str, Any] | None:
    if path.suffix.lower() != ".json":
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CalibrationError(f"{path}: cannot read calibration file: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    if isinstance(doc, dict) and doc.get("format") == FORMAT:
        return doc
    return None


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
            raise CalibrationError(f"{where}: constant {key!r}: expected a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise CalibrationError(f"{where}: constant {key!r}: expected >= 0, got {value!r}")
        out[key] = float(value)
    return out


def read_calibration(path: str | Path) -> Calibration:
    """Read either kind of calibration file (see the module docstring)."""
    p = Path(path)
    doc = _is_document(p)
    if doc is None:
        return Calibration(str(p), table=load_calibration(p))
    version = doc.get("version")
    if version != VERSION:
        raise CalibrationError(f"{p}: calibration version {version!r} (this build reads {VERSION})")
    rows = doc.get("rows")
    table = None
    if rows:
        table = _records_from_rows(rows, str(p))
    fitted = doc.get("fitted_on", {})
    return Calibration(
        str(p),
        constants=_constants(doc, str(p)),
        table=table,
        fitted_on=dict(fitted) if isinstance(fitted, Mapping) else {},
    )


def write_calibration(
    path: str | Path,
    *,
    constants: Mapping[str, float],
    fitted_on: Mapping[str, Any],
    fit: list[dict[str, Any]] | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> None:
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "fitted_on": dict(fitted_on),
        "constants": {k: float(v) for k, v in constants.items()},
    }
    if fit is not None:
        doc["fit"] = fit
    if rows is not None:
        doc["rows"] = rows
    Path(path).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def _same(kind: str, fitted: str, used: str) -> bool:
    from radixsched.sim.presets import PresetError, _normalize, get_gpu, get_model

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
        if fitted and not _same(what, str(fitted), used):
            out.append(
                f"calibration {cal.source} was fitted on {what} {fitted!r}, but this simulation "
                f"models {used!r}: its constants may not transfer"
            )
    return out

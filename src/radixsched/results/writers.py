"""Result files: a CSV row per policy, the JSON document, and per-request rows as CSV or Parquet."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from radixsched.results.metrics import PolicyResult
from radixsched.results.stats import JSONValue


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
    import csv  # (as in write_requests) only where a CSV is written: a plain run imports none

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
    write_document(path, doc)


def write_document(path: str | Path, doc: Mapping[str, Any]) -> None:
    """``doc`` as indented JSON ending in a newline; NaN and infinities are refused (strict
    JSON readers reject them)."""
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
    from radixsched.results.requests import REQUEST_COLUMNS

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
    import csv

    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(REQUEST_COLUMNS), restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})

"""The per-request lists that sglang.bench_serving and vLLM's bench client share
(``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``errors``; vLLM adds ``start_times``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from radixsched.sim.calibrate.readers.fields import (
    _bad,
    _concurrency,
    _count,
    _list,
    _number,
    _object,
    _rate,
    _request,
)
from radixsched.sim.calibrate.runs import MeasuredRun, ResultFileError

# The per-request lists a run needs, in the order of their fields.
LISTS = ("input_lens", "output_lens", "ttfts", "itls")


def lists_run(
    doc: Mapping[str, Any],
    path: str,
    source: str,
    *,
    note: str | None,
    tool_version: str | None,
    label: str | None = None,
) -> MeasuredRun:
    """The run of one detail-lists document; ``note``: what its unknown prompt structure may
    cost (None: the prompts are known to share no prefixes); ``label``: the layout, named in
    every message after the path."""
    head = path if label is None else f"{path}: {label}"
    rate = _rate(doc.get("request_rate"), head, "request_rate")
    conc = _concurrency(doc.get("max_concurrency"), head, "max_concurrency")
    name = run_name(doc.get("request_rate"), rate, conc)
    where = f"{head}: {name}"
    need = LISTS
    missing = [k for k in need if not isinstance(doc.get(k), list)]
    if missing:
        flag = "--output-details" if source == "sglang" else "--save-result --save-detailed"
        raise ResultFileError(
            f"{where}: no per-request lists ({', '.join(missing)}); rerun with {flag}"
        )
    lists = {k: doc[k] for k in need}
    errors = _list(doc, "errors", where)
    starts = _list(doc, "start_times", where)
    if errors:  # (an empty list: no errors recorded)
        lists["errors"] = errors
    if starts is not None:
        lists["start_times"] = starts
    if len({len(v) for v in lists.values()}) > 1:
        sizes = ", ".join(f"{k} {len(v)}" for k, v in lists.items())
        raise ResultFileError(f"{where}: per-request lists of different lengths ({sizes})")
    t0 = min((_number(s, where, "start_times") for s in starts or [] if s is not None), default=0.0)
    reqs = []
    failed = 0
    for i, (inp, out, ttft, itl) in enumerate(zip(*(lists[k] for k in need), strict=True)):
        at = f"{where}: request {i}"
        # A failed request: an error, or (sglang, vLLM) a TTFT of 0 and no output.
        if (errors and errors[i]) or ttft is None or out is None:
            failed += 1
            continue
        ttft_s = _number(ttft, at, "ttfts")
        if ttft_s == 0 or _count(out, at, "output_lens", 0) < 1:
            failed += 1
            continue
        if itl is not None and not isinstance(itl, list):
            raise _bad(at, "itls", "a list of gaps", itl)
        gaps = [_number(g, at, "itls") for g in itl or []]
        if any(g < 0 for g in gaps):
            raise ResultFileError(f"{at}: field 'itls': negative gap {min(gaps):.6g} s")
        start = None if starts is None or starts[i] is None else float(starts[i])
        reqs.append(
            _request(
                at,
                prompt_len=_count(inp, at, "input_lens", 1),
                output_len=int(out),
                ttft_s=ttft_s,
                e2e_s=ttft_s + sum(gaps),
                sent=None if start is None else start - t0,
            )
        )
    server_info = _object(doc, "server_info", where)
    model = (
        doc.get("model_id")
        or server_info.get("model_path")
        or server_info.get("model")
        or doc.get("tag")
    )
    version = server_info.get("version")
    return MeasuredRun(
        name=name,
        source=source,
        path=path,
        requests=tuple(reqs),
        request_rate=rate,
        max_concurrency=conc,
        model=None if model is None else str(model),
        engine=source if source == "vllm" else str(doc.get("backend") or source),
        engine_version=None if version is None else str(version),
        num_failed=failed,
        prefixes=None if note else (),
        structure_note=note,
        tool_version=tool_version,
    )


def run_name(given: Any, rate: float, conc: int | None) -> str:
    if conc is not None and math.isinf(rate):
        return f"concurrency {conc}"
    return f"rate {given}" + ("" if conc is None else f" conc {conc}")

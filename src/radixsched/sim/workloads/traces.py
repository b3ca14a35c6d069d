"""Trace readers: Mooncake's JSONL (hash_ids become token blocks) and radixsched's JSONL (token
ids or lengths, prefix groups, priority, tenant, arrival), plain, .gz or .zst. Bad input names
the file, the line and the field."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from radixsched.native import core
from radixsched.request import TokenArray
from radixsched.sim.workloads.mooncake_lines import (
    _mooncake_records,
    _MooncakeLines,
    _stamps,
)
from radixsched.sim.workloads.tokens import (
    _INT64,
    _NO_TOKENS,
    _SALT_BLOCK,
    _SALT_GROUP,
    _SALT_PAD,
    _SALT_UNIQUE,
    MAX_ARRIVAL_S,
    MAX_PROMPT_TOKENS,
    WorkloadError,
    _block_table,
    _Draft,
    _each_in_threads,
    _hash_tokens,
    _key,
    _keys_after,
    _runs_in_threads,
    _str_key,
)
from radixsched.sim.workloads.trace_files import (
    _bad,
    _int_list,
    _json_lines,
    _late,
    _nonneg_number,
    _opt_str,
    _pos_int,
)

# ---- trace readers ---------------------------------------------------------------------


_BATCH = 256  # requests whose own blocks are generated together


def _build_mooncake(p: dict[str, Any], seed: int) -> list[_Draft]:
    """The trace's requests, their prompts deferred: only those the load keeps are built
    (``_fill_mooncake``)."""
    block, vocab = p["block_size"], p["vocab"]
    records = _mooncake_records(Path(p["path"]), block)
    stamps = _stamps(records)
    t0 = min(stamps)

    def fill(drafts: Sequence[_Draft]) -> None:
        _fill_mooncake(drafts, block, vocab)

    if isinstance(records, _MooncakeLines):  # its columns, no record made
        outputs, inputs, ids = records.outputs, records.inputs, records.ids
    else:
        outputs = [r.output_length for r in records]
        inputs = [r.input_length for r in records]
        ids = [r.hash_ids for r in records]
    columns = (stamps, outputs, inputs, ids)
    if (cloned := _cloned_drafts(columns, t0, fill)) is not None:
        return cloned
    # Positionally (keywords cost a third of a draft's construction), in ``DRAFT_FIELDS``'
    # order: prompt, output_len, session, offset_s, timestamp_s, scripted, priority,
    # routing_key, tenant, extra_key, fill, source (the hash ids, not the record: the drafts
    # keep no object a line), length.
    return [
        _Draft(_NO_TOKENS, o, i, 0.0, (ts - t0) / 1e3, None, None, None, None, None, fill, h, n)
        for i, (ts, o, n, h) in enumerate(zip(*columns, strict=True))
    ]


def _cloned_drafts(
    columns: tuple[Sequence[float], Sequence[int], Sequence[int], Sequence[Any]],
    t0: float,
    fill: Callable[[Sequence[_Draft]], None],
) -> list[_Draft] | None:
    """``_build_mooncake``'s drafts, field for field, as copies of one (``_core.clone_like``,
    a fifth of the constructor's cost: a draft has no field made per draft), each with its
    line's columns; None without the core."""
    clone = getattr(core(), "clone_like", None)
    if clone is None:
        return None
    stamps, outputs, inputs, ids = columns
    like = _Draft(_NO_TOKENS, 0, 0, 0.0, None, None, None, None, None, None, fill, None, 0)
    made: list[_Draft] | None = clone(
        like,
        {
            "output_len": list(outputs),
            "session": list(range(len(stamps))),
            "timestamp_s": [(ts - t0) / 1e3 for ts in stamps],
            "source": list(ids),
            "length": list(inputs),
        },
        (),
    )
    return made


def _fill_mooncake(drafts: Sequence[_Draft], block: int, vocab: int) -> None:
    """Blocks that several of these prompts use are generated once, into the head of one
    table; the blocks only one prompt uses are generated a batch of requests at a time into
    its tail, so the table (the load's peak memory beside the prompts) holds the shared blocks
    and one batch's own. A block's tokens depend on its id only, a short id list's padding on
    the request's line: the same prompts whichever requests are built together. With the
    native core each prompt is written in one pass instead (``_native_prompt``, a batch a call: the same
    tokens, computed per position, no table)."""
    native = _native_prompt(block, vocab)
    if native is not None:
        salt = _key(_SALT_BLOCK)
        outs = [_prompt_buffer(d) for d in drafts]
        ids = [d.source for d in drafts]
        pads = _keys_after(_SALT_PAD, [d.session for d in drafts])

        def build(lo: int, hi: int) -> None:  # one native call a thread, without the GIL
            native(outs[lo:hi], ids[lo:hi], pads[lo:hi], salt, block, vocab)

        _runs_in_threads([d.length for d in drafts], build)
        for d, out in zip(drafts, outs, strict=True):
            d.prompt = out
        return
    id_lists: list[npt.NDArray[np.int64]] = [d.source for d in drafts]
    distinct, uses = np.unique(np.concatenate(id_lists), return_counts=True)
    shared = distinct[uses > 1]
    batches = [
        list(range(lo, min(lo + _BATCH, len(drafts)))) for lo in range(0, len(drafts), _BATCH)
    ]
    tail = max((sum(len(id_lists[j]) for j in b) for b in batches), default=0)
    table = np.empty((len(shared) + tail, block), dtype=np.int32)
    table[: len(shared)] = _block_table(shared, block, vocab)
    for batch in batches:
        own = [id_lists[j] for j in batch]
        for j, rows in zip(batch, _rows(own, shared, table, vocab), strict=True):
            d = drafts[j]
            d.prompt = _gather(table, rows, _prompt_buffer(d), d.session, vocab)


def _native_prompt(block: int, vocab: int) -> Callable[..., None] | None:
    """The native core's ``mooncake_prompts`` (``_native/prompts.cpp``: a list of prompts in
    one call), or None: no native core (or one built before it), or a shape it does not take
    (the numpy path then raises or builds as before)."""
    if not (block >= 1 and 1 <= vocab < 2**31):
        return None
    from radixsched import native  # (read at each call: tests swap the core)

    fn = getattr(native.core(), "mooncake_prompts", None)
    return None if fn is None else cast(Callable[..., None], fn)


def _prompt_buffer(d: _Draft) -> TokenArray:
    """The buffer ``d``'s prompt is built in: the one the prompt cache lent, else a new one."""
    return d.prompt if len(d.prompt) == d.length else np.empty(d.length, dtype=np.int32)


def _gather(
    table: TokenArray, rows: npt.NDArray[np.int64], out: TokenArray, line: int, vocab: int
) -> TokenArray:
    """``out`` filled with the blocks at ``rows`` of ``table``, cut to its length (the last
    block may be partial), then the request's own padding past the last block."""
    n, block = len(out), table.shape[1]
    full = min(len(rows), n // block)
    np.take(table, rows[:full], axis=0, out=out[: full * block].reshape(full, block))
    at = full * block
    if full < len(rows):  # the last block, cut to the prompt's length
        m = min(block, n - at)
        out[at : at + m] = table[rows[full], :m]
        at += m
    if at < n:
        _hash_tokens(_key(_SALT_PAD, line), at, n - at, vocab, out[at:])
    return out


def _rows(
    batch: list[npt.NDArray[np.int64]], shared: npt.NDArray[np.int64], table: TokenArray, vocab: int
) -> list[npt.NDArray[np.int64]]:
    """Each request's rows of ``table`` (``batch``: their hash ids): a shared block's in the
    head; the batch's own blocks are generated into the tail first (ids used once, so each lies
    in one request)."""
    ids = np.concatenate(batch)
    at = np.searchsorted(shared, ids)
    found = at < len(shared)
    found[found] = shared[at[found]] == ids[found]
    own = ~found
    n_own = int(own.sum())
    if n_own:
        table[len(shared) : len(shared) + n_own] = _block_table(ids[own], table.shape[1], vocab)
        at[own] = len(shared) + np.arange(n_own)
    cuts = np.cumsum([len(h) for h in batch])[:-1]
    return np.split(at, cuts)


def mooncake_block_hit_rate(path: str | Path, block_size: int = 512) -> float:
    """The Mooncake README's optimal reuse: per request in file order, the leading hash ids
    already seen, times ``block_size``, capped at ``input_length``, over all prompt tokens."""
    seen: set[int] = set()
    hit = total = 0
    for r in _mooncake_records(Path(path), block_size):
        ids = r.hash_ids.tolist()
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hit += min(k * block_size, r.input_length)
        total += r.input_length
        seen.update(ids)
    return hit / total


_JSONL_FIELDS = (
    "input_ids",
    "input_length",
    "prefix_group",
    "prefix_length",
    "output_length",
    "output_ids",
    "arrival_time",
    "timestamp",
    "priority",
    "routing_key",
    "tenant",
    "extra_key",
)


def _jsonl_draft(where: str, obj: dict[str, Any], index: int, vocab: int) -> _Draft:
    if unknown := sorted(set(obj) - set(_JSONL_FIELDS)):
        raise WorkloadError(
            f"{where}: unknown field {unknown[0]!r}; valid: {', '.join(_JSONL_FIELDS)}"
        )
    if ("input_ids" in obj) == ("input_length" in obj):
        raise WorkloadError(f"{where}: give exactly one of 'input_ids' and 'input_length'")
    if "input_ids" in obj:
        for name in ("prefix_group", "prefix_length"):
            if name in obj:
                raise WorkloadError(
                    f"{where}: field {name!r} needs 'input_length', not 'input_ids'"
                )
        prompt = _int_list(obj, "input_ids", where, nonempty=True)
        source = None
    else:
        n = _pos_int(obj, "input_length", where, MAX_PROMPT_TOKENS)
        group = obj.get("prefix_group")
        if (group is None) != ("prefix_length" not in obj):
            raise WorkloadError(f"{where}: 'prefix_group' and 'prefix_length' go together")
        shared = 0
        if group is not None:
            if isinstance(group, bool) or not isinstance(group, str | int):
                raise _bad(where, "prefix_group", "a string or integer", group)
            shared = _pos_int(obj, "prefix_length", where)
            if shared > n:
                raise WorkloadError(
                    f"{where}: field 'prefix_length': must be <= input_length ({n}), got {shared}"
                )
        prompt = _NO_TOKENS  # hashed when the load keeps the request (_fill_hashed)
        source = _HashedPrompt(None if group is None else str(group), shared, n, index, vocab)
    scripted = _int_list(obj, "output_ids", where, nonempty=False) if "output_ids" in obj else None
    if "output_length" in obj or scripted is None or not len(scripted):
        out = _pos_int(obj, "output_length", where)
    else:
        out = len(scripted)
    if "arrival_time" in obj and "timestamp" in obj:
        raise WorkloadError(f"{where}: give 'arrival_time' or 'timestamp', not both")
    ts: float | None = None
    if "arrival_time" in obj:
        ts = _nonneg_number(obj, "arrival_time", where)
    elif "timestamp" in obj:
        ts = _nonneg_number(obj, "timestamp", where) / 1e3
    priority = obj.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise _bad(where, "priority", "an integer", priority)
    if priority is not None and not -_INT64 <= priority < _INT64:
        raise _bad(where, "priority", "a signed 64-bit integer", priority)
    return _Draft(
        prompt,
        out,
        index,
        timestamp_s=ts,
        scripted=scripted,
        priority=priority,
        routing_key=_opt_str(obj, "routing_key", where),
        tenant=_opt_str(obj, "tenant", where),
        extra_key=_opt_str(obj, "extra_key", where),
        fill=None if source is None else _fill_hashed,
        source=source,
        length=0 if source is None else source.n,
    )


class _HashedPrompt(NamedTuple):
    """A prompt given by its length: ``shared`` tokens of its group's prefix, then its own."""

    group: str | None
    shared: int
    n: int
    line: int  # the request's line (its own tokens' key)
    vocab: int


def _fill_hashed(drafts: Sequence[_Draft]) -> None:
    _each_in_threads(drafts, _hashed_prompt)


def _hashed_prompt(d: _Draft) -> None:
    g, shared, n, line, vocab = d.source
    out = _prompt_buffer(d)
    if g is not None:
        _hash_tokens(_key(_SALT_GROUP, _str_key(g)), 0, shared, vocab, out[:shared])
    _hash_tokens(_key(_SALT_UNIQUE, line), shared, n - shared, vocab, out[shared:])
    d.prompt = out


def _build_jsonl(p: dict[str, Any], seed: int) -> list[_Draft]:
    path = Path(p["path"])
    drafts: list[_Draft] = []
    wheres: list[tuple[str, str]] = []  # each line's place and arrival field
    first_timed: bool | None = None
    for where, obj in _json_lines(path):
        d = _jsonl_draft(where, obj, len(drafts), p["vocab"])
        wheres.append((where, "arrival_time" if "arrival_time" in obj else "timestamp"))
        timed = d.timestamp_s is not None
        if first_timed is None:
            first_timed = timed
        elif timed != first_timed:
            raise WorkloadError(
                f"{where}: arrival given on some lines only: set 'arrival_time' or 'timestamp' "
                "on every line or on none"
            )
        drafts.append(d)
    if not drafts:
        raise WorkloadError(f"{path}: no requests")
    if first_timed:
        t0 = min(d.timestamp_s for d in drafts if d.timestamp_s is not None)
        for d, (where, name) in zip(drafts, wheres, strict=True):
            assert d.timestamp_s is not None
            if d.timestamp_s - t0 > MAX_ARRIVAL_S:
                value = d.timestamp_s if name == "arrival_time" else d.timestamp_s * 1e3
                raise _late(where, name, value, d.timestamp_s - t0)
            d.timestamp_s -= t0
    return drafts

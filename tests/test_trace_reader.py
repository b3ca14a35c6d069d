"""The fast Mooncake reader (orjson, hash ids checked in one array) against the checked,
line-by-line reader: the same records for every trace it takes, and for everything else the
checked reader's records or its error, word for word."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixsched.sim.workloads import mooncake_lines as reader
from radixsched.sim.workloads.tokens import MAX_PROMPT_TOKENS, WorkloadError

DATA = Path(__file__).parent / "data"
FULL_TRACE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")


def _reference(path: Path, block: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """What the checked reader alone gives: its records, or its error's text."""
    with monkeypatch.context() as m:
        m.setattr(reader, "_fast_mooncake_records", lambda p, b: None)
        return _outcome(path, block)


def _outcome(path: Path, block: int) -> Any:
    try:
        recs = reader._mooncake_records(path, block)
    except WorkloadError as exc:
        return ("error", str(exc))
    return [
        (r.where, r.timestamp_ms.hex(), r.input_length, r.output_length, *_ids(r.hash_ids))
        for r in recs
    ]


def _ids(ids: np.ndarray) -> tuple[Any, ...]:
    return (ids.dtype, ids.tolist())


def _line(ts: str, n: Any, o: Any, ids: Any, extra: str = "") -> str:
    return (
        f'{{"timestamp": {ts}, "input_length": {json.dumps(n)}, '
        f'"output_length": {json.dumps(o)}, "hash_ids": {json.dumps(ids)}{extra}}}\n'
    )


def _write(tmp: Path, text: str | bytes, name: str = "t.jsonl") -> Path:
    path = tmp / name
    if isinstance(text, str):
        text = text.encode()
    if name.endswith(".gz"):
        text = gzip.compress(text)
    path.write_bytes(text)
    return path


GOOD = (
    _line("0", 1000, 5, [0, 1])
    + "\n  \t\n"  # blank lines are skipped
    + _line("12.5", 513, 1, [2, 3, 4, 5], ', "extra": {"deep": [1.5, null, "x"]}')
    + _line("-0.0", 600, 2, [])  # no ids: all padding; -0.0 is non-negative
    + _line("1e3", 4, 3, [2**31 - 1])
    + " "
    + _line("7", MAX_PROMPT_TOKENS, 9, [0] * 3)
)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_fast_reader_takes_plain_traces_and_gives_the_checked_records(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, GOOD, name)
    assert reader._fast_mooncake_records(path, 512) is not None  # the fast path served
    got = _outcome(path, 512)
    assert got == _reference(path, 512, monkeypatch)
    assert [r[0] for r in got] == [f"{path}:{i}" for i in (1, 4, 5, 6, 7)]
    assert got[1][-1] == [2, 3]  # the ids the prompt uses: ceil(513 / 512)
    assert got[2][1] == (-0.0).hex()


def test_fast_reader_gives_the_full_trace_as_the_checked_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for path in (FULL_TRACE, DATA / "mooncake_sample.jsonl"):
        if not path.exists():
            continue
        assert reader._fast_mooncake_records(path, 512) is not None
        assert _outcome(path, 512) == _reference(path, 512, monkeypatch)


BAD_LINES = [
    '{"timestamp": 1, "input_length": 10, "output_length": 1}\n',  # missing hash_ids
    '{"timestamp": 1, "input_length": null, "output_length": 1, "hash_ids": []}\n',
    _line("1", 10, 1, [True, 1]),  # numpy would read this bool as 1: the checked reader takes it
    _line("1", 10, 1, [True]),
    _line("true", 10, 1, [1]),
    _line("1", True, 1, [1]),
    _line("1", 10, 1, [1.0]),
    _line("1", 10, 1, [-1]),
    _line("1", 10, 1, [2**31]),
    _line("1", 10, 1, [2**63]),
    _line("1", 10, 1, [2**64]),
    _line("1", 10, 1, [[1]]),
    _line("1", 10, 1, [1, [2]]),
    _line("1", 10, 1, [None]),
    _line("1", 10, 1, ["1"]),
    _line("1", 10, 1, {"a": 1}),
    _line("1", 0, 1, [1]),
    _line("1", MAX_PROMPT_TOKENS + 1, 1, [1]),
    _line("1", 10, 0, [1]),
    _line("1", 10, 2**64, [1]),
    _line("-1", 10, 1, [1]),
    _line("-1e-300", 10, 1, [1]),
    _line("1e400", 10, 1, [1]),
    _line("NaN", 10, 1, [1]),
    _line("Infinity", 10, 1, [1]),
    _line('"5"', 10, 1, [1]),
    _line("18446744073709551616", 10, 1, [1]),  # past 64 bits: orjson reads a float
    _line("1" + "0" * 400, 10, 1, [1]),
    _line("1e18", 10, 1, [1]),  # too late after the first request
    "[1, 2]\n",
    '"text"\n',
    "not json\n",
    '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1],}\n',
    '{"timestamp": 1, "timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": []}\n',
    '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [], "s": "\\ud800"}\n',
    "\u3000\n",  # blank for str.strip, not for bytes.strip
    "\ufeff" + _line("1", 10, 1, [1]),
]


@pytest.mark.parametrize("bad", BAD_LINES)
@pytest.mark.parametrize("at", [0, 1])
def test_lines_the_fast_reader_declines_give_the_checked_readers_outcome(
    tmp_path: Path, bad: str, at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [_line("0", 600, 1, [0, 1]), _line("3", 10, 1, [5])]
    lines.insert(at + 1, bad)
    path = _write(tmp_path, "".join(lines))
    assert _outcome(path, 512) == _reference(path, 512, monkeypatch)


def test_the_first_bad_line_is_reported_even_when_a_later_one_is_bad_too(
    tmp_path: Path,
) -> None:
    text = _line("0", 10, 1, [1]) + _line("1", 10, 1, [-5]) + "{oops\n"
    path = _write(tmp_path, text)
    assert _outcome(path, 512) == (
        "error",
        f"{path}:2: field 'hash_ids': expected integers in [0, 2^31), got '[-5]'",
    )
    path = _write(tmp_path, b'{"timestamp": 0, "input_length": 9}\n\xff\n', "u.jsonl")
    assert _outcome(path, 512) == ("error", f"{path}:1: missing field 'output_length'")


def test_a_corrupt_gzip_tail_after_a_bad_line_reports_the_bad_line(tmp_path: Path) -> None:
    body = _line("0", 10, 1, [-1]) + _line("1", 10, 1, [1]) * 20000
    data = gzip.compress(body.encode())
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    got = _outcome(path, 512)
    assert got == (
        "error",
        f"{path}:1: field 'hash_ids': expected integers in [0, 2^31), got '[-1]'",
    )


def test_without_orjson_the_checked_reader_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, GOOD)
    want = _outcome(path, 512)
    monkeypatch.setitem(sys.modules, "orjson", None)  # import orjson now raises ImportError
    assert reader._fast_mooncake_records(path, 512) is None
    assert _outcome(path, 512) == want


_NUMBER_TEXT = st.one_of(
    st.integers(-5, 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(min_value=0, max_value=1e12).map(lambda x: f"{x:.25e}"),
    st.floats(min_value=0, max_value=1e6).map(lambda x: f"{x:.30f}"),
    st.sampled_from(["true", "null", '"1"', "[]", "1e400", "-0", "0.0e-0"]),
)
_IDS = st.one_of(
    st.lists(st.integers(0, 2**31 - 1), max_size=6),
    st.lists(st.one_of(st.integers(-3, 2**65), st.booleans(), st.floats(0, 9)), max_size=4),
)
_LENGTH = st.one_of(st.integers(1, 5000), st.sampled_from([0, -1, True, 1.0, None, 2**64]))
_ROW = st.tuples(_NUMBER_TEXT, _LENGTH, _LENGTH, _IDS)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(_ROW, min_size=0, max_size=5), block=st.sampled_from([1, 16, 512]))
def test_any_trace_reads_as_the_checked_reader_reads_it(
    tmp_path_factory: pytest.TempPathFactory, rows: list[Any], block: int
) -> None:
    tmp = tmp_path_factory.mktemp("trace")
    path = _write(tmp, "".join(_line(ts, n, o, ids) for ts, n, o, ids in rows))
    with pytest.MonkeyPatch.context() as m:
        assert _outcome(path, block) == _reference(path, block, m)


def test_fast_records_share_one_int64_array(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    recs = reader._fast_mooncake_records(path, 512)
    assert recs is not None
    assert all(r.hash_ids.dtype == np.int64 and r.hash_ids.flags.c_contiguous for r in recs)


def test_a_ragged_id_list_is_one_error_naming_line_and_field(tmp_path: Path) -> None:
    # [1, [2]] made numpy raise (a traceback); now the field's error, as for any bad id.
    path = tmp_path / "t.jsonl"
    path.write_text(_line("1", 10, 1, [1]) + _line("2", 10, 1, [1, [2]]))
    with pytest.raises(WorkloadError, match=r":2: field 'hash_ids': expected a list of non-neg"):
        reader._mooncake_records(path, 16)


@pytest.mark.skipif(not Path("/dev/fd").is_dir(), reason="needs /dev/fd")
def test_a_piped_trace_with_a_line_the_fast_reader_leaves_is_read_once(tmp_path: Path) -> None:
    # The fast reader would drain part of the pipe before handing the trace to the checked
    # reader, which would then read from the middle: a pipe goes to the checked reader alone.
    import os
    import threading

    text = _line("1", 10, 1, [1]) + _line("2", 10, 1, [2], ', "flag": true') + _line("3", 4, 1, [3])
    r, w = os.pipe()

    def write() -> None:
        with os.fdopen(w, "wb") as f:
            f.write(text.encode())

    writer = threading.Thread(target=write)
    writer.start()
    try:
        piped = reader._mooncake_records(Path(f"/dev/fd/{r}"), 16)
    finally:
        writer.join()
        os.close(r)
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    assert [r.input_length for r in piped] == [10, 10, 4]
    assert [r.input_length for r in reader._mooncake_records(path, 16)] == [10, 10, 4]


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 1 << 22])
@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_the_fast_reader_reads_lines_split_across_its_blocks(
    tmp_path: Path, block_bytes: int, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocks of whole lines, whatever the read size: a line cut by a read (or a blank line, or
    # a last line without its newline) gives the line numbers and records of the checked reader.
    text = GOOD + "\n\n" + _line("9", 70, 2, [8, 9]).rstrip("\n")
    path = _write(tmp_path, text, name)
    want = _reference(path, 16, monkeypatch)
    monkeypatch.setattr(reader, "_BLOCK_BYTES", block_bytes)
    assert reader._fast_mooncake_records(path, 16) is not None
    assert _outcome(path, 16) == want


@pytest.mark.parametrize("block_bytes", [5, 300])
def test_a_bad_line_in_any_block_leaves_the_trace_to_the_checked_reader(
    tmp_path: Path, block_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [_line(str(i), 600, 1, [i, i + 1]) for i in range(12)]
    lines[9] = _line("9", 600, 1, [True])  # late in the file: a later block than the first
    path = _write(tmp_path, "".join(lines))
    monkeypatch.setattr(reader, "_BLOCK_BYTES", block_bytes)
    assert reader._fast_mooncake_records(path, 512) is None
    assert _outcome(path, 512) == _reference(path, 512, monkeypatch)


def test_the_sample_trace_reads_the_same_in_small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    path = DATA / "mooncake_sample.jsonl"
    want = _outcome(path, 512)
    monkeypatch.setattr(reader, "_BLOCK_BYTES", 4096)
    assert _outcome(path, 512) == want == _reference(path, 512, monkeypatch)


@pytest.mark.parametrize(
    "ids", [[1, 2.0], [1, None], [1, "2"], [1, [2]], [2**63], [2**64], [-1], [2**31]]
)
def test_checked_ids_take_ints_in_range_alone(ids: list[Any]) -> None:
    assert reader._checked_ids(ids) is None  # not an int, past 64 bits, or out of range


def test_checked_ids_are_the_ids_as_int64() -> None:
    got = reader._checked_ids([0, 7, 2**31 - 1])
    assert got is not None and got.dtype == np.int64 and got.tolist() == [0, 7, 2**31 - 1]


def test_checked_ids_are_packed_a_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_ID_CHUNK", 3)
    got = reader._checked_ids(list(range(8)))
    assert got is not None and got.tolist() == list(range(8))
    assert reader._checked_ids([0, 1, 2, 3, 4.0, 5, 6]) is None  # in the second chunk
    assert reader._checked_ids([0, 1, 2, 3, 4, 5, 2**31]) is None  # in the last, partial one


@pytest.mark.parametrize(
    ("block", "found"),
    [
        (b'{"timestamp": 1, "hash_ids": [1]}', False),
        (b'{"a": true}', True),
        (b'{"a": false}', True),
        (b'{"route": 1, "f": 2}', False),  # an r and an f, but no bool
        (b'{"x": "tru", "y": "fals"}', False),
    ],
)
def test_has_bool_finds_the_literals_alone(block: bytes, found: bool) -> None:
    assert reader._has_bool(block) is found


def _columns(read: Any) -> Any:
    assert read is not None
    cols, blocks = read
    assert sum(rows for _, rows in blocks) == len(cols.lines)
    ids = np.concatenate([a for a, _ in blocks])
    return (*(list(c) for c in cols[:5]), [float(t).hex() for t in cols.stamps], _ids(ids))


PLAIN = (
    _line("0", 1000, 5, [0, 1])
    + '{"hash_ids":[7,2147483647] ,"output_length":3,"timestamp":9007199254740992,\t'
    + '"input_length":16777216}\r\n'
    + '  { "input_length" : 4 , "timestamp" : 12 , "hash_ids" : [ ] , "output_length" : 1 }  \n'
    + _line("30", 600, 2, [])
    + _line("31", 2, 2, [0])  # no newline at the end of the file
)


@pytest.mark.parametrize("block_bytes", [1 << 22, 64])
def test_native_columns_are_orjsons_for_plain_lines(
    tmp_path: Path, block_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, PLAIN[:-1])
    monkeypatch.setattr(reader, "_BLOCK_BYTES", block_bytes)  # several blocks, lines split
    native = reader._native_columns(path)
    assert native is not None and native[0].lines == [1, 2, 3, 4, 5]
    assert _columns(native) == _columns(reader._orjson_columns(path))
    assert native[0].stamps[1] == 2.0**53 and native[0].counts == [2, 2, 0, 0, 1]


DECLINED = [
    _line("1.0", 10, 1, [1]),  # a float: orjson's to read
    _line("1e3", 10, 1, [1]),
    _line("-0", 10, 1, [1]),
    _line("01", 10, 1, [1]),
    _line("9007199254740993", 10, 1, [1]),  # past 2^53: not exact as a double
    _line("1", 10, 1, [1], ', "x": 1'),  # another key
    _line("1", 10, 1, [1, 2.0]),
    _line("1", 10, 1, [1, -2]),
    _line("1", 10, 1, [2**31]),  # out of _checked_ids' range
    _line("1", 0, 1, [1]),  # out of _add_columns' ranges
    _line("1", MAX_PROMPT_TOKENS + 1, 1, [1]),
    _line("1", 10, 0, [1]),
    '{"timestamp": 1, "timestamp": 1, "output_length": 1, "hash_ids": []}\n',
    '{"timestamp": 1, "input_length": 10, "output_length": 1}\n',
    '{"timest\\u0061mp": 1, "input_length": 10, "output_length": 1, "hash_ids": []}\n',
    '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1,]}\n',
    '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]} x\n',
    '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}}\n',
    '{"timestamp": 1 "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
    "\n",
]


@pytest.mark.parametrize("bad", DECLINED)
def test_native_columns_decline_any_other_line(tmp_path: Path, bad: str) -> None:
    path = _write(tmp_path, _line("0", 600, 1, [0, 1]) + bad + _line("3", 10, 1, [5]))
    assert reader._native_columns(path) is None


def test_native_columns_need_the_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import radixsched.native as native

    path = _write(tmp_path, PLAIN)
    assert reader._native_columns(path) is not None
    monkeypatch.setattr(native, "core", lambda: None)
    assert reader._native_columns(path) is None
    assert _outcome(path, 512) == _reference(path, 512, monkeypatch)  # through orjson


@pytest.mark.parametrize(
    "line",
    [
        b'{"timestamp": 1, "timestamp": 2, "output_length": 1, "hash_ids": [3]}',
        b'{"timestamp": 1, "input_length": 10, "input_length": 10, "hash_ids": []}',
        b'{"hash_ids": [1], "input_length": 10, "output_length": 1, "hash_ids": [2]}',
    ],
)
def test_native_lines_take_each_key_once(line: bytes) -> None:
    """A key twice leaves another unset: declined, whatever the columns held before."""
    from radixsched.native import core

    parse = getattr(core(), "mooncake_lines", None)
    if parse is None:
        pytest.skip("no native core")
    cols = [np.full(1, 7.0), *(np.full(1, 7, dtype=np.int64) for _ in range(3))]
    assert parse(line, *cols, np.zeros(4, dtype=np.int64)) == -1
    good = b'{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [2]}'
    assert parse(good, *cols, np.zeros(4, dtype=np.int64)) == 1


def test_fast_records_are_made_when_asked_for(tmp_path: Path) -> None:
    path = _write(tmp_path, PLAIN)
    recs = reader._fast_mooncake_records(path, 512)
    assert isinstance(recs, reader._MooncakeLines) and len(recs) == 5
    assert recs[-1].where == f"{path}:5" and recs[1].timestamp_ms == 2.0**53
    assert [r.where for r in recs[1:4:2]] == [recs[1].where, recs[3].where]
    assert (recs[2].input_length, recs[2].output_length, recs[2].hash_ids.tolist()) == (4, 1, [])


def test_the_native_id_bound_holds_the_densest_ids(tmp_path: Path) -> None:
    # One-digit ids, no spaces: two bytes an id, the densest a line can hold them (the bound
    # of ``_native_block`` is its bytes over two). A tighter bound would decline the block.
    line = '{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[%s]}'
    path = tmp_path / "dense.jsonl"
    path.write_text("\n".join(line % ",".join("7" * 2000) for _ in range(3)))
    from radixsched.native import core

    if getattr(core(), "mooncake_lines", None) is None:
        pytest.skip("no native core")
    native = reader._native_columns(path)
    assert native is not None
    ids = np.concatenate([block for block, _rows in native[1]])
    assert native[0].counts == [2000] * 3 and ids.tolist() == [7] * 6000


@pytest.mark.parametrize("block_bytes", [1 << 22, 64, 16, 7])
@pytest.mark.parametrize("end", ["", "\n"])
def test_buffered_blocks_are_the_files_lines_numbered(
    tmp_path: Path, block_bytes: int, end: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = PLAIN[:-1] + "short\n" + "x" * 200 + "\n" + _line("7", 3, 1, [2])[:-1] + end
    path = _write(tmp_path, text)
    monkeypatch.setattr(reader, "_BLOCK_BYTES", block_bytes)  # lines past it: the buffer grows
    lines: list[tuple[int, bytes]] = []
    for first, block, rows in reader._buffered_blocks(path):
        got = bytes(block).split(b"\n")
        assert len(got) == rows and isinstance(block, memoryview)
        lines += [(first + k, raw) for k, raw in enumerate(got)]
    want = text.encode().split(b"\n")
    want = want[:-1] if end else want
    assert lines == list(enumerate(want, 1))
    zipped = tmp_path / "t.jsonl.gz"
    zipped.write_bytes(gzip.compress(text.encode()))
    assert [(f, bytes(b), r) for f, b, r in reader._buffered_blocks(zipped)] == [
        (f, bytes(b), r) for f, b, r in reader._buffered_blocks(path)
    ]


def test_buffered_blocks_without_readinto_are_line_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, PLAIN)

    class Plain:  # a reader with read() alone
        def __init__(self, p: Path) -> None:
            self.f = p.open("rb")

        def read(self, n: int) -> bytes:
            return self.f.read(n)

        def __enter__(self) -> Plain:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    monkeypatch.setattr(reader, "open_trace", Plain)
    got = list(reader._buffered_blocks(path))
    assert got == list(reader._line_blocks(path)) and all(type(b) is bytes for _, b, _ in got)


@pytest.mark.parametrize(
    ("late", "accepted"),
    [("1000000000000", True), ("1000000000001", False), ("2000000000000000", False)],
)
def test_the_native_reader_finds_the_first_late_stamp_as_the_checked_one(
    tmp_path: Path, late: str, accepted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [_line("0", 600, 1, [0, 1]), _line(late, 10, 1, [5]), _line(late, 10, 1, [6])]
    path = _write(tmp_path, "".join(lines))
    assert reader._native_columns(path) is not None  # integers: the native reader takes them
    got = _outcome(path, 512)
    assert got == _reference(path, 512, monkeypatch)
    assert (got[0] != "error") == accepted and (accepted or ":2:" in got[1])
    assert reader._first_late([5.0, 1e12 + 5.0, 2e12], 5.0) == 2
    assert reader._first_late([], 0.0) is None

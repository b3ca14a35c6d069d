"""An audit of the on-disk prompt cache (``sim.prompt_cache`` and its use in
``sim.workloads``): inputs a user can give that must still load the right prompts, and never
crash, hang or let the folder grow past its cap.

The first tests are inputs that once went wrong (each failed before its fix):

- a trace read from a pipe (``/dev/fd/N``, ``<(zcat ...)``) or a named FIFO: the key was hashed
  by opening the path again after the parse (a pipe hashed empty, a FIFO blocked for good);
  only regular files are cached now;
- a trace replaced between its parse and its hash stored the old prompts under the new key;
  the file must be the same (device, inode, size, mtime) before the parse and after the hash;
- two builds of one trace at once in one process shared a temporary file (``.KEY.PID.tmp``,
  opened with ``O_TRUNC``), and the second truncated the file the first wrote through its
  mapping (SIGBUS); builds are unnamed ``O_TMPFILE`` files now;
- a build that was killed left its full-size temporary file, which nothing counted against
  the cap; an unnamed file leaves nothing.

The rest pin edge cases that work and should keep working."""

from __future__ import annotations

import contextlib
import gzip
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixsched.config import SchedulerConfig
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads import prompt_cache, traces
from radixsched.sim.workloads.load import Workload, load_workload

SAMPLE = Path(__file__).parent / "data" / "mooncake_sample.jsonl"


def _prompts(wl: Workload) -> dict[str, bytes]:
    return {r.rid: r.prompt_ids.tobytes() for r in wl.requests}


def _built(monkeypatch: pytest.MonkeyPatch, spec: str, **kw: Any) -> Workload:
    """The workload with the prompt cache off: the prompts every load must equal."""
    with monkeypatch.context() as m:
        m.setenv("RADIXSCHED_PROMPT_CACHE", "off")
        wl = load_workload(spec, **kw)
    assert wl.prompts == "built"
    return wl


def _shifted(text: str, by: int) -> str:
    """The Mooncake trace ``text`` with every hash id moved by ``by``: the same requests
    (lengths, timestamps), other blocks."""
    out = []
    for line in text.splitlines():
        rec = json.loads(line)
        rec["hash_ids"] = [h + by for h in rec["hash_ids"]]
        out.append(json.dumps(rec))
    return "\n".join(out) + "\n"


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.prompts"))


# ---- inputs that once went wrong ---------------------------------------------------------


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def _load_from_pipe(spec: str, data: bytes) -> Workload:
    """``load_workload`` on ``spec:/dev/fd/N``, a pipe a thread writes ``data`` into (what
    ``mooncake:<(zcat trace.jsonl.gz)`` gives a script)."""
    r, w = os.pipe()

    def write() -> None:
        with os.fdopen(w, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        return load_workload(f"{spec}:/dev/fd/{r}")
    finally:
        writer.join()
        os.close(r)


@pytest.mark.skipif(not Path("/dev/fd").is_dir(), reason="needs /dev/fd")
def test_a_piped_trace_gets_its_own_prompts_not_those_of_an_earlier_pipe(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two traces of three requests each; in the second, the requests share a 40-token prefix.
    first = _jsonl([{"input_length": 50, "output_length": 3}] * 3)
    group = {"prefix_group": "sys", "prefix_length": 40}
    second = _jsonl([{"input_length": 50, "output_length": 3, **group}] * 3)
    assert _load_from_pipe("jsonl", first).requests
    piped = _load_from_pipe("jsonl", second)
    path = tmp_path / "second.jsonl"
    path.write_bytes(second)
    want = _built(monkeypatch, f"jsonl:{path}")
    # A key hashed from the path after the reader drained the pipe would be one key for every
    # piped jsonl trace of this vocab: the second pipe would map the first one's prompts.
    assert _prompts(piped) == _prompts(want), f"prompts {piped.prompts!r} of another trace"
    assert len({bytes(r.prompt_ids[:40]) for r in piped.requests}) == 1


def test_a_trace_read_from_a_named_fifo_loads_and_returns(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _prompts(_built(monkeypatch, f"mooncake:{SAMPLE}"))
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    data = SAMPLE.read_bytes()
    got: list[Workload] = []

    def write() -> None:
        with fifo.open("wb") as f:
            f.write(data)

    writer = threading.Thread(target=write, daemon=True)
    loader = threading.Thread(target=lambda: got.append(load_workload(f"mooncake:{fifo}")))
    loader.daemon = True
    writer.start()
    loader.start()
    loader.join(timeout=30)  # a load takes well under a second; a hung one never ends
    hung = loader.is_alive()
    deadline = time.monotonic() + 10
    while loader.is_alive() and time.monotonic() < deadline:
        # Were the FIFO opened again to hash it, the load would wait in open() for a writer
        # that never comes: an empty writer lets the thread end.
        with contextlib.suppress(OSError):  # OSError: no reader yet
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        loader.join(timeout=0.05)
    writer.join(timeout=10)
    assert not hung, "load_workload blocked for good re-opening the FIFO to hash the trace"
    assert got and _prompts(got[0]) == want


def test_a_trace_replaced_while_it_loads_never_maps_its_old_prompts(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(SAMPLE.read_bytes())
    regenerated = _shifted(SAMPLE.read_text(), 500_000)  # same requests and lengths
    real = traces._mooncake_records
    replaced: list[bool] = []

    def read_then_replaced(p: Path, block: int) -> Any:
        records = real(p, block)
        if not replaced:  # a script writes the next version of the trace meanwhile
            staged = tmp_path / "staged.jsonl"
            staged.write_text(regenerated)
            os.replace(staged, path)
            replaced.append(True)
        return records

    monkeypatch.setattr(traces, "_mooncake_records", read_then_replaced)
    load_workload(f"mooncake:{path}")  # the old file's prompts: what it read
    monkeypatch.setattr(traces, "_mooncake_records", real)
    assert replaced
    after = load_workload(f"mooncake:{path}")
    want = _built(monkeypatch, f"mooncake:{path}")
    # A key hashed from the new file over prompts built from the old one would make every
    # later load of the new file map the old file's prompts.
    assert _prompts(after) == _prompts(want), f"prompts {after.prompts!r} of the old trace"


_TWO_THREADS = """
import os, sys, threading
from radixsched.sim.workloads import load as workloads
from radixsched.sim.workloads import traces
from radixsched.sim.workloads.load import load_workload

spec = "mooncake:" + sys.argv[1]
real_gather, real_native, real_reserve = traces._gather, traces._native_prompt, os.posix_fallocate
a_waits, b_opened, a_wrote = threading.Event(), threading.Event(), threading.Event()

def gated(write, *args):  # a prompt's write, on the numpy path or the native one
    if threading.current_thread().name == "A" and not a_waits.is_set():
        a_waits.set()  # A has its file and is about to write its first prompt
        b_opened.wait(30)
        out = write(*args)
        a_wrote.set()
        return out
    return write(*args)

def gather(*args):
    return gated(real_gather, *args)

def native(block, vocab):
    write = real_native(block, vocab)
    return None if write is None else (lambda *args: gated(write, *args))

def reserve(fd, offset, length):
    if threading.current_thread().name == "B":
        b_opened.set()  # B has opened its temporary file, not yet reserved it
        a_wrote.wait(30)
    real_reserve(fd, offset, length)

traces._gather, traces._native_prompt, os.posix_fallocate = gather, native, reserve
loaded = {}

def run(name):
    if name == "B":
        a_waits.wait(30)
    loaded[name] = load_workload(spec)

threads = [threading.Thread(target=run, args=(n,), name=n) for n in "AB"]
for t in threads:
    t.start()
for t in threads:
    t.join()
traces._gather, traces._native_prompt, os.posix_fallocate = real_gather, real_native, real_reserve
os.environ["RADIXSCHED_PROMPT_CACHE"] = "off"
want = {r.rid: r.prompt_ids.tobytes() for r in load_workload(spec).requests}
for name in "AB":
    got = {r.rid: r.prompt_ids.tobytes() for r in loaded[name].requests}
    assert got == want, name + " loaded wrong prompts"
print("ok", loaded["A"].prompts, "/", loaded["B"].prompts)
"""


def test_two_threads_building_one_trace_neither_crash_nor_corrupt(
    prompts_dir: Path, tmp_path: Path
) -> None:
    # Two loads of one trace in one process (threads, or asyncio.to_thread), the second
    # starting while the first builds into its cache file: a file the two shared by name
    # would be truncated by the second under the first's mapping, and the first's next write
    # would fault. The hooks only order the two threads.
    path = tmp_path / "trace.jsonl"
    path.write_bytes(SAMPLE.read_bytes())
    proc = subprocess.run(
        [sys.executable, "-c", _TWO_THREADS, str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    died = f" (killed by {signal.Signals(-proc.returncode).name})" if proc.returncode < 0 else ""
    assert proc.returncode == 0, f"exit {proc.returncode}{died}: {proc.stderr[-2000:]}"
    assert proc.stdout.startswith("ok")


_KILLED_BUILD = """
import os, signal, sys
from radixsched.sim.workloads import load as workloads
from radixsched.sim.workloads import traces

def killed(*args):
    os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, a job's time limit, kill -9

traces._gather = killed  # the numpy path's blocks
traces._native_prompt = lambda block, vocab: killed  # the native path's prompts
workloads.load_workload("mooncake:" + sys.argv[1])
"""


def test_builds_killed_midway_leave_the_folder_within_its_cap(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(SAMPLE.read_bytes())
    with monkeypatch.context() as m:  # the size of the trace's entry, in another folder
        m.setenv("RADIXSCHED_CACHE_DIR", str(tmp_path / "sizing"))
        assert load_workload(f"mooncake:{path}").prompts == "built, cached"
        (entry,) = _entries(tmp_path / "sizing" / "prompts")
        size = entry.stat().st_size
    cap = int(2.5 * size)
    monkeypatch.setenv("RADIXSCHED_CACHE_MAX_GB", repr(cap / (1 << 30)))
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED_BUILD, str(path)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert load_workload(f"mooncake:{path}").prompts == "built, cached"
    files = {p.name: p.stat().st_size for p in prompts_dir.iterdir()}
    # A killed build must leave nothing: its file is reserved at full size before the prompts
    # are built, and a named temporary file would not count against the cap.
    assert sum(files.values()) <= cap, f"{sum(files.values()):,} bytes > cap {cap:,}: {files}"


# ---- edge cases that work ----------------------------------------------------------------


def test_compressed_traces_and_copies_at_other_paths_map_the_right_entry(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zstandard = pytest.importorskip("zstandard")
    want = _prompts(_built(monkeypatch, f"mooncake:{SAMPLE}"))
    raw = SAMPLE.read_bytes()
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "t.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    (tmp_path / "odd dir é").mkdir()
    (tmp_path / "odd dir é" / "copy.jsonl").write_bytes(raw)
    for name in ("t.jsonl.gz", "t.jsonl.zst"):  # keyed by the compressed bytes: own entries
        spec = f"mooncake:{tmp_path / name}"
        assert [load_workload(spec).prompts for _ in range(2)] == [
            "built, cached",
            "from the cache",
        ]
        assert _prompts(load_workload(spec)) == want
    assert load_workload(f"mooncake:{SAMPLE}").prompts == "built, cached"
    copy = load_workload(f"mooncake:{tmp_path / 'odd dir é' / 'copy.jsonl'}")
    assert copy.prompts == "from the cache"  # the same bytes elsewhere: the same entry
    assert _prompts(copy) == want
    assert len(_entries(prompts_dir)) == 3


@pytest.mark.parametrize(
    "params",
    [
        "vocab=128000",
        "vocab=128_000,block_size=0512",
        " vocab = 128000 , block-size=512",
        "block_size=512,vocab=128000",
    ],
)
def test_param_spellings_of_the_defaults_map_the_default_entry(
    prompts_dir: Path, monkeypatch: pytest.MonkeyPatch, params: str
) -> None:
    assert load_workload(f"mooncake:{SAMPLE}").prompts == "built, cached"
    spelled = load_workload(f"mooncake:path={SAMPLE},{params}")
    assert spelled.prompts == "from the cache"
    assert _prompts(spelled) == _prompts(_built(monkeypatch, f"mooncake:{SAMPLE}"))
    assert len(_entries(prompts_dir)) == 1


def test_subsets_of_a_trace_in_shuffled_arrival_order_map_the_built_prompts(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [json.loads(x) for x in SAMPLE.read_text().splitlines()]
    stamps = np.random.default_rng(7).permutation(len(lines)) * 250
    for rec, ts in zip(lines, stamps.tolist(), strict=True):
        rec["timestamp"] = ts  # arrival order is not line order
    path = tmp_path / "shuffled.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec = f"mooncake:{path}"
    first = load_workload(spec, num_requests=len(lines) + 5)  # all of them: a full load
    assert first.prompts == "built, cached"
    for n in (1, 7, 120):
        mapped = load_workload(spec, num_requests=n)
        built = _built(monkeypatch, spec, num_requests=n)
        assert mapped.prompts == "from the cache"
        assert [r.rid for r in mapped.requests] == [r.rid for r in built.requests]
        assert _prompts(mapped) == _prompts(built)
        assert [r.arrival_time for r in mapped.requests] == [r.arrival_time for r in built.requests]


def test_an_entry_that_is_a_directory_or_a_link_to_the_trace_harms_nothing(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(SAMPLE.read_bytes())
    want = _prompts(_built(monkeypatch, f"mooncake:{path}"))
    load_workload(f"mooncake:{path}")
    (entry,) = _entries(prompts_dir)
    entry.unlink()
    entry.symlink_to(path)  # an entry that is the user's own trace
    again = load_workload(f"mooncake:{path}")
    assert again.prompts == "built, cached"  # the link was removed, not its target
    assert _prompts(again) == want
    assert path.read_bytes() == SAMPLE.read_bytes()
    assert not entry.is_symlink()
    entry.unlink()
    entry.mkdir()  # an entry that is a folder: built each time, never an error
    assert [load_workload(f"mooncake:{path}").prompts for _ in range(2)] == ["built", "built"]
    assert entry.is_dir()
    assert not [p for p in prompts_dir.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", 8 << 30),
        ("garbage", 8 << 30),
        ("8GB", 8 << 30),
        ("-1", 8 << 30),
        ("nan", 8 << 30),
        ("inf", 8 << 30),
        ("1e9", 8 << 30),
        (" 0.5 ", 1 << 29),
        ("0", 0),
    ],
)
def test_cache_max_gb_values(monkeypatch: pytest.MonkeyPatch, text: str, want: int) -> None:
    monkeypatch.setenv("RADIXSCHED_CACHE_MAX_GB", text)
    assert prompt_cache.max_bytes() == want


def test_a_cap_of_zero_stores_nothing(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXSCHED_CACHE_MAX_GB", "0")
    assert [load_workload(f"mooncake:{SAMPLE}").prompts for _ in range(2)] == ["built", "built"]
    assert not _entries(prompts_dir)


_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("lpm", {"page_size": 1}),
    ("fair", {"page_size": 16, "chunked_prefill_size": 512, "enable_mixed_chunk": True}),
    ("fcfs", {"page_size": 16, "chunked_prefill_size": 1024, "disable_radix_cache": True}),
    ("dfs-weight", {"page_size": 4, "chunked_prefill_size": 2048, "enable_mixed_chunk": True}),
    ("hrrn", {"page_size": 1, "radix_eviction_policy": "lfu"}),
]


def test_simulations_on_stored_and_mapped_prompts_equal_those_on_built_ones(
    prompts_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = f"mooncake:{SAMPLE}"
    stored = load_workload(spec)  # built into the new file's mapping
    mapped = load_workload(spec)
    built = _built(monkeypatch, spec)
    assert (stored.prompts, mapped.prompts) == ("built, cached", "from the cache")
    assert not any(r.prompt_ids.flags.writeable for r in stored.requests + mapped.requests)
    sim = SimConfig(max_total_tokens=60_000)
    for policy, kw in _CONFIGS:
        cfg = SchedulerConfig(schedule_policy=policy, **kw)
        runs = [simulate(wl, cfg, sim) for wl in (built, stored, mapped)]
        seen = [[(r.rid, r.output_ids, r.times.token_times) for r in run.requests] for run in runs]
        assert runs[0].result.hit_rate == runs[1].result.hit_rate == runs[2].result.hit_rate
        assert seen[0] == seen[1] == seen[2], policy


def test_mapped_prompts_outlive_their_entry_being_removed_and_rebuilt(
    prompts_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = f"mooncake:{SAMPLE}"
    want = _prompts(_built(monkeypatch, spec))
    stored = load_workload(spec)
    mapped = load_workload(spec)
    (entry,) = _entries(prompts_dir)
    entry.unlink()  # "everything in it can be deleted at any time"
    assert load_workload(spec).prompts == "built, cached"  # a new file under the same name
    (entry,) = _entries(prompts_dir)
    entry.unlink()
    assert _prompts(stored) == _prompts(mapped) == want


def _digest_of_load(spec: str) -> tuple[str, bytes]:
    wl = load_workload(spec)
    order = sorted(wl.requests, key=lambda r: r.rid)
    return wl.prompts, b"".join(r.prompt_ids.tobytes() for r in order)


def test_processes_storing_one_trace_at_once_all_load_it_right(
    prompts_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = f"mooncake:{SAMPLE}"
    built = _built(monkeypatch, spec)
    want = b"".join(r.prompt_ids.tobytes() for r in sorted(built.requests, key=lambda r: r.rid))
    with multiprocessing.get_context("fork").Pool(3) as pool:
        got = pool.map(_digest_of_load, [spec] * 6)
    assert all(tokens == want for _, tokens in got)
    assert {source for source, _ in got} <= {"built", "built, cached", "from the cache"}
    assert len(_entries(prompts_dir)) == 1
    assert not [p for p in prompts_dir.iterdir() if p.name.endswith(".tmp")]
    assert load_workload(spec).prompts == "from the cache"


def test_a_cache_root_with_odd_characters_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "a b\nc é %s $(x) ~"
    monkeypatch.setenv("RADIXSCHED_CACHE_DIR", str(root))
    monkeypatch.delenv("RADIXSCHED_PROMPT_CACHE")
    monkeypatch.delenv("RADIXSCHED_CACHE_MAX_GB", raising=False)
    spec = f"mooncake:{SAMPLE}"
    assert [load_workload(spec).prompts for _ in range(2)] == ["built, cached", "from the cache"]
    assert len(_entries(root / "prompts")) == 1

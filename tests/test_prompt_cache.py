"""The on-disk prompt cache (``sim.prompt_cache``): a second load of a trace maps the prompts
the first one stored, bit for bit, and anything else (another file, other params, a damaged
or unwritable cache) builds them as before."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixsched.config import SchedulerConfig
from radixsched.sim.simulate import SimConfig, simulate
from radixsched.sim.workloads import load as workloads
from radixsched.sim.workloads import prompt_cache, traces
from radixsched.sim.workloads.load import Workload, load_workload

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "mooncake_sample.jsonl"
# SHA-256 of the sample trace's prompts (int32, line order, concatenated) at the default
# params. A change here is a change of the token derivation: bump ``prompt_cache.FORMAT``
# with it, or caches written before would be read as the new prompts.
SAMPLE_PROMPTS_SHA256 = "11e3ac04285009bc67f3d65f9b46a1366a8f1978e7311f73cae787c6fb65a172"
PINNED_FORMAT = 1


def _copy(tmp_path: Path, name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(SAMPLE.read_bytes())
    return path


def _load(path: Path, spec: str = "mooncake", **kw: object) -> Workload:
    return load_workload(f"{spec}:{path}", **kw)  # type: ignore[arg-type]


def _prompts(wl: Workload) -> dict[str, bytes]:
    return {r.rid: r.prompt_ids.tobytes() for r in wl.requests}


def test_the_second_load_maps_what_the_first_built(prompts_dir: Path, tmp_path: Path) -> None:
    path = _copy(tmp_path)
    first = _load(path)
    assert first.prompts == "built, cached"
    assert len(list(prompts_dir.glob("*.prompts"))) == 1
    assert all(not r.prompt_ids.flags.writeable for r in first.requests)  # the file's mapping
    second = _load(path)
    assert second.prompts == "from the cache"
    assert _prompts(second) == _prompts(first)
    assert all(not r.prompt_ids.flags.writeable for r in second.requests)
    assert [r.arrival_time for r in second.requests] == [r.arrival_time for r in first.requests]


def test_jsonl_length_prompts_are_cached_and_token_id_prompts_are_not(
    prompts_dir: Path, tmp_path: Path
) -> None:
    lengths = tmp_path / "lengths.jsonl"
    lines = [
        {"input_length": 300 + i, "output_length": 4, "prefix_group": i % 2, "prefix_length": 100}
        for i in range(6)
    ]
    lengths.write_text("".join(json.dumps(x) + "\n" for x in lines))
    built = _load(lengths, "jsonl")
    mapped = _load(lengths, "jsonl")
    assert (built.prompts, mapped.prompts) == ("built, cached", "from the cache")
    assert _prompts(mapped) == _prompts(built)
    ids = tmp_path / "ids.jsonl"
    ids.write_text(json.dumps({"input_ids": [1, 2, 3], "output_length": 2}) + "\n")
    assert _load(ids, "jsonl").prompts == _load(ids, "jsonl").prompts == "built"


@pytest.mark.parametrize(
    ("policy", "page"), [("lpm", 1), ("fcfs", 16), ("dfs-weight", 1), ("hrrn", 4)]
)
def test_a_simulation_on_mapped_prompts_equals_one_on_built_prompts(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, page: int
) -> None:
    path = _copy(tmp_path)
    assert _load(path).prompts == "built, cached"
    mapped = _load(path, num_requests=40)
    monkeypatch.setenv("RADIXSCHED_PROMPT_CACHE", "off")
    built = _load(path, num_requests=40)
    assert (mapped.prompts, built.prompts) == ("from the cache", "built")
    cfg = SchedulerConfig(schedule_policy=policy, page_size=page, chunked_prefill_size=4096)
    sim = SimConfig(max_total_tokens=100_000)
    a, b = (simulate(wl, cfg, sim) for wl in (built, mapped))
    assert a.result.hit_rate == b.result.hit_rate
    assert [(r.rid, r.output_ids, r.times.token_times) for r in a.requests] == [
        (r.rid, r.output_ids, r.times.token_times) for r in b.requests
    ]


def test_a_changed_file_or_other_params_build_again(prompts_dir: Path, tmp_path: Path) -> None:
    path = _copy(tmp_path)
    base = _prompts(_load(path))
    assert _load(path).prompts == "from the cache"
    vocab = load_workload(f"mooncake:path={path},vocab=1000")
    assert vocab.prompts == "built, cached"
    assert _prompts(vocab) != base
    block = load_workload(f"mooncake:path={path},block_size=256")
    assert block.prompts == "built, cached"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["hash_ids"] = [h + 10_000 for h in rec["hash_ids"]]  # same length, other blocks
    path.write_text("\n".join([json.dumps(rec), *lines[1:]]) + "\n")
    changed = _load(path)
    assert changed.prompts == "built, cached"
    first = changed.requests[0].rid
    assert _prompts(changed)[first] != base[first]
    assert len(list(prompts_dir.glob("*.prompts"))) == 4


def test_a_partial_load_uses_the_cache_but_never_writes_one(
    prompts_dir: Path, tmp_path: Path
) -> None:
    path = _copy(tmp_path)
    part = _load(path, num_requests=20)
    assert part.prompts == "built"
    assert not list(prompts_dir.glob("*.prompts"))
    whole = _load(path)
    mapped = _load(path, num_requests=20)
    assert mapped.prompts == "from the cache"
    assert _prompts(mapped) == _prompts(part)
    assert set(_prompts(mapped).items()) <= set(_prompts(whole).items())


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        del data[len(data) // 2 :]
    elif how == "magic":
        data[0:8] = b"NOTMINE!"
    elif how == "count":
        data[12:20] = (7).to_bytes(8, "little")
    elif how == "token":  # the first token is in the digest's sample
        at = 64 + 8 * (200 + 1)
        data[at] ^= 0xFF
    elif how == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "magic", "count", "token", "empty"])
def test_a_damaged_cache_file_is_removed_and_the_prompts_built_again(
    prompts_dir: Path, tmp_path: Path, how: str
) -> None:
    path = _copy(tmp_path)
    want = _prompts(_load(path))
    (stored,) = prompts_dir.glob("*.prompts")
    _damage(stored, how)
    again = _load(path)
    assert again.prompts == "built, cached"
    assert _prompts(again) == want
    assert _load(path).prompts == "from the cache"


def test_an_unusable_cache_folder_changes_nothing_but_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RADIXSCHED_CACHE_DIR", str(blocker))
    monkeypatch.delenv("RADIXSCHED_PROMPT_CACHE")
    path = _copy(tmp_path)
    assert _load(path).prompts == _load(path).prompts == "built"
    monkeypatch.setenv("RADIXSCHED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RADIXSCHED_PROMPT_CACHE", "off")
    assert prompt_cache.cache_dir() is None
    assert _load(path).prompts == _load(path).prompts == "built"
    assert not (tmp_path / "cache").exists()


def test_the_folder_is_kept_under_its_cap_least_recently_used_first(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, c = (_copy(tmp_path, f"{n}.jsonl") for n in "abc")
    for i, p in enumerate((a, b, c)):  # three traces, each its own blocks
        lines = [json.loads(x) for x in p.read_text().splitlines()]
        for rec in lines:
            rec["hash_ids"] = [h + 100_000 * i for h in rec["hash_ids"]]
        p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _load(a)
    (one,) = prompts_dir.glob("*.prompts")
    size_gb = one.stat().st_size / (1 << 30)
    monkeypatch.setenv("RADIXSCHED_CACHE_MAX_GB", str(2.5 * size_gb))
    _load(b)
    assert _load(a).prompts == "from the cache"  # a is now the more recent
    _load(c)
    assert _load(a).prompts == "from the cache"
    dead, live = (
        prompts_dir / ".x.1.tmp",
        prompts_dir / ".y.2.tmp",
    )  # writers that died, or still write
    for tmp in (dead, live):
        tmp.write_bytes(b"partial")
    os.utime(dead, (time.time() - 7200, time.time() - 7200))
    assert _load(b).prompts == "built, cached"  # b was the least recently used
    assert len(list(prompts_dir.glob("*.prompts"))) == 2
    assert not dead.exists() and live.exists()
    monkeypatch.setenv("RADIXSCHED_CACHE_MAX_GB", str(0.5 * size_gb))
    fresh = _copy(tmp_path, "d.jsonl")
    fresh.write_text(fresh.read_text() + "\n")  # other bytes, same requests
    assert _load(fresh).prompts == "built"  # larger than the whole cap: not stored


def test_the_token_derivation_is_pinned_to_the_cache_format() -> None:
    wl = load_workload(f"mooncake:{SAMPLE}")
    digest = hashlib.sha256()
    for r in sorted(wl.requests, key=lambda r: int(r.rid.rsplit("-", 1)[1])):
        digest.update(np.ascontiguousarray(r.prompt_ids, dtype=np.int32).tobytes())
    assert (digest.hexdigest(), prompt_cache.FORMAT) == (SAMPLE_PROMPTS_SHA256, PINNED_FORMAT), (
        "the sample trace's prompts changed: bump prompt_cache.FORMAT, then update both pins"
    )


def test_simulate_says_where_the_prompts_came_from(prompts_dir: Path, tmp_path: Path) -> None:
    path = _copy(tmp_path)
    said, results = [], []
    for i in range(2):
        out = tmp_path / f"{i}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "radixsched", "simulate", "--workload", f"mooncake:{path}",
             "--policy", "lpm", "--num-requests", "200", "--json", str(out), "--quiet"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        head = " ".join(proc.stdout.split("Policy comparison")[0].split())
        said.append(json.loads(out.read_text())["workload"]["prompts"])
        run = json.loads(out.read_text())["results"][0]
        results.append({k: v for k, v in run.items() if k not in ("wall_s", "requests_per_wall_s")})
        assert f"prompts {said[-1]}" in head
    assert said == ["built, cached", "from the cache"]
    assert results[0] == results[1]


def test_a_build_that_fails_leaves_no_file_and_the_next_load_builds(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _copy(tmp_path)
    real_gather, real_native, calls = traces._gather, traces._native_prompt, []

    def failing(fn: Any) -> Any:  # the 50th prompt written, on either path, runs out of memory
        def call(*args: Any) -> Any:
            # (the native builder writes a list of prompts a call, ``_gather`` one)
            before = len(calls)
            calls.extend([1] * (len(args[0]) if isinstance(args[0], list) else 1))
            if before < 50 <= len(calls):
                raise MemoryError("out of memory")
            return fn(*args)

        return call

    def native(block: int, vocab: int) -> Any:
        fn = real_native(block, vocab)
        return None if fn is None else failing(fn)

    monkeypatch.setattr(traces, "_gather", failing(real_gather))
    monkeypatch.setattr(traces, "_native_prompt", native)
    with pytest.raises(MemoryError):
        _load(path)
    assert not list(prompts_dir.iterdir())  # neither an entry nor a temporary file
    monkeypatch.setattr(traces, "_gather", real_gather)
    monkeypatch.setattr(traces, "_native_prompt", real_native)
    assert _load(path).prompts == "built, cached"


def test_without_space_reserved_up_front_nothing_is_cached(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    real = os.posix_fallocate
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    path = _copy(tmp_path)
    built = _load(path)
    assert built.prompts == "built"
    assert not list(prompts_dir.iterdir())
    monkeypatch.delattr(os, "posix_fallocate")  # a platform without it
    assert _load(path).prompts == "built"
    monkeypatch.setattr(os, "posix_fallocate", real, raising=False)
    again = _load(path)
    assert again.prompts == "built, cached"
    assert _prompts(again) == _prompts(built)


def _bound_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.bounds"))


def test_the_optimal_bound_is_kept_beside_the_prompts_and_read_back(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _copy(tmp_path)
    first = _load(path)
    want = {p: workloads.optimal_hit_rate(first.requests, p) for p in (1, 16)}
    assert [workloads.workload_optimal_hit_rate(first, p) for p in (1, 16)] == [want[1], want[16]]
    (bounds,) = _bound_files(prompts_dir)
    assert len(json.loads(bounds.read_text())) == 2  # one entry per page size

    def computed(reqs: object, page_size: int = 1) -> float:
        raise AssertionError("the bound was recomputed")

    monkeypatch.setattr(workloads, "optimal_hit_rate", computed)
    second = _load(path)
    assert second.prompts == "from the cache"
    assert [workloads.workload_optimal_hit_rate(second, p) for p in (1, 16)] == [want[1], want[16]]


def test_a_bound_is_kept_per_selection_of_requests_and_arrivals(
    prompts_dir: Path, tmp_path: Path
) -> None:
    path = _copy(tmp_path)
    _load(path)
    cases: list[dict[str, Any]] = [
        {},
        {"num_requests": 50},
        {"request_rate": 2.0, "seed": 1},
        {"request_rate": 2.0},
    ]
    for kw in cases:
        wl = _load(path, **kw)
        assert wl.prompt_key is not None
        assert workloads.workload_optimal_hit_rate(wl) == workloads.optimal_hit_rate(wl.requests)
    stored = json.loads(_bound_files(prompts_dir)[0].read_text())
    assert len(stored) == len(cases)  # each selection its own entry
    for kw in cases:  # read back, each its own value
        wl = _load(path, **kw)
        assert workloads.workload_optimal_hit_rate(wl) == workloads.optimal_hit_rate(wl.requests)


def test_a_damaged_bounds_file_is_recomputed_and_bounds_go_with_their_prompts(
    prompts_dir: Path, tmp_path: Path
) -> None:
    path = _copy(tmp_path)
    wl = _load(path)
    want = workloads.workload_optimal_hit_rate(wl)
    (bounds,) = _bound_files(prompts_dir)
    for damage in ("{not json", "[1, 2]", ""):
        bounds.write_text(damage)
        assert workloads.workload_optimal_hit_rate(_load(path)) == want
    entry = next(iter(json.loads(bounds.read_text())))
    bounds.write_text(json.dumps({entry: 1.5}))  # out of range: not a hit rate
    assert workloads.workload_optimal_hit_rate(_load(path)) == want
    assert json.loads(bounds.read_text()) == {entry: want}
    (prompts,) = prompts_dir.glob("*.prompts")
    prompts.unlink()
    prompt_cache.store_bound(prompts_dir, prompts.stem, entry, 0.5)  # no prompts: not kept
    assert json.loads(bounds.read_text()) == {entry: want}
    other = _copy(tmp_path, "other.jsonl")
    other.write_text(other.read_text() + "\n")  # other bytes: another key
    _load(other)  # its store trims the folder
    assert _bound_files(prompts_dir) == []


def test_bounds_of_uncached_or_memo_built_workloads_are_computed(
    prompts_dir: Path, tmp_path: Path
) -> None:
    path = _copy(tmp_path)
    memo = workloads.DraftMemo()
    lent = load_workload(f"mooncake:{path}", memo=memo)
    again = load_workload(f"mooncake:{path}", memo=memo, num_requests=20)
    assert again.prompt_key is None  # built from the memo's drafts: not the cache's views
    assert workloads.workload_optimal_hit_rate(again) == workloads.optimal_hit_rate(again.requests)
    gen = load_workload("shared-prefix:groups=2,prompts=3", request_rate=1.0)
    assert gen.prompt_key is None and lent.prompt_key is not None
    assert workloads.workload_optimal_hit_rate(gen) == workloads.optimal_hit_rate(gen.requests)


def test_the_file_just_used_is_kept_whatever_its_timestamp(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _copy(tmp_path, "a.jsonl"), _copy(tmp_path, "b.jsonl")
    b.write_text(b.read_text() + "\n")  # other bytes: another key
    first = _prompts(_load(a))
    (a_file,) = prompts_dir.glob("*.prompts")
    _load(b)
    (b_file,) = set(prompts_dir.glob("*.prompts")) - {a_file}
    os.utime(a_file, ns=(10**18, 10**18))  # a stamped older than b, as a coarse clock may
    os.utime(b_file, ns=(10**18 + 1, 10**18 + 1))
    # a's load below stamps nothing: its timestamp stays the older one
    monkeypatch.setattr(prompt_cache.os, "utime", lambda *args, **kw: None)
    monkeypatch.setenv("RADIXSCHED_CACHE_MAX_GB", str(1.5 * a_file.stat().st_size / (1 << 30)))
    assert _load(a).prompts == "from the cache"  # then the trim: b goes, a stays
    assert list(prompts_dir.glob("*.prompts")) == [a_file]
    again = _load(a)
    assert again.prompts == "from the cache" and _prompts(again) == first


def test_a_lowered_cap_applies_at_the_next_load(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _copy(tmp_path, "a.jsonl"), _copy(tmp_path, "b.jsonl")
    b.write_text(b.read_text() + "\n")  # other bytes: another key
    first = _prompts(_load(a))
    _load(b)
    (size,) = {p.stat().st_size for p in prompts_dir.glob("*.prompts")}
    monkeypatch.setenv("RADIXSCHED_CACHE_MAX_GB", str(1.5 * size / (1 << 30)))
    again = _load(a)  # mapped, then the folder trimmed: b was the least recently used
    assert again.prompts == "from the cache" and _prompts(again) == first
    assert len(list(prompts_dir.glob("*.prompts"))) == 1
    monkeypatch.setenv("RADIXSCHED_CACHE_MAX_GB", "0")
    last = _load(a)  # mapped from a file the trim then unlinks: the views stay valid
    assert last.prompts == "from the cache" and _prompts(last) == first
    assert list(prompts_dir.glob("*.prompts")) == []


def test_a_bound_key_is_pinned_to_its_requests_lines() -> None:
    # Bounds stored by earlier versions are read back only if the key is computed the same way:
    # SHA-256 of a header and one line per request, whichever way the lines are fed to it.
    from radixsched.request import Req, SamplingParams

    reqs = [
        Req(
            rid=f"r-{i}",
            prompt_ids=np.arange(5 + i, dtype=np.int32),
            sampling=SamplingParams(max_new_tokens=3 + i),
            extra_key="ns" if i == 1 else None,
            arrival_time=0.1 * i,
            scripted_output=np.zeros(2, dtype=np.int32) if i == 2 else None,
        )
        for i in range(3)
    ]
    lines = [
        "r-0\x000.0\x005\x003\x00None\x00False\n",
        "r-1\x000.1\x006\x004\x00('ns', None)\x00False\n",
        "r-2\x000.2\x007\x005\x00None\x00True\n",
    ]
    h = hashlib.sha256(b"optimal\x0016\x00")
    for line in lines:
        h.update(line.encode())
    assert workloads._bound_key(reqs, 16) == h.hexdigest()[:32]


def test_prompts_built_stored_or_mapped_are_read_only(
    prompts_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However a trace's prompts come (built into a new cache file, mapped from it, or built
    with the cache off), they end read-only: the radix tree's keys view such prompts instead
    of copying them (``_native/kv.cpp``'s ``prompt_block``)."""
    path = _copy(tmp_path)
    stored = _load(path)
    mapped = _load(path)
    monkeypatch.setenv("RADIXSCHED_PROMPT_CACHE", "off")
    built = _load(path)
    assert (stored.prompts, mapped.prompts, built.prompts) == (
        "built, cached",
        "from the cache",
        "built",
    )
    for wl in (stored, mapped, built):
        assert not any(r.prompt_ids.flags.writeable for r in wl.requests)

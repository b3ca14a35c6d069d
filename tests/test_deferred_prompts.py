"""Deferred prompts (``sim.workloads.deferred``): a trace's prompts built as its requests arrive
and dropped as they finish give the same requests and the same run as prompts built up front;
and the scaled trace of ``bench/million_bench.py`` has the shape its docstring states."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import math
import sys
import threading
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from radixsched.config import SchedulerConfig
from radixsched.request import FinishReason, FinishState
from radixsched.sim.deploy.run import client_requests
from radixsched.sim.settings.simconfig import SimConfig
from radixsched.sim.simulate import simulate
from radixsched.sim.workloads import deferred
from radixsched.sim.workloads.load import load_workload, workload_optimal_hit_rate

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "mooncake_sample.jsonl"
SPEC = f"mooncake:{SAMPLE}"


def test_stand_in_has_the_length_and_no_memory() -> None:
    s = deferred.stand_in(1000)
    assert len(s) == 1000 and s.dtype == np.int32 and not s.flags.writeable
    assert deferred.is_stand_in(s) and s.base is not None and s.base.nbytes == 4


def test_small_traces_and_generators_stay_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSCHED_PROMPT_CACHE", "off")
    assert load_workload(SPEC, defer_prompts=True).drafts is None  # under the 2 GiB default
    monkeypatch.setenv("RADIXSCHED_EAGER_PROMPTS_GB", "0")
    assert load_workload("shared-prefix:groups=2,prompts=2", defer_prompts=True).drafts is None
    assert load_workload(SPEC).drafts is None  # only a caller that asks defers


def test_deferred_requests_get_the_eager_prompts(defer_all: None) -> None:
    eager = load_workload(SPEC, defer_prompts=False)
    lazy = load_workload(SPEC, defer_prompts=True, num_requests=150)
    assert lazy.drafts is not None and lazy.prompts == "built at arrival"
    assert all(deferred.is_stand_in(r.prompt_ids) for r in lazy.requests)
    assert math.isnan(workload_optimal_hit_rate(lazy))
    reqs = client_requests(lazy)
    assert isinstance(reqs, deferred.ArrivingRequests) and reqs.live == 0
    for i, want in enumerate(eager.requests[:150]):
        got = reqs[i]
        assert (got.rid, got.arrival_time, got.max_new_tokens) == (
            want.rid,
            want.arrival_time,
            want.max_new_tokens,
        )
        assert np.array_equal(got.prompt_ids, want.prompt_ids)
    assert reqs.live == 150  # nothing finished: every prompt is held


def test_a_finished_request_drops_its_prompt_and_output(defer_all: None) -> None:
    reqs = client_requests(load_workload(SPEC, defer_prompts=True))
    first = reqs[0]
    held = weakref.ref(first.prompt_ids)
    n = first.prompt_len
    first.output_ids = [7, 8, 9]
    first.times.token_times = [1.0, 2.0, 3.5]
    first.finish = FinishState(FinishReason.LENGTH)
    _ = reqs[15]  # same batch: nothing is built, nothing released
    assert held() is not None
    _ = reqs[16]  # the next batch's build releases the finished prompt first
    assert held() is None
    assert deferred.is_stand_in(first.prompt_ids) and first.prompt_len == n
    assert first.output_len == 3 and list(first.times.token_times) == [1.0, 2.0, 3.5]
    assert reqs.live == 31


def test_through_builds_the_last_ones_batch_and_slices(defer_all: None) -> None:
    reqs = client_requests(load_workload(SPEC, defer_prompts=True))
    assert isinstance(reqs, deferred.ArrivingRequests)
    first = reqs.through(0, 1)[0]
    assert first is reqs[0] and not deferred.is_stand_in(first.prompt_ids)
    held = weakref.ref(first.prompt_ids)
    first.finish = FinishState(FinishReason.LENGTH)
    got = reqs.through(1, 16)  # the same batch (16 requests): nothing built or released
    assert got == [reqs._reqs[i] for i in range(1, 16)] and held() is not None
    assert [r.rid for r in reqs.through(15, 17)] == [reqs._reqs[i].rid for i in (15, 16)]
    assert held() is None and not deferred.is_stand_in(reqs._reqs[16].prompt_ids)


def test_compact_stands_in_for_any_length(defer_all: None) -> None:
    reqs = client_requests(load_workload(SPEC, defer_prompts=True))
    a, b = reqs[0], reqs[1]
    long = (1 << 24) + 3  # past the shared stand-in's length: broadcast anew
    a.prompt_ids, a.output_ids = deferred.stand_in(long), [4, 5]
    b.output_ids = deferred.stand_in(long)  # type: ignore[assignment]
    a.times.token_times, b.times.token_times = [1.0, 2.5], []
    n = len(b.prompt_ids)
    deferred.compact([a, b])
    assert (len(a.prompt_ids), len(a.output_ids), len(b.prompt_ids), len(b.output_ids)) == (
        long,
        2,
        n,
        long,
    )
    assert all(deferred.is_stand_in(x) for x in (a.prompt_ids, b.prompt_ids, b.output_ids))
    assert list(a.times.token_times) == [1.0, 2.5] and len(b.times.token_times) == 0


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_a_deferred_run_is_the_eager_run(defer_all: None, policy: str) -> None:
    cfg = SchedulerConfig(schedule_policy=policy)
    sim = SimConfig(max_total_tokens=60_000)  # a small cache: eviction, a queue, retractions
    eager = simulate(load_workload(SPEC), cfg, sim, optimal_hit_rate=0.5)
    lazy = simulate(load_workload(SPEC, defer_prompts=True), cfg, sim, optimal_hit_rate=0.5)
    a = dataclasses.replace(eager.result, wall_s=0.0)
    b = dataclasses.replace(lazy.result, wall_s=0.0)
    assert a == b
    assert [(r.rid, r.output_len, r.times.token_times) for r in eager.requests] == [
        (r.rid, r.output_len, list(r.times.token_times)) for r in lazy.requests
    ]
    assert isinstance(lazy.requests, deferred.ArrivingRequests)
    lazy.requests.release_finished()
    assert lazy.requests.live == 0  # every request finished: no prompt is held


@pytest.mark.parametrize(
    "sim",
    [
        SimConfig(max_total_tokens=60_000, max_concurrency=8),
        SimConfig(max_total_tokens=60_000, dp=2),
        SimConfig(max_total_tokens=60_000, dp=2, enable_dp_attention=True),
        SimConfig(max_total_tokens=120_000, disaggregation=True),
    ],
    ids=["closed-loop", "dp2", "dp-attention", "disaggregation"],
)
def test_every_deployment_runs_deferred_as_eager(defer_all: None, sim: SimConfig) -> None:
    cfg = SchedulerConfig(schedule_policy="lpm")
    eager = simulate(load_workload(SPEC, num_requests=120), cfg, sim, optimal_hit_rate=0.5)
    lazy_wl = load_workload(SPEC, num_requests=120, defer_prompts=True)
    lazy = simulate(lazy_wl, cfg, sim, optimal_hit_rate=0.5)
    assert dataclasses.replace(eager.result, wall_s=0.0) == dataclasses.replace(
        lazy.result, wall_s=0.0
    )


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "million_bench", ROOT / "bench" / "million_bench.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_scaled_trace_shape(tmp_path: Path) -> None:
    src = [json.loads(x) for x in SAMPLE.read_text().splitlines() if x.strip()]
    n = len(src)
    out = tmp_path / "scaled.jsonl"
    shape = _bench().write_scaled(SAMPLE, out, 2 * n + 7)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    stamps = [r["timestamp"] for r in src]
    span = max(stamps) - min(stamps)
    stride = 1 + max(max(r["hash_ids"]) for r in src)
    assert shape == {"copies": 3, "period_ms": span + round(span / (n - 1)), "id_stride": stride}
    assert len(recs) == 2 * n + 7
    for j, r in enumerate(recs):
        k, base = divmod(j, n)
        s = src[base]
        assert r["timestamp"] == s["timestamp"] + k * shape["period_ms"]
        assert r["hash_ids"] == [h + k * stride for h in s["hash_ids"]]
        assert (r["input_length"], r["output_length"]) == (s["input_length"], s["output_length"])
    ids = [set(h for r in recs[k * n : (k + 1) * n] for h in r["hash_ids"]) for k in range(3)]
    assert not ids[0] & ids[1] and not ids[1] & ids[2]  # copies share no block


def test_the_command_says_the_bound_was_not_computed(
    defer_all: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from radixsched.cli.main import main

    out = tmp_path / "r.json"
    assert main(["simulate", "--quiet", "--workload", SPEC, "--policy", "fcfs", "--num-requests",
                 "40", "--json", str(out)]) == 0  # fmt: skip
    text = " ".join(capsys.readouterr().out.split())
    assert "optimal hit rate not computed" in text and "(optimal not computed)" in text
    doc = json.loads(out.read_text())
    assert doc["workload"]["prompts"] == "built at arrival"
    assert doc["workload"]["optimal_hit_rate"] is None
    res = doc["results"][0]
    assert res["optimal_hit_rate"] is None and res["hit_rate_gap"] is None
    assert res["num_requests"] == 40


def _builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Each ``build_prompts`` call: (its drafts, whether in the main thread)."""
    calls: list[tuple[int, bool]] = []
    build = deferred.build_prompts

    def counted(drafts: Any) -> Any:
        calls.append((len(drafts), threading.current_thread() is threading.main_thread()))
        return build(drafts)

    monkeypatch.setattr(deferred, "build_prompts", counted)
    return calls


def test_the_next_batch_is_built_beside_the_run(
    defer_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deferred, "usable_cpus", lambda: 2)
    calls = _builds(monkeypatch)
    eager = load_workload(SPEC, defer_prompts=False)
    reqs = client_requests(load_workload(SPEC, defer_prompts=True, num_requests=40))
    assert isinstance(reqs, deferred.ArrivingRequests)
    for i in range(40):
        assert np.array_equal(reqs[i].prompt_ids, eager.requests[i].prompt_ids)
        assert not reqs[i].prompt_ids.flags.writeable
    # the first batch now, the others ahead, each taken when the loop reached it
    assert calls == [(16, True), (16, False), (8, False)]
    assert reqs._ahead is None and reqs.live == 40


def test_one_cpu_builds_each_batch_when_reached(
    defer_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deferred, "usable_cpus", lambda: 1)
    calls = _builds(monkeypatch)
    reqs = client_requests(load_workload(SPEC, defer_prompts=True, num_requests=40))
    _ = reqs[39]
    assert calls == [(16, True), (16, True), (8, True)]


def test_a_batch_built_ahead_raises_when_reached(
    defer_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deferred, "usable_cpus", lambda: 2)
    wl = load_workload(SPEC, defer_prompts=True, num_requests=40)
    own = wl.drafts
    assert own is not None
    good = own[16].fill

    def broken(drafts: Any) -> None:
        if any(d.source is own[20].source for d in drafts):
            raise RuntimeError("no prompt for you")
        assert good is not None
        good(drafts)

    for d in own[16:32]:
        d.fill = broken
    before = [d.prompt for d in own]
    reqs = client_requests(wl)
    _ = reqs[15]  # the first batch, now; the second fails beside the run
    with pytest.raises(RuntimeError, match="no prompt for you"):
        _ = reqs[16]
    assert all(d.prompt is p for d, p in zip(own, before, strict=True))  # built on copies


def test_a_thread_that_builds_alone_uses_no_other() -> None:
    from radixsched.sim.workloads import tokens

    seen: list[int] = []

    def run() -> None:
        tokens.build_alone()
        seen.append(tokens.build_threads(1 << 40))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [1]
    assert tokens.build_threads(1 << 40) == min(tokens.usable_cpus(), tokens.MAX_THREADS)


def test_compacted_requests_share_a_stand_in_a_length(defer_all: None) -> None:
    reqs = client_requests(load_workload(SPEC, defer_prompts=True))
    a, b, c = reqs[0], reqs[1], reqs[2]
    a.prompt_ids, b.prompt_ids = np.ones(5, dtype=np.int32), np.ones(5, dtype=np.int32)
    c.prompt_ids = np.ones(7, dtype=np.int32)
    a.output_ids, b.output_ids, c.output_ids = [1, 2], [3, 4], [5, 6, 7, 8, 9]
    for r in (a, b, c):
        r.times.token_times = [1.0] * len(r.output_ids)
    deferred.compact([a, b])
    deferred.compact([c])
    assert a.prompt_ids is b.prompt_ids is deferred.shared_stand_in(5)
    assert a.output_ids is b.output_ids is deferred.shared_stand_in(2)
    assert c.output_ids is a.prompt_ids and len(c.prompt_ids) == 7  # any list, any prompt
    assert deferred.is_stand_in(c.prompt_ids) and not c.prompt_ids.flags.writeable


def _times_bits(arrays: list[Any]) -> list[tuple[str, bytes]]:
    return [(a.typecode, a.tobytes()) for a in arrays]


def test_packed_times_are_each_lists_floats(monkeypatch: pytest.MonkeyPatch) -> None:
    from array import array

    seqs = [[0.5, -0.0, 1e300], [], [float("inf"), float("nan"), 2.25], [3.0]]
    want = [array("d", s) for s in seqs]
    assert _times_bits(deferred.packed_times(seqs)) == _times_bits(want)  # natively
    assert deferred.packed_times([]) == []
    mixed = [[0.5, 1.5], [2, 3.5]]  # an int: the native copy declines, each converts
    assert _times_bits(deferred.packed_times(mixed)) == _times_bits([array("d", s) for s in mixed])
    assert _times_bits(deferred.packed_times(tuple(seqs))) == _times_bits(want)  # any sequence
    rows = [tuple(s) for s in seqs]  # not lists: the native packing declines, each converts
    assert _times_bits(deferred.packed_times(rows)) == _times_bits(want)
    mod = deferred.core()
    if mod is not None:  # a core built before ``pack_times``: joined natively, then cut
        older = ModuleType("older_core")
        older.join_floats = mod.join_floats  # type: ignore[attr-defined]
        monkeypatch.setattr(deferred, "core", lambda: older)
        assert _times_bits(deferred.packed_times(seqs)) == _times_bits(want)
        assert _times_bits(deferred.packed_times(mixed)) == _times_bits(
            [array("d", s) for s in mixed]
        )
    monkeypatch.setattr(deferred, "core", lambda: None)
    assert _times_bits(deferred.packed_times(seqs)) == _times_bits(want)


def test_native_pack_times_makes_fresh_arrays_of_the_floats() -> None:
    from array import array

    mod = deferred.core()
    if mod is None:
        pytest.skip("no native core")
    seqs = [[1.5, 2.5], [], [0.25]]
    a, b, c = mod.pack_times(seqs, deferred._ONE_FLOAT)
    assert [list(x) for x in (a, b, c)] == seqs and all(type(x) is array for x in (a, b, c))
    a[0] = 9.0  # each its own buffer: the prototype and the others unchanged
    assert list(deferred._ONE_FLOAT) == [0.0] and list(c) == [0.25]
    assert mod.pack_times([[1.0], [2.0, 3]], deferred._ONE_FLOAT) is None  # an int
    assert mod.pack_times([[1.0], (2.0,)], deferred._ONE_FLOAT) is None  # a tuple
    with pytest.raises(ValueError, match="one float64"):
        mod.pack_times(seqs, array("d", [0.0, 0.0]))
    with pytest.raises(ValueError, match="a list"):
        mod.pack_times(tuple(seqs), deferred._ONE_FLOAT)


def test_a_build_copy_carries_what_a_build_reads(defer_all: None) -> None:
    own = load_workload(SPEC, defer_prompts=True, num_requests=20).drafts
    assert own is not None
    for d in own:
        c = deferred.build_copy(d)
        assert c is not d and c.prompt is d.prompt and c.fill is d.fill and c.source is d.source
        assert (c.session, c.length, c.output_len) == (d.session, d.length, d.output_len)
    built = deferred.build_prompts([deferred.build_copy(d) for d in own])
    assert all(
        np.array_equal(a, b) for a, b in zip(built, deferred.build_prompts(own), strict=True)
    )


def test_build_copies_are_build_copys_field_for_field(
    defer_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixsched.sim.workloads.tokens import _Draft

    own = load_workload(SPEC, defer_prompts=True, num_requests=20).drafts
    assert own is not None
    own[3] = dataclasses.replace(own[3], offset_s=2.5, priority=1, tenant="t")  # not copied

    def slots(d: _Draft) -> list[int]:
        return [id(getattr(d, name)) for name in _Draft.__slots__]

    want = [slots(deferred.build_copy(d)) for d in own]
    copies = deferred.build_copies(tuple(own))
    assert [slots(c) for c in copies] == want and not {id(c) for c in copies} & {id(d) for d in own}
    # the defaults the copies share are immutable: none made per draft
    assert all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(_Draft))
    mod = deferred.core()
    if mod is not None and hasattr(mod, "copy_slots"):
        assert mod.copy_slots(deferred._DRAFT_LIKE, [*own, 1], deferred._COPIED) is None
        assert mod.copy_slots(deferred._DRAFT_LIKE, own, ("nope",)) is None
        assert mod.copy_slots(SAMPLE, own, ()) is None  # not a slots object
        assert mod.copy_slots(deferred._DRAFT_LIKE, [], deferred._COPIED) == []
        unset = _Draft.__new__(_Draft)
        assert mod.copy_slots(deferred._DRAFT_LIKE, [unset], ("prompt",)) is None
        assert mod.copy_slots(unset, own, ("prompt",)) is None
    monkeypatch.setattr(deferred, "core", lambda: None)
    assert [slots(c) for c in deferred.build_copies(own)] == want


def test_one_builder_thread_builds_ahead_and_ends_after_the_last_batch(
    defer_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An earlier test's builder (its requests freed: closed, its queued batch still to build)
    # would call the counted build below: each such thread ends first.
    gc.collect()
    for t in threading.enumerate():
        if t.name.endswith("(_serve)"):
            t.join(timeout=10)
    monkeypatch.setattr(deferred, "usable_cpus", lambda: 2)
    threads: set[int] = set()
    build = deferred.build_prompts

    def counted(drafts: Any) -> Any:
        threads.add(threading.get_ident())
        return build(drafts)

    monkeypatch.setattr(deferred, "build_prompts", counted)
    reqs = client_requests(load_workload(SPEC, defer_prompts=True, num_requests=56))
    assert isinstance(reqs, deferred.ArrivingRequests)
    _ = reqs[0]
    builder = reqs._builder
    assert builder is not None
    for i in range(56):  # as the loop reaches them
        _ = reqs[i]
    builder.thread.join(timeout=10)
    assert not builder.thread.is_alive() and reqs._builder is None  # every batch built
    assert len(threads - {threading.main_thread().ident}) == 1  # three batches, one thread


def _building_ahead(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """56 deferred requests, the first reached (the second batch building ahead, two more to
    come), and their builder."""
    monkeypatch.setattr(deferred, "usable_cpus", lambda: 2)
    reqs = client_requests(load_workload(SPEC, defer_prompts=True, num_requests=56))
    assert isinstance(reqs, deferred.ArrivingRequests)
    _ = reqs[0]
    builder = reqs._builder
    assert builder is not None
    return reqs, builder


def test_a_builder_ends_when_a_jump_builds_the_rest(
    defer_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    reqs, builder = _building_ahead(monkeypatch)
    _ = reqs[55]  # the rest built here, the last batch never handed to the thread
    builder.thread.join(timeout=10)
    assert not builder.thread.is_alive()


def test_a_builder_ends_when_its_requests_are_freed(
    defer_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    reqs, builder = _building_ahead(monkeypatch)
    del reqs
    import gc

    gc.collect()
    builder.thread.join(timeout=10)
    assert not builder.thread.is_alive()


def _slots_of(r: Any) -> list[tuple[str, Any]]:
    """Every slot of a request and of its times, as the summary and the scheduler read them: a
    prompt by its length, strides and flags (a stand-in), any other array by identity."""
    from radixsched.request import Req, ReqTimes

    out: list[tuple[str, Any]] = []
    for name in Req.__slots__:
        v = getattr(r, name)
        if name == "times":
            out += [(f"times.{t}", getattr(v, t)) for t in ReqTimes.__slots__]
        elif name == "prompt_ids":
            out.append((name, (len(v), v.strides, v.dtype, v.flags.writeable)))
        elif isinstance(v, np.ndarray):
            out.append((name, id(v)))
        else:
            out.append((name, (type(v), v)))
    return out


def _load_parts(spec: str) -> tuple[list[Any], list[int], list[float]]:
    from radixsched.sim.workloads import load as load_module
    from radixsched.sim.workloads.spec import parse_workload_spec

    kind, params = parse_workload_spec(spec)
    drafts = kind.build(params, 0)
    arrival, _ = load_module._arrival_times(drafts, None, None, 0)
    return drafts, np.argsort(arrival, kind="stable").tolist(), arrival.tolist()


def test_cloned_requests_are_the_constructed_ones(defer_all: None) -> None:
    from radixsched.sim.workloads import load as load_module

    if getattr(deferred.core(), "clone_like", None) is None:
        pytest.skip("no native core with clone_like")
    drafts, kept, times = _load_parts(SPEC)
    kept = kept[3:] + kept[:3]  # any order of the kept drafts
    made = load_module._constructed("mooncake", drafts, kept, times, True)
    cloned = load_module._cloned("mooncake", drafts, kept, times)
    assert cloned is not None and len(cloned) == len(made) == len(drafts)
    for a, b in zip(made, cloned, strict=True):
        assert _slots_of(a) == _slots_of(b)
        assert b.times.arrival is b.arrival_time is b.queue_entry_time
    fresh = [id(x) for r in cloned for x in (r.output_ids, r.times, r.times.token_times)]
    assert len(set(fresh)) == 3 * len(cloned)  # each request's own lists and times
    cloned[0].output_ids.append(1)
    assert cloned[1].output_ids == [] and load_module._cloned("m", drafts, [], times) is None
    took: list[object] = []
    real = load_module._cloned
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load_module, "_cloned", lambda *a: took.append(real(*a)) or took[-1])
        lazy = load_workload(SPEC, defer_prompts=True)  # a load takes them
    assert len(took) == 1 and took[0] is lazy.requests
    made = made[-3:] + made[:-3]  # (arrival order)
    assert [_slots_of(r) for r in lazy.requests] == [_slots_of(r) for r in made]


def test_requests_are_constructed_where_cloning_would_differ(
    defer_all: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixsched.sim.workloads import load as load_module

    if getattr(deferred.core(), "clone_like", None) is None:
        pytest.skip("no native core with clone_like")
    drafts, kept, times = _load_parts(SPEC)
    assert load_module._cloned("mooncake", drafts, kept, times) is not None
    drafts[kept[5]] = dataclasses.replace(drafts[kept[5]], tenant="t")  # another field set
    assert load_module._cloned("mooncake", drafts, kept, times) is None
    scripted = np.arange(3, dtype=np.int32)  # an array: never compared, nor hashed
    drafts[kept[5]] = dataclasses.replace(drafts[kept[5]], tenant=None, scripted=scripted)
    assert load_module._cloned("mooncake", drafts, kept, times) is None
    drafts[kept[5]] = dataclasses.replace(drafts[kept[5]], scripted=None, length=0)  # empty
    assert load_module._cloned("mooncake", drafts, kept, times) is None
    drafts[kept[5]] = dataclasses.replace(drafts[kept[5]], length=7)
    assert load_module._cloned("mooncake", drafts, kept, times) is not None
    # A constructor that filled another slot per request (here: the rid's), or the times'
    monkeypatch.setattr(load_module, "_PER_REQUEST", load_module._PER_REQUEST - {"rid"})
    assert load_module._clone_template("m") is None
    assert load_module._cloned("mooncake", drafts, kept, times) is None
    monkeypatch.undo()
    monkeypatch.setattr(load_module, "_PER_TIMES", {"arrival"})
    assert load_module._clone_template("m") is None
    monkeypatch.undo()
    monkeypatch.setattr(load_module, "core", lambda: None)
    assert load_module._cloned("mooncake", drafts, kept, times) is None


def test_native_clone_like_copies_slots_and_declines_others() -> None:
    from radixsched.request import ReqTimes

    mod = deferred.core()
    if getattr(mod, "clone_like", None) is None:
        pytest.skip("no native core with clone_like")
    like = ReqTimes(arrival=1.0, first_token=2.0)
    a, b = mod.clone_like(like, {"arrival": [3.0, 4.0]}, ("token_times",))
    assert (a.arrival, b.arrival, a.first_token, b.first_token) == (3.0, 4.0, 2.0, 2.0)
    assert a.token_times == [] and a.token_times is not b.token_times
    assert a.token_times is not like.token_times and type(a) is ReqTimes
    assert mod.clone_like(like, {"arrival": [1.0], "finish": [2.0]}, ())[0].finish == 2.0
    assert mod.clone_like(like, {"nope": [1.0]}, ()) is None  # not a slot
    assert mod.clone_like(like, {"arrival": (1.0,)}, ()) is None  # not a list
    assert mod.clone_like(like, {"arrival": [1.0]}, ("nope",)) is None
    assert mod.clone_like(SAMPLE, {"name": ["x"]}, ()) is None  # not a slots class
    unset = ReqTimes.__new__(ReqTimes)
    assert mod.clone_like(unset, {"arrival": [1.0]}, ()) is None  # a slot unset
    with pytest.raises(ValueError, match="one length"):
        mod.clone_like(like, {"arrival": [1.0], "finish": [2.0, 3.0]}, ())
    with pytest.raises(ValueError, match="a column"):
        mod.clone_like(like, {}, ("token_times",))


def test_cloned_drafts_are_the_constructed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixsched.sim.workloads import traces
    from radixsched.sim.workloads.tokens import _Draft

    if getattr(deferred.core(), "clone_like", None) is None:
        pytest.skip("no native core with clone_like")
    params = {"path": str(SAMPLE), "block_size": 16, "vocab": 1000}
    taken: list[object] = []
    real = traces._cloned_drafts
    monkeypatch.setattr(traces, "_cloned_drafts", lambda *a: taken.append(real(*a)) or taken[-1])
    cloned = traces._build_mooncake(params, 0)
    assert len(taken) == 1 and taken[0] is cloned
    monkeypatch.setattr(traces, "_cloned_drafts", lambda *a: None)
    made = traces._build_mooncake(params, 0)
    assert len(cloned) == len(made) > 1

    def fields(d: _Draft) -> list[object]:  # a prompt and a source by value, the rest typed
        out: list[object] = []
        for name in _Draft.__slots__:
            v = getattr(d, name)
            out.append(v.tolist() if isinstance(v, np.ndarray) else (type(v), v))
        return out

    for a, b in zip(cloned, made, strict=True):
        assert fields(a)[:-3] == fields(b)[:-3] and fields(a)[-2:] == fields(b)[-2:]
        assert a.fill is not None and b.fill is not None
    assert len({id(d) for d in cloned}) == len(cloned)
    monkeypatch.setattr(traces, "_cloned_drafts", real)
    monkeypatch.setattr(traces, "core", lambda: None)
    assert traces._cloned_drafts(([0.0], [1], [2], [None]), 0.0, lambda ds: None) is None


def test_keys_after_a_first_part_are_keys_one_by_one() -> None:
    import warnings

    from radixsched.sim.workloads.tokens import _SALT_PAD, _key, _keys_after

    parts = [0, 1, 7, 255, 1 << 40, (1 << 63) + 5, (1 << 64) - 1, *range(1000, 1300)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no overflow warning: the wrap is the point)
        assert _keys_after(_SALT_PAD, parts) == [_key(_SALT_PAD, p) for p in parts]
        assert _keys_after(3, parts[:4]) == [_key(3, p) for p in parts[:4]]
    odd = [5, -1, 1 << 64, 9]  # outside uint64: one by one, as _key masks them
    assert _keys_after(_SALT_PAD, odd) == [_key(_SALT_PAD, p) for p in odd]
    assert _keys_after(_SALT_PAD, []) == []
    assert all(type(k) is int for k in _keys_after(_SALT_PAD, parts))

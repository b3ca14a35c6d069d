"""A deterministic fake model runner for scheduler tests.

It keeps a fake KV pool (the token id stored at each slot) and checks, on every step, that the
slots the scheduler hands it really hold the request's context: a cached prefix that points at
the wrong slots fails loudly. The next token is a function of the context read from the pool,
so scheduling can never change results unless the KV bookkeeping is wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixsched.cache.base import CacheKey
from radixsched.request import Req
from radixsched.runner import Batch, ModelRunner, StepResult

UNWRITTEN = -1


class FakeRunner(ModelRunner):
    def __init__(
        self,
        kv_pool_size: int,
        *,
        vocab: int = 1000,
        eos: int | None = None,
        prefill_s_per_token: float = 1e-4,
        decode_s: float = 0.01,
    ) -> None:
        self.kv_pool_size = kv_pool_size
        self.max_context_len = 1 << 20
        self.vocab = vocab
        self.eos = eos
        self.pool = np.full(kv_pool_size, UNWRITTEN, dtype=np.int64)
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_s = decode_s
        self.steps = 0
        self.host: dict[str, np.ndarray] = {}  # offloaded KV (decode-role retraction)

    def eos_token_ids(self) -> tuple[int, ...]:
        return () if self.eos is None else (self.eos,)

    def offload_kv(self, req: Req, slots: np.ndarray) -> None:
        self.host[req.rid] = self.pool[slots].copy()
        self.pool[slots] = UNWRITTEN  # the freed slots no longer hold it

    def reload_kv(self, req: Req, slots: np.ndarray) -> None:
        kept = self.host.pop(req.rid)
        assert len(kept) == len(slots), (req.rid, len(kept), len(slots))
        self.pool[slots] = kept

    def next_token(self, context: np.ndarray) -> int:
        tail = context[-6:].astype(np.int64)
        h = int(np.dot(tail, np.arange(7, 7 + len(tail)))) * 31 + 17 * len(context)
        return h % self.vocab

    def forward(self, batch: Batch) -> StepResult:
        self.steps += 1
        out: dict[str, int] = {}
        for e in batch.extend:
            r = e.req
            fill = r.fill_ids()
            assert len(e.prefix_slots) == e.prefix_len
            assert len(e.new_slots) == len(e.new_token_ids)
            assert not np.isin(0, e.new_slots), "slot 0 is the padding slot"
            got = self.pool[e.prefix_slots]
            want = fill[: e.prefix_len]
            assert np.array_equal(got, want), f"{r.rid}: cached prefix KV does not match its tokens"
            assert np.array_equal(
                e.new_token_ids, fill[e.prefix_len : e.prefix_len + len(e.new_token_ids)]
            )
            self.pool[e.new_slots] = e.new_token_ids
            if e.produces_token:
                ctx = self.pool[np.concatenate([e.prefix_slots, e.new_slots])]
                out[r.rid] = self.next_token(ctx)
        for d in batch.decode:
            r = d.req
            assert d.position == r.fill_len - 1
            assert len(d.slots) == d.position + 1
            self.pool[d.slots[-1]] = d.token_id
            ctx = self.pool[d.slots]
            want = r.fill_ids()
            assert np.array_equal(ctx, want), f"{r.rid}: decode context KV does not match"
            out[r.rid] = self.next_token(ctx)
        dur = self.prefill_s_per_token * sum(e.num_new for e in batch.extend) + (
            self.decode_s if batch.decode else 0.0
        )
        return StepResult(out, dur + 0.001)


def reference_output(prompt: list[int] | np.ndarray, n: int, runner: FakeRunner) -> list[int]:
    """What any correct schedule must produce for ``prompt`` (greedy, no stop tokens)."""
    ctx = list(np.asarray(prompt, dtype=np.int64))
    out = []
    for _ in range(n):
        t = runner.next_token(np.asarray(ctx, dtype=np.int64))
        out.append(t)
        ctx.append(t)
    return out


class Room:
    """Free + evictable memory as the prefill adder reads it (allocator and cache at once; all
    of it free unless ``evictable`` is given): the native and Python adders' tests give both
    the same room."""

    def __init__(self, room: int, evictable: int = 0) -> None:
        self.room, self.evictable = room, evictable
        self.disabled = False

    def available_size(self) -> int:
        return self.room

    def evictable_size(self) -> int:
        return self.evictable


def tree_snapshot(cache: Any) -> list[Any]:
    """A radix cache's clock and every node (id, parent id, key, last access), in its order:
    two caches that did the same walks, touches and splits give the same snapshot."""
    nodes = [
        (n.id, None if n.parent is None else n.parent.id, n.key.tolist(), n.last_access_time)
        for n in cache._iter_nodes()
    ]
    return [cache._clock, len(nodes), nodes]


def continued_chunk(
    page: int,
    max_prefill: int,
    chunk: int,
    running: tuple[int, int],
    ratio: float,
    room: tuple[int, int],
    prefix: int,
    fill: int,
    left: int = 5,
    ignore_eos: bool = False,
    limit: int | None = None,
) -> tuple[Any, Any]:
    """The chunked request's continuation on a fresh Python adder (``NativeScheduler``'s
    ``ChunkPlan``; ``limit`` its ``chunked_req_limit``): (the plan, the stand-in request), for
    the native plans' tests."""
    from types import SimpleNamespace

    from radixsched.adder import PrefillAdder
    from radixsched.config import SchedulerConfig
    from radixsched.native.scheduler import ChunkPlan

    cfg = SchedulerConfig(
        page_size=page, chunked_prefill_size=chunk, max_prefill_tokens=max_prefill
    )
    space = Room(*room)
    adder = PrefillAdder(
        config=cfg,
        cache=space,  # type: ignore[arg-type]
        allocator=space,
        running=[],
        new_token_ratio=ratio,
        running_tokens=running,
    )
    req: Any = SimpleNamespace(
        prefix_len=prefix,
        extend_end=prefix,
        fill_len=fill,
        remaining_new_tokens=left,
        sampling=SimpleNamespace(ignore_eos=ignore_eos),
    )
    adder.chunked_req_limit = limit
    return ChunkPlan(adder, adder.add_chunked_req(req), req), req


def put_fresh(cache: Any, pool: Any, seq: Any, priority: int = 0) -> None:
    """Insert ``seq`` into ``cache`` with fresh slots from ``pool``, the duplicates (what the
    cache held already) freed, as the scheduler's checkpoint does."""
    slots = pool.alloc(len(seq))
    assert slots is not None
    res = cache.insert(CacheKey(np.asarray(seq, dtype=np.int32)), slots, priority)
    if res.prefix_len:
        pool.free(slots[: res.prefix_len])

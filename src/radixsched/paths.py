"""Where radixsched keeps files between runs, and how two paths are compared. Imports nothing
of the package: every layer may use it."""

from __future__ import annotations

import os
from pathlib import Path


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (the same inode where both exist)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def cache_root() -> Path:
    """Where commands keep files between runs (a converted model, a trace's prompts):
    ``$RADIXSCHED_CACHE_DIR``, else ``$XDG_CACHE_HOME/radixsched``, else
    ``~/.cache/radixsched``. Everything in it can be deleted at any time; it is built again
    when next needed."""
    if env := os.environ.get("RADIXSCHED_CACHE_DIR"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "radixsched"

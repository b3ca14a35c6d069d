"""On-disk cache of a trace's prompts: the second load of a trace maps them instead of
building them.

A trace's prompts depend only on the file's bytes, the reader's params and the reader's token
derivation (``FORMAT``), so they are keyed by exactly those: a changed file, another
``vocab`` or ``block_size``, or a new derivation is another key. The first full load of a
trace writes every prompt (in line order) to one file; later loads map that file read-only
and hand each request a view of it: no token is generated or copied, pages come in from the
page cache as the simulation first reads them, and forked workers share them.

Where: ``prompts/`` under the cache root (``radixsched.dirs``: ``$RADIXSCHED_CACHE_DIR``, else
``$XDG_CACHE_HOME/radixsched``, else ``~/.cache/radixsched``); ``RADIXSCHED_PROMPT_CACHE=off``
disables it.
The folder is kept under ``$RADIXSCHED_CACHE_MAX_GB`` (default 8) by removing the least
recently used files, and nothing is written when the disk would keep less than 1 GiB free.
The cache is only ever a shortcut: a file that cannot be written is skipped, and one that is
unreadable, truncated or inconsistent is removed and the prompts are built again. A first full
load builds the prompts straight into the new file's mapping (``PromptFile``), so storing them
copies nothing (Linux: the file's blocks are reserved with ``posix_fallocate`` first).

File layout (native byte order): a 64-byte header (magic, ``FORMAT``, request count, token
count, then the SHA-256 of a sample of the tokens), the offsets (int64, count + 1), the tokens
(int32). Built as a temporary file in the folder and renamed: a reader sees a whole file or
none.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import mmap
import os
import shutil
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from radixsched.dirs import cache_root

# Bump when the token derivation of any trace reader changes (tests/test_prompt_cache.py pins
# the sample trace's prompts, and fails until this and its pin are updated together).
FORMAT = 1
_MAGIC = b"RSPROMPT"
_HEADER = struct.Struct("<8sIQQ32s")  # magic, format, requests, tokens, sample digest
_HEADER_BYTES = 64
_SAMPLE_STRIDE = 65_537  # tokens between sampled ones (a prime: no alignment with blocks)
_MIN_FREE_BYTES = 1 << 30
DEFAULT_MAX_GB = 8.0
_OFF = ("off", "0", "false", "no")
TokenArray = npt.NDArray[np.int32]


def cache_dir() -> Path | None:
    """The prompt cache's folder (None: disabled)."""
    if os.environ.get("RADIXSCHED_PROMPT_CACHE", "").strip().lower() in _OFF:
        return None
    return cache_root() / "prompts"


def max_bytes() -> int:
    text = os.environ.get("RADIXSCHED_CACHE_MAX_GB", "")
    try:
        gb = float(text) if text.strip() else DEFAULT_MAX_GB
    except ValueError:
        gb = DEFAULT_MAX_GB
    if not 0 <= gb < 1e9:  # NaN, negative or absurd: the default
        gb = DEFAULT_MAX_GB
    return int(gb * (1 << 30))


def trace_key(kind: str, path: Path, params: Mapping[str, Any]) -> str:
    """The key of a trace's prompts: reader, derivation, params (but the path) and the file's
    bytes (as stored: a compressed trace is hashed compressed)."""
    h = hashlib.sha256()
    h.update(f"{kind}\0{FORMAT}\0".encode())
    for name, value in sorted(params.items()):
        if name != "path":
            h.update(f"{name}={value!r}\0".encode())
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return f"{kind}-{h.hexdigest()[:40]}"


def _sample_digest(parts: Sequence[TokenArray]) -> bytes:
    """SHA-256 of every ``_SAMPLE_STRIDE``-th token of the concatenation of ``parts``."""
    h = hashlib.sha256()
    at = 0
    for p in parts:
        h.update(np.ascontiguousarray(p[(-at) % _SAMPLE_STRIDE :: _SAMPLE_STRIDE], np.int32).data)
        at += len(p)
    return h.digest()


def load(folder: Path, key: str, count: int) -> list[TokenArray] | None:
    """The ``count`` prompts stored under ``key`` as read-only views of the mapped file; None
    when there is no usable file (one that is inconsistent is removed)."""
    path = folder / f"{key}.prompts"
    try:
        with path.open("rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # absent, unreadable, or empty (mmap refuses length 0)
        return None
    prompts = _views(mapped, count)
    if prompts is None:
        _remove(path)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recency for the size cap's eviction
    return prompts


def _views(mapped: mmap.mmap, count: int) -> list[TokenArray] | None:
    if len(mapped) < _HEADER_BYTES:
        return None
    magic, fmt, n, total, digest = _HEADER.unpack_from(mapped, 0)
    if magic != _MAGIC or fmt != FORMAT or n != count:
        return None
    if len(mapped) != _HEADER_BYTES + 8 * (n + 1) + 4 * total:
        return None
    offsets = np.frombuffer(mapped, dtype=np.int64, count=n + 1, offset=_HEADER_BYTES)
    tokens = np.frombuffer(mapped, dtype=np.int32, count=total, offset=_HEADER_BYTES + 8 * (n + 1))
    if offsets[0] != 0 or offsets[-1] != total or (np.diff(offsets) < 0).any():
        return None
    if _sample_digest([tokens]) != digest:
        return None
    bounds = offsets.tolist()
    return [tokens[lo:hi] for lo, hi in itertools.pairwise(bounds)]


class PromptFile:
    """A cache file being built in place: the prompt of line ``i`` is written into
    ``views[i]`` (a view of the file's mapping, so nothing is copied to store it); ``commit``
    then makes the file the entry of its key, ``abandon`` removes it."""

    def __init__(
        self, folder: Path, key: str, tmp: Path, mapped: mmap.mmap, views: list[TokenArray]
    ) -> None:
        self.folder, self.key, self.tmp = folder, key, tmp
        self.mapped = mapped
        self.views = views

    @classmethod
    def create(cls, folder: Path, key: str, lengths: Sequence[int]) -> PromptFile | None:
        """None (nothing left behind) when it cannot be: over the size cap or the free disk,
        no ``posix_fallocate`` (its blocks are reserved up front, so a full disk fails here and
        never as a fault while the mapping is written), or any OS error."""
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths, dtype=np.int64)])
        total = int(offsets[-1])
        at = _HEADER_BYTES + 8 * len(offsets)
        size = at + 4 * total
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if size > max_bytes() or shutil.disk_usage(folder).free < size + _MIN_FREE_BYTES:
                return None
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, size)
                mapped = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        except (OSError, ValueError, AttributeError):  # AttributeError: no posix_fallocate
            _remove(tmp)
            return None
        mapped[_HEADER_BYTES:at] = offsets.tobytes()
        tokens = np.frombuffer(mapped, dtype=np.int32, count=total, offset=at)
        views = [tokens[lo:hi] for lo, hi in itertools.pairwise(offsets.tolist())]
        return cls(folder, key, tmp, mapped, views)

    def commit(self) -> bool:
        """Seal the file (header and digest; the views become read-only) and make it the
        key's entry; then trim the folder to its cap. False (file removed) on an OS error."""
        total = sum(len(v) for v in self.views)
        header = _HEADER.pack(_MAGIC, FORMAT, len(self.views), total, _sample_digest(self.views))
        self.mapped[: len(header)] = header
        for v in self.views:
            v.flags.writeable = False
        try:
            os.replace(self.tmp, self.folder / f"{self.key}.prompts")
        except OSError:
            self.abandon()
            return False
        _trim(self.folder, max_bytes())
        return True

    def abandon(self) -> None:
        _remove(self.tmp)


def _trim(folder: Path, cap: int) -> None:
    """Remove the least recently used prompt files until the folder holds at most ``cap``,
    and the temporary files of writers that died over an hour ago."""
    try:
        files = [(p.stat(), p) for p in folder.glob("*.prompts")]
        stale = [p for p in folder.glob(".*.tmp") if time.time() - p.stat().st_mtime > 3600]
    except OSError:
        return
    for p in stale:
        _remove(p)
    files.sort(key=lambda sp: sp[0].st_mtime_ns)
    held = sum(s.st_size for s, _ in files)
    for s, p in files:
        if held <= cap:
            break
        _remove(p)
        held -= s.st_size


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()

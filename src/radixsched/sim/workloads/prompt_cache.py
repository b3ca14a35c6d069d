"""On-disk cache of a trace's prompts: the second load of a trace maps them instead of
building them.

A trace's prompts depend only on the file's bytes, the reader's params and the reader's token
derivation (``FORMAT``), so they are keyed by exactly those: a changed file, another
``vocab`` or ``block_size``, or a new derivation is another key. Only regular files are
cached, and only when the file is the same (device, inode, size, mtime) before it is parsed
and after it is hashed: a pipe is read once, and a trace replaced while it loads is never
keyed with the other version's prompts.

The first full load of a trace builds every prompt straight into a new file's mapping
(``PromptFile``: an unnamed ``O_TMPFILE`` file, its blocks reserved first, named when it is
complete), so storing them copies nothing and a build that dies leaves nothing. Later loads
map that file read-only and hand each request a view of it: no token is generated or copied,
pages come in from the page cache as the simulation first reads them, and forked workers
share them. Linux only (elsewhere the prompts are built every time).

Where: ``prompts/`` under the cache root (``paths.cache_root``: ``$RADIXSCHED_CACHE_DIR``,
else ``$XDG_CACHE_HOME/radixsched``, else ``~/.cache/radixsched``); ``RADIXSCHED_PROMPT_CACHE=off``
disables it. The folder is kept under ``$RADIXSCHED_CACHE_MAX_GB`` (default 8) by removing the
least recently used files, and nothing is written when the disk would keep less than 1 GiB
free. The cache is only ever a shortcut: a file that cannot be written is skipped, and one
that is unreadable, truncated or inconsistent is removed and the prompts are built again.

Beside a trace's prompts, ``<key>.bounds`` keeps the optimal hit rates computed over them (a
small JSON object, one entry per selection of requests and page size): a later run reads its
bound instead of recomputing it. It goes with its prompts.

File layout (native byte order): a 64-byte header (magic, ``FORMAT``, request count, token
count, then the SHA-256 of a sample of the tokens), the offsets (int64, count + 1), the tokens
(int32)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import mmap
import os
import stat
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from radixsched.paths import cache_root

# Bump when the token derivation of any trace reader changes (tests/test_prompt_cache.py pins
# the sample trace's prompts, and fails until this and its pin are updated together).
FORMAT = 1
_MAGIC = b"RSPROMPT"
_HEADER = struct.Struct("<8sIQQ32s")  # magic, format, requests, tokens, sample digest
_HEADER_BYTES = 64
# Tokens between sampled ones: under one 4 KiB page, so every page of the file holds a sampled
# token (a page a crash left unwritten reads as zeros and fails the digest); a prime, so the
# samples do not fall on the same place of every block.
_SAMPLE_STRIDE = 1021
_MIN_FREE_BYTES = 1 << 30
DEFAULT_MAX_GB = 8.0
_OFF = ("off", "0", "false", "no")
TokenArray = npt.NDArray[np.int32]


def cache_dir() -> Path | None:
    """The prompt cache's folder (None: disabled, or a platform without unnamed files)."""
    if os.environ.get("RADIXSCHED_PROMPT_CACHE", "").strip().lower() in _OFF:
        return None
    if not (hasattr(os, "O_TMPFILE") and hasattr(os, "posix_fallocate")):
        return None
    return cache_root() / "prompts"


def gib_setting(name: str, default_gb: float) -> int:
    """Bytes of the environment variable ``name``, in GiB (unset, unparsable, negative, NaN or
    absurd: ``default_gb``)."""
    text = os.environ.get(name, "")
    try:
        gb = float(text) if text.strip() else default_gb
    except ValueError:
        gb = default_gb
    if not 0 <= gb < 1e9:
        gb = default_gb
    return int(gb * (1 << 30))


def max_bytes() -> int:
    """The folder's cap in bytes: ``$RADIXSCHED_CACHE_MAX_GB`` GiB (0: nothing is stored)."""
    return gib_setting("RADIXSCHED_CACHE_MAX_GB", DEFAULT_MAX_GB)


def file_id(path: Path) -> tuple[int, ...] | None:
    """A regular file's identity and version (device, inode, size, mtime); None for anything
    else (a pipe, a FIFO, a device, a missing path): those are never cached, as their bytes
    cannot be read twice."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


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


def load(folder: Path, key: str, lengths: Sequence[int]) -> list[TokenArray] | None:
    """The prompts stored under ``key`` as read-only views of the mapped file, which must hold
    exactly ``lengths``; None when there is no usable file (one that is inconsistent is
    removed)."""
    path = folder / f"{key}.prompts"
    try:
        with path.open("rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # absent, unreadable, or empty (mmap refuses length 0)
        return None
    prompts = _views(mapped, lengths)
    if prompts is None:
        _remove(path)
        return None
    # Recency for the size cap's eviction, from the fine clock: later than the stamp of any
    # file written before, which the kernel takes from its coarse clock (a tick of milliseconds).
    with contextlib.suppress(OSError):
        now = time.time_ns()
        os.utime(path, ns=(now, now))
    _trim(folder, max_bytes(), path)  # a cap lowered since the last store (mapping stays valid)
    return prompts


def _views(mapped: mmap.mmap, lengths: Sequence[int]) -> list[TokenArray] | None:
    if len(mapped) < _HEADER_BYTES:
        return None
    magic, fmt, n, total, digest = _HEADER.unpack_from(mapped, 0)
    if magic != _MAGIC or fmt != FORMAT or n != len(lengths):
        return None
    if len(mapped) != _HEADER_BYTES + 8 * (n + 1) + 4 * total:
        return None
    offsets = np.frombuffer(mapped, dtype=np.int64, count=n + 1, offset=_HEADER_BYTES)
    tokens = np.frombuffer(mapped, dtype=np.int32, count=total, offset=_HEADER_BYTES + 8 * (n + 1))
    want = np.asarray(lengths, dtype=np.int64)
    if offsets[0] != 0 or not np.array_equal(np.diff(offsets), want):
        return None
    if _sample_digest([tokens]) != digest:
        return None
    bounds = offsets.tolist()
    return [tokens[lo:hi] for lo, hi in itertools.pairwise(bounds)]


class PromptFile:
    """A cache file being built in place: the prompt of line ``i`` is written into
    ``views[i]`` (a view of the file's mapping, so nothing is copied to store it); ``commit``
    then gives the file its key's name, ``abandon`` drops it. The file has no name until then
    (``O_TMPFILE``): a build that is killed leaves nothing behind, and builds of one trace at
    once (threads, processes) never share a file."""

    def __init__(
        self, folder: Path, key: str, fd: int, mapped: mmap.mmap, views: list[TokenArray]
    ) -> None:
        self.folder, self.key, self.fd = folder, key, fd
        self.mapped = mapped
        self.views = views

    @classmethod
    def create(cls, folder: Path, key: str, lengths: Sequence[int]) -> PromptFile | None:
        """None when it cannot be: over the size cap or the free disk, no unnamed files or
        ``posix_fallocate`` here (Linux has both; the blocks are reserved up front, so a full
        disk fails here, never as a fault while the mapping is written), or any OS error."""
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths, dtype=np.int64)])
        total = int(offsets[-1])
        at = _HEADER_BYTES + 8 * len(offsets)
        size = at + 4 * total
        import shutil  # (with bz2 and lzma) only where a file is written: a mapping run needs none

        fd = -1
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if size > max_bytes() or shutil.disk_usage(folder).free < size + _MIN_FREE_BYTES:
                return None
            fd = os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o644)
            os.posix_fallocate(fd, 0, size)
            mapped = mmap.mmap(fd, size)
        except (OSError, ValueError, AttributeError):  # AttributeError: not on this platform
            if fd >= 0:
                os.close(fd)
            return None
        mapped[_HEADER_BYTES:at] = offsets.tobytes()
        tokens = np.frombuffer(mapped, dtype=np.int32, count=total, offset=at)
        views = [tokens[lo:hi] for lo, hi in itertools.pairwise(offsets.tolist())]
        return cls(folder, key, fd, mapped, views)

    def commit(self) -> bool:
        """Seal the file (header and digest; the views become read-only), name it as the key's
        entry (replacing any), then trim the folder to its cap. False on an OS error (the file
        is dropped; the views stay valid)."""
        total = sum(len(v) for v in self.views)
        header = _HEADER.pack(_MAGIC, FORMAT, len(self.views), total, _sample_digest(self.views))
        self.mapped[: len(header)] = header
        for v in self.views:
            v.flags.writeable = False
        name = _temporary_name(self.key)
        try:
            _name_unnamed(self.fd, self.folder, name)
            os.replace(self.folder / name, self.folder / f"{self.key}.prompts")
        except OSError:
            _remove(self.folder / name)
            return False
        finally:
            self.abandon()
        _trim(self.folder, max_bytes(), self.folder / f"{self.key}.prompts")
        return True

    def abandon(self) -> None:
        """Close the descriptor (an unnamed file then goes with the last view of it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def load_bound(folder: Path, key: str, bound: str) -> float | None:
    """The value ``store_bound`` kept for ``bound`` beside ``key``'s prompts, if any."""
    value = _bounds(folder / f"{key}.bounds").get(bound)
    return value if isinstance(value, float) and 0.0 <= value <= 1.0 else None


def store_bound(folder: Path, key: str, bound: str, value: float) -> None:
    """Keep ``value`` for ``bound`` beside ``key``'s prompts (nothing when they are not
    stored: bounds never outlive their prompts). Whole-file replace, so a reader sees the old
    or the new object; of two writers at once, one's entry may be lost (it is recomputed)."""
    if not (folder / f"{key}.prompts").exists():
        return
    path = folder / f"{key}.bounds"
    bounds = _bounds(path)
    bounds[bound] = value
    tmp = folder / _temporary_name(key)
    try:
        tmp.write_text(json.dumps(bounds))
        os.replace(tmp, path)
    except OSError:
        _remove(tmp)


def _temporary_name(key: str) -> str:
    """A name no other writer picks for a file of ``key`` being written."""
    import uuid  # only where a file is written: a run that maps its prompts needs none

    return f".{key}.{uuid.uuid4().hex}.tmp"


def _bounds(path: Path) -> dict[str, Any]:
    try:
        bounds = json.loads(path.read_text())
    except (OSError, ValueError):  # absent, unreadable or damaged: as if empty
        return {}
    return bounds if isinstance(bounds, dict) else {}


def _name_unnamed(fd: int, folder: Path, name: str) -> None:
    """Give the ``O_TMPFILE`` file ``fd`` the name ``folder/name``: linkat(2) of its /proc
    entry with AT_SYMLINK_FOLLOW, which ``os.link`` uses only when a directory descriptor is
    given (plain link(2) would link the /proc entry itself and fail)."""
    at = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=at, follow_symlinks=True)
    finally:
        os.close(at)


def _trim(folder: Path, cap: int, newest: Path) -> None:
    """Remove the least recently used prompt files (with their bounds) until the folder holds
    at most ``cap``, bounds whose prompts are gone, and named temporary files over an hour old
    (a writer killed between naming its file and renaming it). ``newest``, the file just
    stored or used, goes last whatever its timestamp says: the kernel stamps files with a
    coarse clock (a tick of milliseconds), so one written just before may carry the same."""
    files = []
    for p in folder.glob("*.bounds"):
        if not p.with_suffix(".prompts").exists():
            _remove(p)
    for p in [*folder.glob("*.prompts"), *folder.glob(".*.tmp")]:
        try:
            st = p.stat()
        except OSError:  # gone meanwhile, or a dangling link
            _remove(p)
            continue
        if p.suffix == ".tmp":
            if time.time() - st.st_mtime > 3600:
                _remove(p)
        else:
            files.append((st, p))
    files.sort(key=lambda sp: (sp[1] == newest, sp[0].st_mtime_ns))
    held = sum(s.st_size for s, _ in files)
    for s, p in files:
        if held <= cap:
            break
        _remove(p)
        _remove(p.with_suffix(".bounds"))
        held -= s.st_size


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()

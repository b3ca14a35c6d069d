"""The native core: the C++ extension (``radixsched._native._core``, built from
``_native/*.cpp`` by the package's build) and the Python that drives it, in this package.

Two implementations of the scheduling core exist: the readable Python reference
(``radixsched.scheduler``, ``queue``, ``adder``, ``kv``, ``cache.radix``) and this one, chosen
when a scheduler is built (``native.build.build_scheduler``). The modules here run only over
the extension: the radix tree's face (``radix``), the matcher's (``matching``), the kept
orders (``orders``), the queue, the KV manager, the admission (``admit``), the fused prefill
step (``step``), retirement, arrivals and the multi-step runner's interface, and the scheduler
that puts them together. This module is only the loader: ``core()`` is the extension module,
or None when ``RADIXSCHED_NATIVE=0`` or the extension is missing (a source checkout on
``PYTHONPATH`` without a build): then every scheduler is built on the reference, and one line
on stderr says so, once per process and reason. Beside the scheduler the extension also serves
the simulator's open loop between two arrivals, the workloads' hashed prompts, the trace
reader and the optimal bound's trie.
``RADIXSCHED_NATIVE_LIB=PATH`` loads the extension from a file instead (the sanitizer and debug
builds of ``make sanitize``).

Namespaces cross into C++ as small ids: ``NAMESPACES[i]`` is the normalised namespace of id
``i`` (0: the default, None), shared by every native tree of the process.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import Any

# ``cache.base.Namespace``, spelled out: this module is imported by the caches, never the reverse.
Namespace = tuple[str | None, str | None] | None

ENV = "RADIXSCHED_NATIVE"
LIB_ENV = "RADIXSCHED_NATIVE_LIB"
_BUILD_HINT = "build it with `pip install -e .` (or `make test`)"

NAMESPACES: list[Namespace] = [None]
_NS_ID: dict[Namespace, int] = {None: 0}

_said: set[str] = set()
_loaded: list[ModuleType | None] = []  # [] until the first try, then [module or None]
_loading = threading.Lock()


def notice(message: str) -> None:
    """One line on stderr, once per process for each message."""
    if message not in _said:
        _said.add(message)
        print(f"radixsched: {message}", file=sys.stderr)


def _load() -> ModuleType | None:
    path = os.environ.get(LIB_ENV)
    try:
        if path:
            loader = importlib.machinery.ExtensionFileLoader("radixsched._native._core", path)
            spec = importlib.util.spec_from_file_location(
                "radixsched._native._core", path, loader=loader
            )
            if spec is None:
                raise ImportError(f"{LIB_ENV}={path}: not an extension module")
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
        else:
            module = importlib.import_module("radixsched._native._core")
    except ImportError as exc:
        notice(f"native core not available ({exc}); the reference core runs: {_BUILD_HINT}")
        return None
    module.set_namespaces(NAMESPACES)
    return module


def core() -> ModuleType | None:
    """The native extension, or None (turned off, or not built: a notice says which)."""
    if os.environ.get(ENV, "1") == "0":
        notice(f"{ENV}=0: the native core is off; the reference core runs")
        return None
    if not _loaded:
        with _loading:  # threads building prompts may ask first, together
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def required(what: str) -> ModuleType:
    """The native extension, for ``what``, which runs only over it: a RuntimeError when it
    is off or not built (its notice says which)."""
    mod = core()
    if mod is None:
        raise RuntimeError(f"{what} needs the native core (radixsched.native)")
    return mod


def namespace_of(r: Any) -> int:
    """``namespace_id`` of a request's namespace: the callable the native core asks per
    request (a ``Req``; typed loosely, this module sits below the request's)."""
    return namespace_id(r.namespace)


def namespace_id(ns: Namespace) -> int:
    """The id of ``ns`` (interned on first sight; an empty salt and (None, None) are the
    default namespace, as the Python tree normalises them)."""
    got = _NS_ID.get(ns)
    if got is not None:
        return got
    assert ns is not None
    extra, salt = ns
    norm = None if (extra is None and salt in (None, "")) else (extra, salt or None)
    i = _NS_ID.get(norm)
    if i is None:
        i = len(NAMESPACES)
        NAMESPACES.append(norm)
        _NS_ID[norm] = i
    _NS_ID[ns] = i
    return i

"""Loading a workload: the spec's builder run once (its drafts memoised per process), arrival
times (the trace's, or Poisson at a rate), prompts kept on disk between runs, and the optimal
hit rate computed over them (or read back)."""

from __future__ import annotations

import hashlib
import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from radixsched.native import core
from radixsched.request import Req, SamplingParams, TokenArray
from radixsched.sim.heap import paused_gc
from radixsched.sim.workloads import deferred, prompt_cache
from radixsched.sim.workloads.deferred import shared_stand_in, should_defer, stand_in
from radixsched.sim.workloads.spec import (
    WORKLOADS,
    Defaults,
    WorkloadKind,
    _fmt_param,
    describe_params,
    parse_workload_spec,
    trace_version,
)
from radixsched.sim.workloads.tokens import MAX_ARRIVAL_S, WorkloadError, _Draft, _fill_prompts


@dataclass
class Workload:
    """A loaded workload: its requests, in arrival order, and where they came from."""

    name: str
    params: dict[str, Any]
    requests: list[Req]  # sorted by arrival time
    has_timestamps: bool
    tenants: tuple[str, ...] | None = None
    arrivals: str = ""  # how arrival times were set, for reports
    prompts: str = "built"  # where the prompts came from (``PROMPT_SOURCES``), for reports
    # The prompt cache's key when the prompts are read-only views of its file (so they cannot
    # change in place: a request's prompt is its trace line's, whatever the run did since).
    prompt_key: str | None = None
    # Deferred prompts (``deferred``): ``drafts[i]`` builds ``requests[i]``'s prompt when the
    # run reaches it; the requests hold stand-ins until then. None: every prompt is built.
    drafts: list[_Draft] | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return sum([len(r.prompt_ids) for r in self.requests])  # ``prompt_len``, no call

    @property
    def num_output_tokens(self) -> int:
        return sum(r.sampling.max_new_tokens for r in self.requests)

    @property
    def params_text(self) -> str:
        """The params as a spec writes them: ``groups=256, prompts=8, ...``."""
        kind = WORKLOADS.get(self.name)
        if kind is None:
            return ", ".join(f"{k}={_fmt_param(v)}" for k, v in self.params.items())
        return describe_params(kind, self.params)

    def summary(self) -> dict[str, Any]:
        return {
            "workload": self.name,
            "params": dict(self.params),
            "requests": len(self.requests),
            "prompt_tokens": self.num_prompt_tokens,
            "output_tokens": self.num_output_tokens,
            "arrivals": self.arrivals,
            "last_arrival_s": self.requests[-1].arrival_time if self.requests else 0.0,
        }


# ---- arrivals and assembly ---------------------------------------------------------------


_TIMESTAMP = operator.attrgetter("timestamp_s")
_TENANT = operator.attrgetter("tenant")


def _arrival_times(
    drafts: Sequence[_Draft], request_rate: float | None, default_rate: float | None, seed: int
) -> tuple[npt.NDArray[np.float64], str]:
    if request_rate is None:
        if None not in map(_TIMESTAMP, drafts):
            return np.array(list(map(_TIMESTAMP, drafts)), dtype=np.float64), "trace timestamps"
        request_rate = math.inf if default_rate is None else default_rate
    if math.isnan(request_rate) or request_rate <= 0:
        raise WorkloadError(f"request_rate must be > 0 (or inf), got {request_rate}")
    sessions = np.array([d.session for d in drafts], dtype=np.int64)
    offsets = np.array([d.offset_s for d in drafts], dtype=np.float64)
    num_sessions = int(sessions.max()) + 1
    if math.isinf(request_rate):
        return offsets.copy(), "sessions at t=0" if offsets.any() else "all at t=0"
    # Session starts at a rate that makes the long-run request rate ``request_rate``.
    session_rate = request_rate * num_sessions / len(drafts)
    gaps = np.random.default_rng([seed, 0xA771]).exponential(1.0 / session_rate, num_sessions)
    starts = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    return starts[sessions] + offsets, f"poisson {request_rate:g} req/s"


class DraftMemo:
    """The drafts of the last workload built through it, with the prompts built so far. A next
    load of the same spec, params and seed (at another request rate, or keeping other
    requests) reuses them and builds only the prompts it has not built yet: a prompt depends on
    its request alone, never on the arrivals. A trace whose file changed is read again."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._drafts: list[_Draft] = []

    def drafts(self, kind: WorkloadKind, params: Mapping[str, Any], seed: int) -> list[_Draft]:
        key = (kind.name, sorted(params.items()), seed, trace_version(kind, params))
        if key != self._key:
            self._key, self._drafts = None, []  # the previous drafts go before the next are built
            self._drafts = kind.build(dict(params), seed)
            self._key = key
        return self._drafts


@paused_gc()  # a large trace: millions of objects that all stay (sim.heap)
def load_workload(
    spec: str,
    *,
    request_rate: float | None = None,
    num_requests: int | None = None,
    seed: int = 0,
    default_rate: float | None = None,
    defaults: Defaults | None = None,
    memo: DraftMemo | None = None,
    defer_prompts: bool = False,
) -> Workload:
    """Build the workload ``spec`` names (see the module docstring). ``default_rate`` is the
    request rate used when ``request_rate`` is None and the workload has no timestamps
    (None: all at t=0); ``defaults`` replaces generators' param defaults (see ``Defaults``);
    ``memo`` lends the prompts an earlier load of the same spec built; ``defer_prompts``: a
    trace whose prompts exceed ``deferred.eager_limit_bytes`` builds none now (the run builds
    each when its request arrives, ``deferred.ArrivingRequests``; no prompt cache)."""
    kind, params = parse_workload_spec(spec, defaults)
    if num_requests is not None and num_requests < 1:
        raise WorkloadError(f"num_requests must be >= 1, got {num_requests}")
    before = prompt_cache.file_id(Path(params["path"])) if kind.is_trace else None
    drafts = kind.build(params, seed) if memo is None else memo.drafts(kind, params, seed)
    arrival, how = _arrival_times(drafts, request_rate, default_rate, seed)
    last = float(arrival.max())
    if not last <= MAX_ARRIVAL_S:  # traces are checked line by line as they are read
        think = " (or shorten think_time_s)" if kind.param("think_time_s") else ""
        raise WorkloadError(
            f"workload {kind.name}: arrivals ({how}) span {last:.3g} s, beyond the "
            f"{MAX_ARRIVAL_S:.0e} s the simulated clock keeps to the microsecond; raise the "
            f"request rate{think}"
        )
    order = np.argsort(arrival, kind="stable")
    if num_requests is not None:
        order = order[:num_requests]
    kept = order.tolist()
    deferred = [drafts[i] for i in kept] if defer_prompts else []
    if deferred and should_defer(deferred):
        source, key = PROMPT_SOURCES[3], None
    else:
        deferred = []
        source, key = _fill_kept(kind, params, drafts, kept, before)
    times = arrival.tolist()  # Python floats: the values float(arrival[i]) gives
    reqs = _cloned(kind.name, drafts, kept, times) if deferred else None
    if reqs is None:
        reqs = _constructed(kind.name, drafts, kept, times, bool(deferred))
    tenants = sorted(set(map(_TENANT, reqs)) - {None})
    return Workload(
        name=kind.name,
        params=params,
        requests=reqs,
        has_timestamps=None not in map(_TIMESTAMP, drafts),
        tenants=tuple(tenants) if tenants else None,
        arrivals=how,
        prompts=source,
        prompt_key=key,
        drafts=deferred or None,
    )


def _constructed(
    name: str, drafts: list[_Draft], kept: list[int], times: list[float], deferred: bool
) -> list[Req]:
    """The requests of ``drafts[i]`` for ``i`` in ``kept``, in order, each arriving at
    ``times[i]``, made by ``Req``'s constructor; ``deferred``: each with a stand-in prompt."""
    # One (frozen) SamplingParams per output length, shared as the runs' copies of a request
    # share theirs: a trace has far fewer lengths than requests (each one costs 1.3 us).
    sampling: dict[int, SamplingParams] = {}
    reqs = []
    for i in kept:
        d = drafts[i]
        params_of = sampling.get(d.output_len)
        if params_of is None:
            params_of = SamplingParams(max_new_tokens=d.output_len, ignore_eos=True)
            sampling[d.output_len] = params_of
        # Positionally (a quarter of a million requests' construction goes to matching
        # keywords), in ``REQ_FIELDS``' order: rid, prompt_ids, sampling, priority,
        # routing_key, extra_key, cache_salt, tenant, arrival_time, scripted_output.
        reqs.append(
            Req(
                f"{name}-{i}",
                stand_in(d.length) if deferred else d.prompt,
                params_of,
                d.priority,
                d.routing_key,
                d.extra_key,
                None,
                d.tenant,
                times[i],
                d.scripted,
            )
        )
    return reqs


# What a draft may set beyond its prompt, output length and arrival: all None in a request
# ``_cloned`` makes.
_EXTRAS = tuple(
    operator.attrgetter(name)
    for name in ("priority", "routing_key", "extra_key", "tenant", "scripted")
)
_LENGTH = operator.attrgetter("length")
_OUTPUT_LEN = operator.attrgetter("output_len")
# The slots ``Req``'s constructor fills per request from a deferred draft (given: rid,
# prompt_ids, sampling, arrival_time; made: output_ids, times; derived: queue_entry_time),
# and of its ``ReqTimes`` (arrival; made: token_times).
_PER_REQUEST = {"rid", "prompt_ids", "sampling", "arrival_time", "queue_entry_time", "output_ids",
                "times"}  # fmt: skip
_PER_TIMES = {"arrival", "token_times"}


def _cloned(
    name: str, drafts: list[_Draft], kept: list[int], times: list[float]
) -> list[Req] | None:
    """``_constructed(..., deferred=True)``: the same requests, field for field, as copies of
    one the constructor made (``_core.clone_like``, a tenth of its cost), each with its rid,
    stand-in (``shared_stand_in``: replaced when the prompt is built),
    sampling (one per output length, as there), arrival, and new output list and times. None
    (construct them) without the core, where a kept draft sets another field, or where the
    constructor fills other slots per request than ``_PER_REQUEST`` (``_clone_template``)."""
    clone = getattr(core(), "clone_like", None)
    ds = [drafts[i] for i in kept]
    if clone is None or not ds or not all(_all_none(map(f, ds)) for f in _EXTRAS):
        return None
    like = _clone_template(name)
    if like is None:
        return None
    lengths, outputs = list(map(_LENGTH, ds)), list(map(_OUTPUT_LEN, ds))
    if min(lengths) < 1:  # (an empty prompt: the constructor's error)
        return None
    sampling = {
        n: SamplingParams(max_new_tokens=n, ignore_eos=True) for n in dict.fromkeys(outputs)
    }
    arrivals = [times[i] for i in kept]
    made = clone(like.times, {"arrival": arrivals}, ("token_times",))
    columns = {
        "rid": [f"{name}-{i}" for i in kept],
        "prompt_ids": _stand_ins(lengths),
        "sampling": list(map(sampling.__getitem__, outputs)),
        "arrival_time": arrivals,
        "queue_entry_time": arrivals,
        "times": made,
    }
    reqs: list[Req] | None = None if made is None else clone(like, columns, ("output_ids",))
    return reqs


def _all_none(values: Iterable[object]) -> bool:
    """Whether every value is None (by identity: an array is never compared)."""
    return not any(map(operator.is_not, values, itertools.repeat(None)))


def _stand_ins(lengths: list[int]) -> list[TokenArray]:
    """``[shared_stand_in(n) for n in lengths]``: each length's made once, then looked up."""
    for n in dict.fromkeys(lengths):
        shared_stand_in(n)
    return list(map(deferred._SHARED.__getitem__, lengths))


def _clone_template(name: str) -> Req | None:
    """A request of the constructor's to copy from, or None where the constructor fills
    other slots per request than ``_PER_REQUEST`` (and of its times than ``_PER_TIMES``):
    two requests made from different values, compared slot by slot."""
    a, b = (
        Req(f"{name}-{k}", stand_in(k + 1), SamplingParams(max_new_tokens=k + 1), None, None,
            None, None, None, float(k + 1), None)
        for k in range(2)
    )  # fmt: skip
    if _differing(a, b) != _PER_REQUEST or _differing(a.times, b.times) != _PER_TIMES:
        return None
    return a


def _differing(a: Any, b: Any) -> set[str]:
    """The slots of ``a``'s class where ``a`` and ``b`` hold different objects."""
    names = type(a).__slots__
    return {s for s in names if getattr(a, s) is not getattr(b, s)}


PROMPT_SOURCES = ("built", "built, cached", "from the cache", "built at arrival")
# ``Req``'s first fields, in order: ``load_workload`` passes them positionally.
REQ_FIELDS = (
    "rid", "prompt_ids", "sampling", "priority", "routing_key", "extra_key", "cache_salt",
    "tenant", "arrival_time", "scripted_output",
)  # fmt: skip


def _prompt_key(
    kind: WorkloadKind,
    params: Mapping[str, Any],
    drafts: list[_Draft],
    before: tuple[int, ...] | None,
) -> str | None:
    """The prompt cache's key of a trace whose every prompt is still to build, hashed from the
    file that was parsed; None when the cache does not apply (a generator, token ids given,
    prompts built by an earlier load, not a regular file, a file that changed meanwhile)."""
    if before is None or prompt_cache.cache_dir() is None or any(d.fill is None for d in drafts):
        return None
    path = Path(params["path"])
    try:
        key = prompt_cache.trace_key(kind.name, path, params)
    except OSError:
        return None
    return key if prompt_cache.file_id(path) == before else None


def _fill_kept(
    kind: WorkloadKind,
    params: Mapping[str, Any],
    drafts: list[_Draft],
    kept: list[int],
    before: tuple[int, ...] | None,
) -> tuple[str, str | None]:
    """Build the prompts of ``drafts[i]`` for ``i`` in ``kept``: mapped from the prompt cache
    when a full load of this trace stored them, else built (and stored when every prompt of
    the trace was). ``before``: the trace file's ``prompt_cache.file_id`` before it was parsed
    (None: not a regular file, never cached). Returns where they came from
    (``PROMPT_SOURCES``) and their cache key when they are views of the cache's file."""
    want = [drafts[i] for i in kept]
    key = _prompt_key(kind, params, drafts, before)
    folder = prompt_cache.cache_dir()
    if key is None or folder is None:
        _fill_read_only(want)
        return PROMPT_SOURCES[0], None
    cached = prompt_cache.load(folder, key, [d.length for d in drafts])
    if cached is not None:
        for i in kept:
            drafts[i].prompt = cached[i]
            drafts[i].fill = drafts[i].source = None
        return PROMPT_SOURCES[2], key
    file = None
    if len(want) == len(drafts):  # a full load: built in the new cache file's mapping
        file = prompt_cache.PromptFile.create(folder, key, [d.length for d in drafts])
    if file is None:
        _fill_read_only(want)
        return PROMPT_SOURCES[0], None
    for d, view in zip(drafts, file.views, strict=True):
        d.prompt = view
    try:
        _fill_read_only(want)
    except BaseException:
        file.abandon()
        raise
    return (PROMPT_SOURCES[1], key) if file.commit() else (PROMPT_SOURCES[0], None)


def _fill_read_only(drafts: list[_Draft]) -> None:
    """``_fill_prompts``, each built array then read-only, as the prompt cache's views and the
    deferred prompts are: nothing writes a trace's prompt, so the radix tree's keys may view it
    instead of copying it (``_native/radix.cpp``'s key blocks share read-only prompts only)."""
    _fill_prompts(drafts)
    for d in drafts:
        if isinstance(d.prompt, np.ndarray):
            d.prompt.flags.writeable = False


# ---- optimal hit rate ------------------------------------------------------------------


def optimal_hit_rate(reqs: Sequence[Req], page_size: int = 1) -> float:
    """Share of prompt tokens an infinite prefix cache could serve (``results.optimal``)."""
    from radixsched.results.optimal import optimal_hit_rate as optimal

    return optimal(reqs, page_size)


def workload_optimal_hit_rate(workload: Workload, page_size: int = 1) -> float:
    """``optimal_hit_rate`` of the workload's requests, kept beside the trace's prompts in
    the prompt cache: a later run of the same requests reads it instead. NaN (not computed)
    when the prompts are deferred: the bound's tree would hold every prompt at once."""
    if workload.drafts is not None:
        return math.nan
    folder, key = prompt_cache.cache_dir(), workload.prompt_key
    if folder is None or key is None:
        return optimal_hit_rate(workload.requests, page_size)
    bound = _bound_key(workload.requests, page_size)
    value = prompt_cache.load_bound(folder, key, bound)
    if value is None:
        value = optimal_hit_rate(workload.requests, page_size)
        prompt_cache.store_bound(folder, key, bound, value)
    return value


def _bound_key(reqs: Sequence[Req], page_size: int) -> str:
    """What the bound depends on beyond the trace's bytes (the cache key): which lines, in
    which order, when, and how much of each is prompt and fed-back output, in which
    namespace. A prompt's tokens are its line's (the key's file), named by the request id."""
    # One update of the lines joined: the digest of the concatenation, as a line at a time.
    # A line: rid, arrival, prompt_len (read as len(prompt_ids), without the property's call),
    # output tokens, namespace, whether the output is scripted (str(bool), picked not formatted).
    scripted = {False: "\0False\n", True: "\0True\n"}
    lines = [
        f"{r.rid}\0{r.arrival_time!r}\0{len(r.prompt_ids)}\0{r.sampling.max_new_tokens}\0"
        f"{r.namespace!r}{scripted[r.scripted_output is not None]}"
        for r in reqs
    ]
    h = hashlib.sha256(f"optimal\0{page_size}\0".encode())
    h.update("".join(lines).encode())
    return h.hexdigest()[:32]

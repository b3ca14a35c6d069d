"""Workloads for the simulator: trace readers and generators, selected by a spec string.

Spec strings
------------
``name:k=v,k=v`` (generators; ``name`` alone takes every default) or ``name:PATH`` (trace
readers; ``name:path=PATH,k=v`` also sets reader params). ``describe_workloads()`` lists every
name and param; ``load_workload(spec, request_rate=..., num_requests=..., seed=...)`` builds one.
Every request gets ``SamplingParams(max_new_tokens=output_len, ignore_eos=True)`` and a prompt
as a compact int32 array (one array per request, never one Python object per token).

Trace readers
-------------
``mooncake:PATH`` reads the Mooncake trace format (FAST'25 release): one JSON object a line
with ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``, one id per
512-token block. An id stands for its whole prefix, so each id becomes a fixed block of tokens
(``hash(id, position) mod vocab``): requests whose id lists start alike share exactly those
blocks. The last block is cut to ``input_length``; prompt positions beyond
``len(hash_ids) * 512`` get request-unique tokens. A block that several prompts use
is generated once into a table (vectorised); the others are generated with the rest of their
batch of 256 requests, and each prompt is gathered from its batch's rows. Memory is therefore
the prompts themselves, 4 bytes a token (the 3,993-request synthetic trace: 61M tokens, 245 MB),
plus the shared blocks' table while loading. A trace whose prompts exceed 2 GiB
(``$RADIXSCHED_EAGER_PROMPTS_GB``) loaded by ``simulate`` builds them as its requests arrive and
drops them as they finish instead (``deferred``; no prompt cache, no optimal bound).
Params: ``vocab`` (128000), ``block_size`` (512).

``jsonl:PATH`` reads radixsched's own format, one JSON object a line (unknown fields are an
error, so typos cannot pass silently):

- prompt, exactly one of: ``input_ids`` (list of token ids), or ``input_length`` (tokens)
  with optional ``prefix_group`` (string or integer id) and ``prefix_length`` (the first
  ``prefix_length`` tokens are the group's shared prefix; required with ``prefix_group``).
  Group prefixes are ``hash(group, position) mod vocab``, so two requests of a group share
  ``min`` of their prefix lengths; the rest of the prompt is request-unique.
- ``output_length``: tokens to generate (defaults to ``len(output_ids)`` when that is given).
- ``output_ids``: scripted output tokens (the simulated model returns them in order).
- arrival, on every line or on none: ``arrival_time`` (seconds) or ``timestamp`` (ms).
- ``priority`` (integer), ``routing_key``, ``tenant``, ``extra_key`` (strings).
Params: ``vocab`` (128000) for generated prompt tokens.

Trace arrivals are shifted so that the earliest request arrives at t=0. Trace prompts depend
only on the file, never on the seed.

Generators (deterministic from the seed)
----------------------------------------
- ``shared-prefix``: ``groups`` groups of ``prompts`` requests; a request is its group's
  ``system_len``-token system prompt plus a ``question_len``-token question; ``shuffle``
  (default on) interleaves the groups in arrival order.
- ``multi-turn``: ``conversations`` chats of ``turns`` turns. Turn 1 is ``first_len`` tokens;
  turn k+1's prompt is turn k's prompt, turn k's (scripted) output and ``turn_len`` new
  tokens. Turn k arrives ``(k-1) * think_time_s`` after its conversation starts.
- ``tree-of-thought``: ``trees`` trees of ``depth`` levels with ``branching`` children per
  node. The root prompt is ``root_len`` tokens; a child's prompt is its parent's prompt, the
  parent's scripted output and ``step_len`` new tokens. Level l arrives
  ``l * think_time_s`` after the tree starts.
- ``few-shot``: ``questions`` MMLU-style questions over ``num_subjects`` subjects; each
  subject has ``shots`` examples of ``shot_len`` tokens shared by all its questions, followed
  by a ``question_len``-token question; ``shuffle`` as above.
Every generator takes ``output_len`` and ``vocab``.

Arrivals
--------
``request_rate=None``: trace timestamps where the workload has them, else ``default_rate``
(None: all at t=0).
``request_rate=inf``: all at t=0. A finite rate: Poisson arrivals (seeded, the first at t=0).
Multi-turn conversations and thought trees are sessions: the arrival process places session
starts (at ``request_rate`` divided by the mean requests per session, so the long-run request
rate is ``request_rate``) and later turns/levels keep their offsets. This is an open-loop
approximation: a turn may arrive before the previous one finished. ``num_requests`` keeps the
first N requests in arrival order.

Optimal hit rate
----------------
``optimal_hit_rate(reqs, page_size)``: what an infinite cache could serve (its rule is in
``results.optimal``). ``mooncake_block_hit_rate(path)`` is the Mooncake README's block-level
figure instead (leading ids already seen x 512, capped at ``input_length``, no ``-1`` cap):
65.1% on the synthetic trace."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixsched.sim.workloads.generators import (
    _build_few_shot,
    _build_multi_turn,
    _build_shared_prefix,
    _build_tree_of_thought,
    _size_few_shot,
    _size_multi_turn,
    _size_shared_prefix,
    _size_tree_of_thought,
)
from radixsched.sim.workloads.tokens import (
    DEFAULT_VOCAB,
    MAX_GENERATED_REQUESTS,
    MAX_GENERATED_TOKENS,
    MAX_PROMPT_TOKENS,
    Builder,
    WorkloadError,
)
from radixsched.sim.workloads.trace_files import check_trace
from radixsched.sim.workloads.traces import _build_jsonl, _build_mooncake

# ---- params and the registry ----------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One param of a workload spec (``name=value``): its type, default and bounds."""

    name: str
    type: type
    default: Any
    help: str
    minimum: float | None = 1  # inclusive lower bound for numbers (None: unchecked)
    maximum: float | None = None  # inclusive upper bound for numbers (None: unchecked)

    def parse(self, workload: str, text: str) -> Any:
        where = f"workload {workload}: param {self.name!r}"
        value: Any
        if self.type is bool:
            low = text.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise WorkloadError(f"{where}: expected a boolean (true/false), got {text!r}")
            value = low in ("1", "true", "yes", "on")
        elif self.type is int:
            try:
                value = int(text)
            except ValueError:
                raise WorkloadError(f"{where}: expected an integer, got {text!r}") from None
        elif self.type is float:
            try:
                value = float(text)
            except ValueError:
                raise WorkloadError(f"{where}: expected a number, got {text!r}") from None
            if not math.isfinite(value):
                raise WorkloadError(f"{where}: expected a finite number, got {text!r}")
        else:
            value = text
        if self.minimum is not None and self.type in (int, float) and value < self.minimum:
            raise WorkloadError(f"{where}: must be >= {self.minimum:g}, got {text!r}")
        if self.maximum is not None and self.type in (int, float) and value > self.maximum:
            raise WorkloadError(f"{where}: must be <= {self.maximum:,.0f}, got {text!r}")
        return value


@dataclass(frozen=True)
class WorkloadKind:
    """A workload builder as specs name it: its params and whether it reads a trace file."""

    name: str
    help: str
    params: tuple[Param, ...]
    build: Builder
    is_trace: bool = False  # takes a file path as its argument
    # A generator's (requests, tokens) for its params, checked against the limits before it runs.
    size: Callable[[Mapping[str, Any]], tuple[int, int]] | None = None

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


_VOCAB = Param(
    "vocab", int, DEFAULT_VOCAB, "token ids are drawn from [0, vocab)", minimum=2, maximum=2**31
)
_PATH = Param("path", str, None, "trace file")


def _param(name: str, default: Any, help_: str, minimum: float | None = 1) -> Param:
    return Param(name, type(default), default, help_, minimum)


def _length_param(name: str, default: int, help_: str) -> Param:
    """A length in tokens: at most ``MAX_PROMPT_TOKENS``."""
    return Param(name, int, default, help_, 1, MAX_PROMPT_TOKENS)


_OUT = "tokens generated per request"
_SHUFFLE = _param("shuffle", True, "interleave requests in a seeded random arrival order", None)
_THINK = "seconds between a session's consecutive requests"

WORKLOADS: dict[str, WorkloadKind] = {
    k.name: k
    for k in (
        WorkloadKind(
            "mooncake",
            "Mooncake JSONL trace (timestamp ms, input/output_length, 512-token hash_ids)",
            (_PATH, _VOCAB, _length_param("block_size", 512, "tokens per hash id")),
            _build_mooncake,
            is_trace=True,
        ),
        WorkloadKind(
            "jsonl",
            "radixsched JSONL trace (format in sim/workloads/traces.py)",
            (_PATH, _VOCAB),
            _build_jsonl,
            is_trace=True,
        ),
        WorkloadKind(
            "shared-prefix",
            "groups of requests sharing a system prompt",
            (
                _param("groups", 64, "groups (distinct system prompts)"),
                _param("prompts", 16, "requests per group"),
                _length_param("system_len", 2048, "shared system-prompt tokens"),
                _length_param("question_len", 128, "unique question tokens per request"),
                _length_param("output_len", 256, _OUT),
                _SHUFFLE,
                _VOCAB,
            ),
            _build_shared_prefix,
            size=_size_shared_prefix,
        ),
        WorkloadKind(
            "multi-turn",
            "chats whose turns extend the previous turn's context and output",
            (
                _param("conversations", 64, "conversations"),
                _param("turns", 5, "turns per conversation"),
                _length_param("first_len", 512, "tokens of the first turn's prompt"),
                _length_param("turn_len", 128, "new user tokens per later turn"),
                _length_param("output_len", 128, _OUT),
                _param("think_time_s", 2.0, _THINK, 0),
                _VOCAB,
            ),
            _build_multi_turn,
            size=_size_multi_turn,
        ),
        WorkloadKind(
            "tree-of-thought",
            "branching prompts: each child extends its parent's prompt and output",
            (
                _param("trees", 32, "independent trees"),
                _param("depth", 3, "levels, the root included"),
                _param("branching", 3, "children per node"),
                _length_param("root_len", 512, "root prompt tokens"),
                _length_param("step_len", 64, "new tokens per child step"),
                _length_param("output_len", 128, _OUT),
                _param("think_time_s", 1.0, "seconds between a tree's levels", 0),
                _VOCAB,
            ),
            _build_tree_of_thought,
            size=_size_tree_of_thought,
        ),
        WorkloadKind(
            "few-shot",
            "MMLU-like k-shot questions; each subject shares its examples",
            (
                _param("questions", 1024, "requests"),
                _param("shots", 5, "examples per subject"),
                _length_param("shot_len", 128, "tokens per example"),
                _length_param("question_len", 128, "unique question tokens"),
                _length_param("output_len", 1, _OUT),
                _param("num_subjects", 57, "subjects, each with its own examples"),
                _SHUFFLE,
                _VOCAB,
            ),
            _build_few_shot,
            size=_size_few_shot,
        ),
    )
}


# Per-workload parameter defaults that replace the generators' own (``defaults=`` of
# ``load_workload``): a caller such as ``bench`` sizes workloads for its setting, and a spec
# that names only some params keeps the caller's values for the others.
Defaults = Mapping[str, Mapping[str, Any]]


def workload_defaults(kind: WorkloadKind, defaults: Defaults | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {p.name: p.default for p in kind.params}
    params.update((defaults or {}).get(kind.name, {}))
    return params


def describe_workloads(defaults: Defaults | None = None) -> str:
    """Every workload with its params and defaults (for ``--help``)."""
    lines = []
    for k in WORKLOADS.values():
        usage = f"{k.name}:PATH" if k.is_trace else f"{k.name}[:k=v,...]"
        lines.append(f"  {usage}  {k.help}")
        values = workload_defaults(k, defaults)
        params = [f"{p.name}={_fmt_param(values[p.name])}" for p in k.params if p.name != "path"]
        lines.append("      " + ", ".join(params))
    return "\n".join(lines)


def describe_params(kind: WorkloadKind, params: Mapping[str, Any]) -> str:
    """``k=v, k=v`` of a workload's params as a spec writes them (the path first for traces)."""
    return ", ".join(f"{p.name}={_fmt_param(params[p.name])}" for p in kind.params)


def _fmt_param(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def parse_workload_spec(
    spec: str, defaults: Defaults | None = None
) -> tuple[WorkloadKind, dict[str, Any]]:
    """``name:k=v,...`` or ``name:PATH`` -> (kind, params with defaults filled in)."""
    name, _, arg = spec.strip().partition(":")
    kind = WORKLOADS.get(name)
    if kind is None:
        raise WorkloadError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    items: list[str] = []
    params = workload_defaults(kind, defaults)
    if kind.is_trace:
        if not arg:
            raise WorkloadError(f"workload {name} needs a file: {name}:PATH")
        if arg.startswith("path="):
            items = arg.split(",")
        else:
            params["path"] = arg
    elif arg:
        items = arg.split(",")
    given: set[str] = set()
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        p = kind.param(key)
        if not eq or p is None:
            valid = ", ".join(q.name for q in kind.params)
            what = f"unknown param {key!r}" if eq else f"expected k=v, got {item!r}"
            raise WorkloadError(f"workload {name}: {what}; valid params: {valid}")
        if key in given:
            raise WorkloadError(f"workload {name}: param {key!r} is given twice")
        given.add(key)
        params[key] = p.parse(name, value)
    if kind.is_trace and not params["path"]:
        raise WorkloadError(f"workload {name} needs a file: {name}:PATH")
    if kind.size is not None:
        n, tokens = kind.size(params)
        if n > MAX_GENERATED_REQUESTS or tokens > MAX_GENERATED_TOKENS:
            raise WorkloadError(
                f"workload {name}: these params make over {MAX_GENERATED_REQUESTS:,} requests "
                f"or {MAX_GENERATED_TOKENS:,} tokens, the most a generated workload may hold; "
                "lower them"
            )
    return kind, params


def check_workload_spec(spec: str) -> None:
    """Fail now, in one line, on a bad spec or a trace that cannot be read (nothing built)."""
    kind, params = parse_workload_spec(spec)
    if kind.is_trace:
        check_trace(params["path"])


def trace_version(kind: WorkloadKind, params: Mapping[str, Any]) -> int | None:
    """The modification time of the trace file a workload reads (None: a generated one)."""
    return Path(params["path"]).stat().st_mtime_ns if kind.is_trace else None

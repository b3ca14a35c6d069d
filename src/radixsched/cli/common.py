"""What every subcommand shares: the argument parser class (no silent abbreviations, typo
suggestions), the user-error type, the built-in simulation defaults, the run metadata every
output records, the default thread count of the torch commands, and the cache root where
commands keep files between runs."""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import re
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from radixsched.paths import same_file

if TYPE_CHECKING:
    import torch
    from rich.console import Console

    from radixsched.config import SchedulerConfig

# The subcommands, in help order, with their one-line help. Only the command being run has its
# parser built (and its module imported); the others are one help line each.
COMMAND_HELP = {
    "simulate": "replay a workload through the scheduler and compare policies",
    "sweep": "run a grid of simulations from a YAML config and report the results",
    "generate": "generate completions offline with a real model under the scheduler",
    "serve": "serve a model over HTTP (OpenAI-compatible API, /generate, /metrics)",
    "router": "route requests to running radixsched workers with sglang-router (cache-aware)",
    "bench": "load a running server with a workload and report latency, throughput, hit rate",
    "calibrate": "fit the simulator's cost model to measured runs (or profile the local engine)",
    "plan": "find the cheapest deployment that meets latency SLOs on a workload",
}


# Whether ``pause_collection_for_start`` paused the collector and ``end_of_start`` has not yet
# resumed it.
_start_paused = False


def pause_collection_for_start() -> None:
    """Pause the cyclic collector for a process's start (``main``): the imports and the parser
    make objects that live as long as the process, which the young generations' passes would
    walk only to find them alive. Not through a command's setup: that makes cyclic garbage
    (the preflight's throw-away schedulers with their KV pools' tables) which only a pass
    frees, and moved to the oldest generation it would stay for the run."""
    global _start_paused
    gc.disable()
    _start_paused = True


def end_of_start() -> None:
    """Collection resumes if ``pause_collection_for_start`` paused it (otherwise nothing
    happens), with what the start made moved to the oldest generation (``to_oldest_generation``)."""
    global _start_paused
    if not _start_paused:
        return
    _start_paused = False
    to_oldest_generation()
    gc.enable()


def to_oldest_generation() -> None:
    """Move every object the collector tracks to the oldest generation without a pass
    (``gc.freeze`` then ``gc.unfreeze``), where the young passes would have moved what
    survived them; only full collections, rare, visit it there. A frozen heap (a caller's)
    stays frozen, and then nothing moves."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


# --model of the torch commands (generate, serve).
MODEL_HELP = "tiny-random, <shape>-random, smollm2-135m, a model directory or a .gguf file"


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def version() -> str:
    """The package's version (one source: ``radixsched.__version__``, which the build reads)."""
    from radixsched import __version__

    return __version__


def run_metadata(
    argv: Sequence[str] | None = None, *, with_platform: bool = True
) -> dict[str, Any]:
    """What was run, for the header, the JSON and the report: version, time, command.
    ``with_platform=False`` leaves out its last entry, the platform (``platform_entry``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    meta = {
        "version": version(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["radixsched", *(_quote(a) for a in args)]),
        "python": platform.python_version(),
    }
    return {**meta, **platform_entry()} if with_platform else meta


def platform_entry() -> dict[str, str]:
    """``run_metadata``'s platform entry. ``platform.platform`` runs ``uname -p`` (it imports
    the subprocess module and forks: 6 ms of a command's start), so a command that writes no
    file with its metadata never asks."""
    return {"platform": platform.platform(terse=True)}


def _quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w@%+=:,./-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


def default_threads() -> int:
    """Torch CPU threads when ``--threads`` is not given: the CPUs this process may use, less
    one for the scheduler, tokenizer and HTTP threads, between 1 and 8. torch's own default
    (every core) oversubscribes a small or shared machine: on 2 cores it ran several times
    slower than one thread."""
    return max(1, min(8, usable_cpus() - 1))


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    """``--threads`` of the torch commands."""
    p.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: the usable CPUs less one, 1 to 8: "
        f"{default_threads()} here)",
    )


def rich_console(width: int) -> Console:
    """Rich's console on stdout; ``width`` columns when stdout is not a terminal (a file or a
    pipe), so that a table never splits there. Emoji codes stay as written: ``:name:`` in a
    path or a name is text, not an emoji (and the first line printed does not import rich's
    table of emoji, 2 ms)."""
    from rich.console import Console

    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(width=None if wide else width, emoji=False)


def threads_error(threads: int | None) -> str | None:
    """Why ``--threads`` is out of range (1 .. the usable CPUs), or None: far more threads
    than CPUs crash torch's thread pool (a segfault at 99999)."""
    cpus = usable_cpus()
    if threads is None or 1 <= threads <= cpus:
        return None
    return f"--threads must be between 1 and the {cpus} CPUs this process may use, got {threads}"


def torch_device(name: str) -> torch.device:
    """``--device`` as a torch device: ``CliError`` naming the flag when torch cannot parse it
    or it is a CUDA device this machine lacks."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise CliError(f"--device {name}: expected cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CliError(f"--device {name}: no CUDA device is available")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise CliError(f"--device {name}: this machine has {count} CUDA device(s)")
    return device


def scheduler_config(args: argparse.Namespace, **overrides: Any) -> SchedulerConfig:
    """The scheduler flags as a ``SchedulerConfig``, held to the ranges simulate's flags are
    (NaN, negative counts ...): ``CliError`` naming the flag."""
    import dataclasses

    from radixsched.config import SchedulerConfig, config_from_args
    from radixsched.policies import POLICIES
    from radixsched.sim.settings.limits import LIMITS, RunConfigError, coerce

    for field in dataclasses.fields(SchedulerConfig):
        value = getattr(args, field.name, None)
        if field.name in LIMITS and value is not None:
            try:
                coerce(SchedulerConfig, field.name, value, "--" + field.name.replace("_", "-"))
            except RunConfigError as e:
                raise CliError(str(e)) from e
    try:
        config = config_from_args(SchedulerConfig, args, **overrides)
    except (TypeError, ValueError) as e:
        # SchedulerConfig's own checks name the field ("page_size must be >= 1"): add the flag.
        name = str(e).split(" ", 1)[0]
        known = any(f.name == name for f in dataclasses.fields(SchedulerConfig))
        raise CliError(f"--{name.replace('_', '-')}: {e}" if known else str(e)) from e
    # Checked before the model loads; the scheduler checks the rest of the combination.
    if config.schedule_policy not in POLICIES:
        raise CliError(
            f"unknown schedule policy {config.schedule_policy!r}; valid: {', '.join(POLICIES)}"
        )
    return config


def model_error(model: str, error: Exception) -> str:
    """A loader error as one line naming ``--model`` (and the file at fault, which the
    loader's messages start with)."""
    text = str(error).strip() or type(error).__name__
    if text.startswith(str(os.path.expanduser(model)).rstrip(os.sep) or model):
        return f"--model {text}"
    if f"model {model!r}" in text:  # "unknown model 'x': ..." names it already
        return text
    return f"--model {model}: {text}"


def scheduler_choices() -> dict[str, Any]:
    """Valid values of the scheduler flags (sequences of names), from the registries (so --help
    never goes stale). Where a package declares plugin policies they are loaded now (a broken
    one is reported before the command runs); elsewhere their scan waits for a listing or a
    name that is not built in, which a run of built-in policies never makes."""
    from radixsched.cache.evict import EVICTION_STRATEGIES
    from radixsched.policies import ENTRY_POINT_GROUP, POLICIES

    policies = list(POLICIES) if entry_points_declared(ENTRY_POINT_GROUP) else PolicyNames()
    return {"schedule_policy": policies, "radix_eviction_policy": list(EVICTION_STRATEGIES)}


def entry_points_declared(group: str) -> bool:
    """Whether an installed distribution may declare entry points of ``group``: one of the
    ``*.dist-info`` or ``*.egg-info`` folders in a folder on ``sys.path`` (where
    ``importlib.metadata`` finds distributions) has an ``entry_points.txt`` naming it. Read
    without ``importlib.metadata``, whose import and scan take about 20 ms of a command's
    start; True wherever this reading could miss one (a zip or an egg on the path, another
    finder of distributions), so that the scan decides there."""
    from importlib.machinery import PathFinder

    finders = [f for f in sys.meta_path if getattr(f, "find_distributions", None) is not None]
    if finders != [PathFinder]:
        return True
    needle = group.encode()
    for entry in sys.path:
        if not isinstance(entry, str) or entry.lower().endswith(".egg"):
            return True
        folder = entry or "."
        try:
            names = os.listdir(folder)
        except OSError:
            if os.path.exists(folder):  # a zip file: importlib.metadata reads inside it
                return True
            continue
        for name in names:
            if name.lower().endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(folder, name, "entry_points.txt"), "rb") as f:
                        if needle in f.read():
                            return True
                except OSError:  # none (or an egg-info file, which declares none)
                    continue
    return False


class PolicyNames(Sequence[str]):
    """The registered policies' names, read when asked: a parser's check of a built-in name
    finds it without the scan of the installed packages for plugin policies (the registry
    scans on the first listing or unknown name, ``policies.PolicyRegistry``); a listing (the
    help, an invalid choice's message) or another name scans first."""

    def __contains__(self, name: object) -> bool:
        from radixsched.policies import POLICIES

        return isinstance(name, str) and name in POLICIES

    def __iter__(self) -> Iterator[str]:
        from radixsched.policies import POLICIES

        return iter(POLICIES)

    def __len__(self) -> int:
        from radixsched.policies import POLICIES

        return len(POLICIES)

    def __getitem__(self, index: Any) -> Any:
        from radixsched.policies import POLICIES

        return list(POLICIES)[index]


# ---- the parser ------------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs keep their line breaks (lists of workloads and values)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=min(_terminal_width(), 100))


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 100


def _close(word: str, choices: Sequence[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


# What a value of each argparse type should be, for messages (the optional types take 'none').
_TYPE_NAMES = {
    "int": "an integer",
    "float": "a number",
    "_parse_optional_int": "an integer (or none)",
    "_parse_optional_float": "a number (or none)",
}


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that never accepts a flag's prefix for the flag
    (``--request-rat`` is an error, not ``--request-rate``) and suggests the closest flag or
    choice for a typo. Subparsers made through ``add_subparsers`` are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", Parser)
        return super().add_subparsers(**kwargs)

    def option_strings(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings if s.startswith("--")]

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """Exit with a usage error naming the unknown arguments (and the closest flags)."""
        parts = []
        for arg in extras:
            flag = arg.split("=", 1)[0]
            near = _close(flag, self.option_strings()) if flag.startswith("-") else None
            parts.append(f"{arg} (did you mean {near}?)" if near else arg)
        self.error("unrecognized arguments: " + " ".join(parts))

    def error(self, message: str) -> NoReturn:
        # argparse names a type by its function: say what the value should be instead.
        message = re.sub(
            r"invalid (\w+) value: ",
            lambda m: f"expected {_TYPE_NAMES.get(m.group(1), m.group(1))}, got ",
            message,
        )
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2)) or [
                c.strip() for c in m.group(2).split(",")
            ]
            near = _close(m.group(1), choices)
            if near:
                message += f"; did you mean {near!r}?"
        m = re.search(r"ambiguous option: (\S+) could match", message)
        if m:
            message = f"unrecognized argument {m.group(1)}: give the whole flag name"
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(parser: Parser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; unknown arguments are reported by the subcommand that got them, with
    the closest of its flags."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = getattr(args, "_parser", None)
        (sub if isinstance(sub, Parser) else parser).unrecognized(extras)
    return args


def output_errors(
    outputs: Sequence[tuple[str, str]], inputs: Sequence[tuple[str, str]]
) -> list[str]:
    """Why each ``(flag, path)`` output cannot be written: its folder, an input file it
    would overwrite (``(what, path)`` of each file the command reads), another output's file,
    or Parquet without pyarrow (``--requests-csv``)."""
    from radixsched.results.writers import is_parquet, parquet_available
    from radixsched.sim.settings.limits import check_output_path

    errors: list[str] = []
    written: list[tuple[str, str]] = []
    for flag, path in outputs:
        err = check_output_path(flag, path)
        clash = next((what for what, p in inputs if same_file(path, p)), None)
        other = next((f for f, p in written if same_file(path, p)), None)
        if err:
            errors.append(err)
        elif clash:
            errors.append(f"{flag} {path}: is {clash}; refusing to overwrite an input")
        elif other:
            errors.append(f"{flag} {path}: is also the file of {other}; give each output its own")
        elif flag == "--requests-csv" and is_parquet(path) and not parquet_available():
            errors.append(f"{flag} {path}: writing Parquet needs pyarrow (pip install pyarrow)")
        written.append((flag, path))
    return errors

"""``radixsched``: the command line's entry point. Only the command being run has its parser
built (its module imported); the others are one help line each."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from radixsched.cli.common import (
    COMMAND_HELP,
    CliError,
    Parser,
    end_of_start,
    parse_args,
    pause_collection_for_start,
    version,
)
from radixsched.cli.simulate import (
    SIMULATE_USAGE,
    _add_simulate_args,
    _simulate_epilog,
    cmd_simulate,
    import_run_modules,
)

# ---- entry point --------------------------------------------------------------------------------


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """The CLI's parser. Given the arguments, only the command they name is built in full
    (its module imported, its help computed); without them, every command is."""
    wanted = set(COMMAND_HELP) if argv is None else {_command_in(argv)}
    parser = Parser(
        prog="radixsched",
        description="Cache-aware request scheduling for LLM serving: simulate policies on your "
        "traffic, or serve a model with them.",
    )
    parser.add_argument("--version", action="version", version=f"radixsched {version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if "simulate" in wanted:
        sim = sub.add_parser(
            "simulate",
            help=COMMAND_HELP["simulate"],
            description="Replay a workload (generated, or a trace) through the scheduler on a "
            "simulated GPU and compare waiting-queue policies: hit rate, TTFT, TPOT, "
            "throughput, who starves.",
            usage=SIMULATE_USAGE,
            epilog=_simulate_epilog(),
        )
        _add_simulate_args(sim)
        sim.set_defaults(
            func=cmd_simulate, _parser=sim, _exits_now=True, _prepare=import_run_modules
        )
    else:
        sub.add_parser("simulate", help=COMMAND_HELP["simulate"])
    from radixsched.cli import commands

    commands.register(sub, wanted)
    return parser


def _command_in(argv: Sequence[str]) -> str:
    """The subcommand the arguments name: the first that is not a global flag."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names; its exit status. Without ``argv``, the program's own
    arguments: the process ends when it returns (``radixsched``, ``python -m radixsched``),
    and the objects it leaves are exempted from the collector's final passes."""
    if argv is not None:
        return _main(list(argv))
    os.environ.update(blas_thread_default(_command_in(sys.argv[1:]), os.environ))
    pause_collection_for_start()  # resumed once the arguments are parsed
    status = _main(sys.argv[1:], own_process=True)
    # Everything is written (the streams are flushed at exit, not by the collector). The
    # interpreter's shutdown would otherwise walk every object left for cycles: a run's
    # workload and replicas, about 0.1 s after a simulation of the synthetic trace. Memory goes
    # back with the process; __del__ of cyclic garbage was never promised at exit.
    gc.freeze()
    return status


# The commands whose process only simulates: numpy's work there is elementwise, never a
# product large enough for BLAS to thread.
SIMULATOR_COMMANDS = ("simulate", "sweep", "plan")
# What sets OpenBLAS's thread count, in the order it reads them.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def blas_thread_default(command: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment to add before numpy is imported (nothing imports it before ``main``):
    one OpenBLAS thread for a simulator command unless the user chose a count. OpenBLAS
    starts a thread per further core when numpy loads, and each polls for work (2**28 cycles,
    about 0.1 s) before it sleeps, though these commands never give it any: 0.04-0.09 CPU-s
    of each process (a sweep's spawned workers inherit the setting), taken from the
    simulation wherever the cores are busy. Results do not change: no call here is one that
    OpenBLAS threads (``results.stats``' dot product has one value per tenant)."""
    if command not in SIMULATOR_COMMANDS or any(v in environ for v in BLAS_THREAD_VARIABLES):
        return {}
    return {"OPENBLAS_NUM_THREADS": "1"}


def _main(argv: list[str], own_process: bool = False) -> int:
    """Run the command; ``own_process``: the process ends when this returns (``main``)."""
    parser = build_parser(argv)
    try:
        args = parse_args(parser, argv)
    except SystemExit as e:  # usage error (printed) or --help: an exit status, not a raise
        end_of_start()
        return e.code if isinstance(e.code, int) else 2
    args._argv = argv
    # What the command leaves to the process's exit, which frees nothing (``exit_now``): a
    # simulation's workload and last run, whose teardown would take 15 ms of the Mooncake
    # trace's. None where objects are freed as usual (a call, or a command that returns).
    args._left_to_exit = [] if own_process and getattr(args, "_exits_now", False) else None
    prepare = getattr(args, "_prepare", None)
    if prepare is not None:  # the command's modules, still in the start (collection paused)
        prepare()
    # Collection resumes before the command's own setup: that makes garbage cycles a young
    # pass must free (preflight's throw-away schedulers hold their KV pools' tables).
    end_of_start()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        status = int(args.func(args))
    except CliError as e:
        for line in str(e).splitlines() or ["(no message)"]:
            print(f"radixsched: error: {line}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"radixsched: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        end_of_start()
    if own_process and getattr(args, "_exits_now", False):
        exit_now(status)
    return status


def exit_now(status: int) -> None:
    """End the process with ``status`` as the interpreter's exit does (``atexit`` functions,
    then the standard streams flushed), without its teardown: freeing every object left, a
    simulation's workload and replicas among them (about 15 ms after one of the Mooncake
    trace). Every file the command wrote is closed by then. Returns, and the exit is the
    interpreter's, while another thread runs (the exit would wait for it) or when a stream
    cannot be flushed (the exit reports that)."""
    import threading

    if threading.active_count() > 1:
        return
    atexit._run_exitfuncs()  # once: they are cleared as they run
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(status)

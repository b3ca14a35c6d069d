"""Subcommands beyond ``simulate``: sweep, generate, serve, bench, calibrate. Only the command
being run has its parser built (its module imported); the others are one help line each."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from radixsched.cli.common import COMMAND_HELP

# command -> (module, function registering its parser on a subparsers object)
_BUILDERS = {
    "sweep": ("radixsched.cli.sweep", "add_sweep_parser"),
    "generate": ("radixsched.cli.generate", "add_generate_parser"),
    "serve": ("radixsched.cli.serve", "add_serve_parser"),
    "bench": ("radixsched.cli.bench", "add_bench_parser"),
    "calibrate": ("radixsched.cli.calibrate", "add_calibrate_parser"),
}


def register(sub: Any, wanted: set[str]) -> None:
    """Add every subcommand to ``sub``: those in ``wanted`` in full, the rest as help lines."""
    for name, (module, function) in _BUILDERS.items():
        if name not in wanted:
            sub.add_parser(name, help=COMMAND_HELP[name])
            continue
        parser = getattr(import_module(module), function)(sub)
        # Unknown arguments are reported by the subcommand, with its closest flags.
        parser.set_defaults(_parser=parser)

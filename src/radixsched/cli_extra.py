"""Subcommands beyond ``simulate``: sweep, generate, serve, bench, calibrate. Each module is imported only
to register its parser; heavy dependencies load when the command runs."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    from radixsched.cli_bench import add_bench_parser
    from radixsched.cli_calibrate import add_calibrate_parser
    from radixsched.cli_generate import add_generate_parser
    from radixsched.cli_serve import add_serve_parser
    from radixsched.sim.sweep import add_sweep_parser

    for add in (
        add_sweep_parser,
        add_generate_parser,
        add_serve_parser,
        add_bench_parser,
        add_calibrate_parser,
    ):
        parser = add(sub)
        # Unknown arguments are reported by the subcommand, with its closest flags.
        parser.set_defaults(_parser=parser)

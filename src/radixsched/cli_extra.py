"""Subcommands beyond ``simulate``: sweep, generate, serve, bench. Each module is imported only
to register its parser; heavy dependencies load when the command runs."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    from radixsched.sim.sweep import add_sweep_parser

    add_sweep_parser(sub)
    from radixsched.cli_generate import add_generate_parser

    add_generate_parser(sub)

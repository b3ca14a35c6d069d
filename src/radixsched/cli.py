"""Command-line entry point (filled in by the simulator, engine and server modules)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    return 0

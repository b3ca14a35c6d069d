"""Subcommands beyond ``simulate``: sweep, generate, serve, bench (each imports lazily)."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    return None

"""How numbers read in tables and text: three significant digits, units on every value, one
colour per policy."""

from __future__ import annotations

import enum
import math

# Ten clearly distinct hues (Tableau 10, its pale yellow darkened for contrast on white);
# policies take colours by their position in the result list, so table, legend and charts
# agree, and charts add a dash pattern per position so that no two series look alike.
PALETTE: tuple[str, ...] = (
    "#4E79A7",
    "#F28E2B",
    "#59A14F",
    "#E15759",
    "#B07AA1",
    "#9C755F",
    "#B6992D",
    "#76B7B2",
    "#FF9DA7",
    "#79706E",
)


def policy_color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def aligned_rows(rows: list[list[str]]) -> list[str]:
    """A plain-text table: each column as wide as its widest cell, the first column
    left-aligned, the others right-aligned, two spaces between columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


class Better(enum.Enum):
    HIGHER = "higher"
    LOWER = "lower"
    NONE = "none"  # informational, never highlighted


def _extreme(x: float) -> str | None:
    """``x`` as text when it is not finite or too small or large to write out, else None."""
    if not math.isfinite(x):
        return str(x)
    if x != 0 and not _SMALLEST_PLAIN <= abs(x) < _LARGEST_PLAIN:
        return f"{x:.2e}"
    return None


def _sig3(x: float) -> str:
    """``x`` (non-zero) with three significant digits, trailing zeros kept (``28.0``, ``655``,
    ``0.0500``); from 1,000 up, whole numbers with a thousands separator; scientific notation
    below 0.001 and from 1e9 up."""
    if (extreme := _extreme(x)) is not None:
        return extreme
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    text = f"{x:.{decimals}f}"
    if decimals > 0 and abs(float(text)) >= 10.0 ** (3 - decimals):
        text = f"{x:.{decimals - 1}f}"  # rounding reached the next decade (9.996 -> 10.0)
    elif decimals == 0 and abs(float(text)) >= 1000:
        text = f"{x:,.0f}"
    return text


def fmt_seconds(x: float) -> str:
    """Duration with a readable unit and three significant digits (whole seconds with a
    thousands separator from 1,000 s): ``28.0 s``, ``655 s``, ``1,617 s``, ``12.3 ms``."""
    if x == 0:
        return "0"
    if not math.isfinite(x) or not 1e-7 <= abs(x) < _LARGEST_PLAIN:
        return f"{_extreme(x) or x} s"
    for scale, unit in ((1e-6, "µs"), (1e-3, "ms"), (1.0, "s")):
        text = _sig3(x / scale)
        if "," not in text and (unit == "s" or abs(x) < scale * 1000) and abs(float(text)) < 1000:
            return f"{text} {unit}"
    return f"{x:,.0f} s"


def fmt_rate(x: float) -> str:
    return "0" if x == 0 else _sig3(x)


def fmt_percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def fmt_points(x: float) -> str:
    """A hit-rate gap in percentage points."""
    return f"{100 * x:.1f} pp"


def fmt_int(x: float) -> str:
    if not math.isfinite(x) or abs(x) >= _LARGEST_PLAIN:
        return _extreme(x) or str(x)
    return f"{round(x):,}"


def fmt_fraction(x: float) -> str:
    return f"{x:.3f}"


# Beyond these magnitudes numbers are written in scientific notation (``1.00e+12``), so that
# no value of an extreme run (a rate of 1e-300, a latency of 1e300 s) takes a screenful.
_SMALLEST_PLAIN, _LARGEST_PLAIN = 1e-3, 1e9

"""Remake the two pictures in docs/img/ from a real run (they are checked in, small):

- ``simulate-table.svg``: the terminal's policy table of Getting started's first simulation,
  rendered from the command's colored output by rich (no browser needed);
- ``report.png``: the top of that run's HTML report, rendered by headless Chromium.

Usage: ``python dev/docs_screenshots.py`` from the repository root (Chromium on PATH as
``chromium``; without it only the SVG is remade).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.text import Text

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
COMMAND = [
    "simulate",
    "--workload",
    "shared-prefix:groups=32,prompts=8,system_len=2048",
    "--request-rate",
    "16",
    "--max-total-tokens",
    "40000",
    "--policy",
    "fcfs,lpm,hrrn",
]


def run(out_dir: Path) -> str:
    """The command's colored stdout; its report is written to ``out_dir/report.html``."""
    env = {**os.environ, "FORCE_COLOR": "1", "COLUMNS": "100", "PYTHONPATH": str(ROOT / "src")}
    args = [sys.executable, "-m", "radixsched", *COMMAND, "--report", str(out_dir / "report.html")]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=True)
    return done.stdout


def table_svg(stdout: str) -> str:
    """The table, from its title to its legend, as rich renders a terminal."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "Policy comparison" in line)
    end = next(i for i in range(start, len(lines)) if "failed = rejected" in lines[i])
    console = Console(record=True, width=100, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(Text.from_ansi("\n".join(lines[start : end + 1])))
    return console.export_svg(title="radixsched simulate")


def report_png(html: Path, png: Path) -> bool:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("no chromium on PATH: report.png not remade", file=sys.stderr)
        return False
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={png}", "--window-size=1000,760", html.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    return True


def main() -> int:
    IMG.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        stdout = run(Path(tmp))
        (IMG / "simulate-table.svg").write_text(table_svg(stdout))
        print(f"wrote {IMG / 'simulate-table.svg'}")
        if report_png(Path(tmp) / "report.html", IMG / "report.png"):
            print(f"wrote {IMG / 'report.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

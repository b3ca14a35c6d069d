"""Every command the docs show runs, so the docs cannot rot.

A page's (and the README's) ```bash and ```python blocks are run in order, in one scratch folder per page (a block
may use what an earlier one wrote), with ``radixsched`` and ``python`` on PATH meaning this
interpreter and this checkout. Each block is marked on the line before it:

- ``<!-- runs-in-ci -->``: small; runs in every ``make test``;
- ``<!-- runs-long -->``: a server, a long sweep, an install; runs with the CI blocks under
  ``make docs-commands`` (``RADIXSCHED_DOCS_LONG=1``);
- ``<!-- not-run: REASON -->``: changes the reader's environment (installing, activating).

An unmarked block fails the test. ``RADIXSCHED_DOCS_CAPTURE=DIR`` writes each block's output to
``DIR/<page>-<n>.txt`` (to paste real output under a command).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LONG = os.environ.get("RADIXSCHED_DOCS_LONG") == "1"
CAPTURE = os.environ.get("RADIXSCHED_DOCS_CAPTURE")
FULL_TRACE = Path(
    os.environ.get("RADIXSCHED_MOONCAKE_TRACE", "/work/shared/data/mooncake/synthetic_trace.jsonl")
)
MARK = re.compile(r"^<!--\s*(runs-in-ci|runs-long|not-run)\s*(?::\s*(.*?))?\s*-->$")
RUN_LANGS = ("bash", "python")
CI_TIMEOUT_S = 120
LONG_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mode: str | None  # runs-in-ci, runs-long, not-run; None: unmarked
    reason: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse(page: Path) -> list[Block]:
    """The fenced code blocks of ``page`` in a language that is run, with their marks."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if not fence.startswith("```"):
            i += 1
            continue
        lang = fence[3:].strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
        if lang in RUN_LANGS:
            mark = _mark_before(lines, i)
            mode, reason = (mark.group(1), mark.group(2) or "") if mark else (None, "")
            code = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(page, i + 1, lang, code, mode, reason))
        i = end + 1
    return found


def _mark_before(lines: list[str], fence: int) -> re.Match[str] | None:
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    return MARK.match(lines[j].strip()) if j >= 0 else None


def pages() -> list[Path]:
    """The README and every page of the site."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in parse(p)]


# ---- the marks -----------------------------------------------------------------------------------


def test_parse_reads_marks_and_languages(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- runs-in-ci -->\n```bash\necho a\n```\n\n```text\nout\n```\n"
        "<!-- not-run: installs -->\n\n```python\nprint(1)\n```\n```bash\nls\n```\n"
    )
    got = [(b.lang, b.mode, b.reason, b.code, b.line) for b in parse(page)]
    assert got == [
        ("bash", "runs-in-ci", "", "echo a\n", 2),
        ("python", "not-run", "installs", "print(1)\n", 11),
        ("bash", None, "", "ls\n", 14),
    ]


def test_every_command_block_is_marked() -> None:
    blocks = all_blocks()
    assert len(blocks) >= 20, "the guides' commands were not found"
    unmarked = [b.where for b in blocks if b.mode is None]
    assert not unmarked, f"mark each with runs-in-ci, runs-long or not-run: REASON: {unmarked}"
    unexplained = [b.where for b in blocks if b.mode == "not-run" and not b.reason]
    assert not unexplained, f"a not-run block says why: {unexplained}"
    guides = [b for b in blocks if b.page.parent.name == "guides"]
    assert all(b.mode != "not-run" for b in guides), "every guide's command runs"


def test_no_output_left_to_fill() -> None:
    left = [str(p.relative_to(ROOT)) for p in pages() if "OUTPUT:" in p.read_text()]
    assert not left, f"an output placeholder is left in {left}"


def test_readme_links_exist() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link and not link.startswith("mailto:")]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


# ---- running them --------------------------------------------------------------------------------


def _bin(tmp: Path) -> Path:
    """``radixsched`` and ``python`` meaning this interpreter, which imports this checkout (an
    editable install, or PYTHONPATH=src: the environment is inherited)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, args in (("radixsched", "-m radixsched "), ("python", "")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args}"$@"\n')
        script.chmod(0o755)
    return bin_dir


def _workdir(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    for name in ("examples", "tests"):
        (work / name).symlink_to(ROOT / name)
    if LONG and FULL_TRACE.is_file():
        (work / FULL_TRACE.name).symlink_to(FULL_TRACE)
    return work


def _env(tmp: Path, bin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"
    env.pop("FORCE_COLOR", None)
    if not LONG:  # CI: no trace prompts kept in the user's cache (the long run keeps SmolLM2's)
        env["RADIXSCHED_CACHE_DIR"] = str(tmp / "cache")
    return env


def run_page(page: Path, modes: set[str], tmp: Path) -> None:
    import radixsched

    here = Path(radixsched.__file__).resolve()
    assert here.is_relative_to(ROOT / "src"), f"the commands would run {here}, not this checkout"
    blocks = [b for b in parse(page) if b.mode in modes]
    work, env = _workdir(tmp), _env(tmp, _bin(tmp))
    timeout = LONG_TIMEOUT_S if "runs-long" in modes else CI_TIMEOUT_S
    for n, block in enumerate(blocks):
        if block.lang == "python":
            script = work / f"block_{n}.py"
            script.write_text(block.code)
            args = [sys.executable, str(script)]
        else:
            args = ["bash", "-eo", "pipefail", "-c", block.code]
        done = subprocess.run(
            args, cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
        output = done.stdout + done.stderr
        if CAPTURE:
            stem = page.relative_to(ROOT).with_suffix("").as_posix().replace("/", "-")
            Path(CAPTURE).mkdir(parents=True, exist_ok=True)
            (Path(CAPTURE) / f"{stem}-{n}.txt").write_text(output)
        assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{output[-3000:]}"


def _pages_with(mode: str) -> list[Path]:
    return [p for p in pages() if any(b.mode == mode for b in parse(p))]


@pytest.mark.parametrize("page", _pages_with("runs-in-ci"), ids=lambda p: p.stem)
def test_ci_commands_run(page: Path, tmp_path: Path) -> None:
    run_page(page, {"runs-in-ci"}, tmp_path)


@pytest.mark.skipif(not LONG, reason="long commands: make docs-commands (RADIXSCHED_DOCS_LONG=1)")
@pytest.mark.parametrize("page", _pages_with("runs-long"), ids=lambda p: p.stem)
def test_long_commands_run(page: Path, tmp_path: Path) -> None:
    run_page(page, {"runs-in-ci", "runs-long"}, tmp_path)


# ---- the generated reference -----------------------------------------------------------------------


def _reference() -> Any:
    """dev/docs_reference.py, the mkdocs hook that renders the Reference pages."""
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "dev" / "docs_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_covers_every_command_flag_key_and_registry_entry() -> None:
    from radixsched.cli.main import build_parser
    from radixsched.policies import POLICIES
    from radixsched.sim.cost.roofline import CONSTANTS
    from radixsched.sim.settings.runconfig import known_keys

    ref = _reference()
    cli, config, registries = ref.render_cli(), ref.render_config(), ref.render_registries()
    commands = ref._subparsers(build_parser())
    assert set(commands) >= {"simulate", "sweep", "generate", "serve", "bench", "calibrate"}
    for name, parser in commands.items():
        assert f"\n## {name}\n" in cli
        flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
        missing = [f for f in flags if f not in cli]
        assert not missing, f"{name}: flags missing from the CLI reference: {missing}"
    assert all(f"| `{key}` |" in config for key in known_keys(cli=True))
    assert all(f"| `{name}` |" in registries for name in POLICIES)
    assert all(f"`{name}`" in ref.render_cost_model() for name in CONSTANTS)


def test_reference_lists_every_endpoint_and_metric() -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("prometheus_client")
    ref = _reference()
    schema = ref.openapi_schema()
    http = ref.render_http(schema)
    assert {"/v1/completions", "/v1/chat/completions", "/generate", "/metrics"} <= set(
        schema["paths"]
    )
    assert all(f"`{path}`" in http for path in schema["paths"])
    metrics = ref.render_metrics()
    assert "`radixsched_time_to_first_token_seconds`" in metrics
    assert "`radixsched_prompt_tokens_total`" in metrics

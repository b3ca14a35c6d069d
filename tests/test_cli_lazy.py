"""The CLI builds only the parser of the command being run: ``simulate`` never imports the
server, the engine or the sweep, and every command's help still lists all commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixsched.cli.common import COMMAND_HELP
from radixsched.cli.main import build_parser, main


def _modules_after(argv: list[str]) -> set[str]:
    code = (
        "import sys\nfrom radixsched.cli.main import build_parser\n"
        f"build_parser({argv!r})\nprint('\\n'.join(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_simulate_imports_no_other_command() -> None:
    mods = _modules_after(["simulate", "--policy", "lpm"])
    assert "radixsched.sim.workloads.spec" in mods  # its own epilog was built
    for other in ("radixsched.client.bench", "radixsched.sim.sweep.config", "radixsched.cli.serve"):
        assert other not in mods, other
    assert "torch" not in mods and "fastapi" not in mods


def test_serve_does_not_build_simulate() -> None:
    mods = _modules_after(["serve", "--model", "tiny-random"])
    assert "radixsched.cli.serve" in mods
    assert "radixsched.sim.workloads.load" not in mods and "radixsched.sim.sweep.config" not in mods


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, line in COMMAND_HELP.items():
        assert name in out and line[:30] in out


@pytest.mark.parametrize("command", sorted(COMMAND_HELP))
def test_each_command_parses_as_in_the_full_parser(command: str) -> None:
    lazy = build_parser([command])._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    full = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(lazy) == list(full) == list(COMMAND_HELP)
    assert lazy[command].format_help() == full[command].format_help()


def test_unknown_command_is_a_usage_error_with_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulat"]) == 2
    assert "simulate" in capsys.readouterr().err


SAMPLE = Path(__file__).parent / "data" / "mooncake_sample.jsonl"


def test_a_simulate_run_imports_only_what_it_uses(tmp_path: Path) -> None:
    # The whole command on a plain trace: no gzip (a .gz trace's), no difflib (a typo's
    # suggestion), nothing of the other commands.
    code = (
        "import sys\nfrom radixsched.cli.main import main\n"
        f"rc = main(['simulate', '--workload', 'mooncake:{SAMPLE}', '--policy', 'lpm', "
        "'--num-requests', '20', '--quiet'])\n"
        "print('\\n'.join(['rc=%d' % rc, *sys.modules]))"
    )
    env = {**os.environ, "RADIXSCHED_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    mods = set(out.stdout.split())
    assert "rc=0" in mods
    assert "radixsched.sim.workloads.traces" in mods  # the trace was read
    for unused in ("gzip", "difflib", "radixsched.cli.serve", "radixsched.sim.sweep.config"):
        assert unused not in mods, unused
    assert "torch" not in mods


def test_a_quiet_run_of_mapped_prompts_imports_no_display_plan_or_writer(tmp_path: Path) -> None:
    # Deferred imports (a run's start): the progress bars (--quiet shows none), the plan's
    # search space (simulate's --gpu type lives with the presets), the calibrated table and
    # its file readers (no --calibration), the prompt cache's writing (the second run maps
    # the file the first stored), the worker pool's modules (one policy runs here) and the
    # platform's ``uname -p`` (no --json to record it in).
    code = (
        "import sys\nfrom radixsched.cli.main import main\n"
        f"rc = main(['simulate', '--workload', 'mooncake:{SAMPLE}', '--policy', 'lpm', "
        "'--quiet'])\n"
        "print('\\n'.join(['rc=%d' % rc, *sys.modules]))"
    )
    env = {**os.environ, "RADIXSCHED_CACHE_DIR": str(tmp_path), "RADIXSCHED_PROMPT_CACHE": "on"}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        for _ in range(2)
    ]
    stored, mapped = (set(run.stdout.split()) for run in runs)
    assert "rc=0" in stored and "rc=0" in mapped and "rich.console" in mapped  # the table
    assert "shutil" in stored and "shutil" not in mapped  # written, then mapped
    deferred = (
        "rich.progress", "radixsched.sim.plan.space", "radixsched.sim.cost.table",
        "radixsched.sim.cost.calibration_file", "queue", "multiprocessing", "subprocess",
    )  # fmt: skip
    for name in deferred:
        assert name not in mapped, name


def test_the_gpu_flag_s_type_is_the_presets_spelling() -> None:
    from radixsched.sim.cost.hardware import gpu_name
    from radixsched.sim.plan import space

    assert space.gpu_name is gpu_name  # one definition, which the plan reuses
    assert gpu_name("h200") == "H200" and gpu_name("a100") == "A100-80G"
    assert gpu_name("no-such-gpu") == "no-such-gpu"  # the checks report it


def test_the_program_leaves_its_objects_to_the_exit_and_a_call_does_not() -> None:
    # As the program (no argv: radixsched, python -m radixsched) the heap is frozen at the end,
    # so the interpreter's shutdown does not walk it for cycles; a call with argv (a test, a
    # caller's process that goes on) leaves the collector as it was.
    code = (
        "import gc, sys\nfrom radixsched.cli.main import main\n"
        "assert main(['--version']) == 0 and gc.get_freeze_count() == 0\n"
        "sys.argv = ['radixsched', 'simulat']\n"
        "rc = main()\n"
        "print(rc, gc.get_freeze_count() > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["2", "True"]  # after --version's line


def test_the_program_exits_without_a_leak_report(tmp_path: Path) -> None:
    # The frozen heap's native trees and pools outlive the teardown by design: nanobind's
    # count of instances alive at exit (on stderr, every run) is switched off. The second run
    # maps the prompts the first cached (a run whose objects the teardown then leaves).
    env = {**os.environ, "RADIXSCHED_CACHE_DIR": str(tmp_path)}
    env.pop("RADIXSCHED_PROMPT_CACHE", None)  # the tests' default is off
    cmd = [sys.executable, "-m", "radixsched", "simulate", "--workload", f"mooncake:{SAMPLE}"]
    for _ in range(2):
        out = subprocess.run(
            [*cmd, "--policy", "lpm", "--quiet"], capture_output=True, text=True, env=env
        )
        assert out.returncode == 0, out.stderr
        assert "leaked" not in out.stderr

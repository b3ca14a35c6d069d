"""The command's start: what it imports and scans before a built-in run (no plugin scan, no
process pool, numpy after the BLAS default is set), the plugin pre-check, the parser's lazy
policy names, and the collector paused for the start."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from radixsched.cli.common import (
    PolicyNames,
    end_of_start,
    entry_points_declared,
    pause_collection_for_start,
)
from radixsched.cli.main import BLAS_THREAD_VARIABLES, blas_thread_default, main
from radixsched.policies import ENTRY_POINT_GROUP, POLICIES

SAMPLE = Path(__file__).parent / "data" / "mooncake_sample.jsonl"
# The environment's own packages declare no policy plugin (else a built-in run scans them).
no_plugins = pytest.mark.skipif(
    entry_points_declared(ENTRY_POINT_GROUP), reason="a policy plugin is installed here"
)


def _run(code: str, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return out.stdout.split()


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}
    return {**env, **extra}


# ---- imports ------------------------------------------------------------------------------


def test_the_entry_point_imports_no_numpy_before_main_runs() -> None:
    # main() sets the BLAS default before anything imports numpy: importing it must not.
    code = "import sys\nimport radixsched.cli.main\nprint('numpy' in sys.modules)"
    assert _run(code) == ["False"]


@no_plugins
def test_a_built_in_run_scans_no_packages_and_starts_no_pool(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom radixsched.cli.main import main\n"
        f"rc = main(['simulate', '--workload', 'mooncake:{SAMPLE}', '--policy', 'fcfs,lpm', "
        "'--num-requests', '20', '--quiet', '--jobs', '1'])\n"
        "mods = ('importlib.metadata', 'multiprocessing', 'concurrent.futures')\n"
        "print(rc, *[m in sys.modules for m in mods])"
    )
    env = {**os.environ, "RADIXSCHED_CACHE_DIR": str(tmp_path)}
    assert _run(code, env)[-4:] == ["0", "False", "False", "False"]


# ---- one BLAS thread ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["simulate", "sweep", "plan"])
def test_a_simulator_command_gets_one_blas_thread(command: str) -> None:
    assert blas_thread_default(command, {}) == {"OPENBLAS_NUM_THREADS": "1"}


@pytest.mark.parametrize("command", ["serve", "generate", "calibrate", "bench", ""])
def test_other_commands_keep_the_library_default(command: str) -> None:
    assert blas_thread_default(command, {}) == {}


@pytest.mark.parametrize("name", BLAS_THREAD_VARIABLES)
def test_a_thread_count_the_user_set_is_kept(name: str) -> None:
    assert blas_thread_default("simulate", {name: "4"}) == {}


def test_the_program_sets_it_before_numpy_loads() -> None:
    code = (
        "import os, sys\nfrom radixsched.cli.main import main\n"
        "sys.argv = ['radixsched', 'simulate', '--help']\n"
        "rc = main()\n"
        "print(rc, os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))"
    )
    assert _run(code, _clean_env())[-3:] == ["0", "1", "None"]
    assert _run(code, _clean_env(OMP_NUM_THREADS="3"))[-3:] == ["0", "None", "3"]


# ---- the plugin pre-check -------------------------------------------------------------------


def _dist(folder: Path, name: str, entry_points: str | None) -> None:
    info = folder / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)


def test_a_declared_group_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _dist(tmp_path, "other", "[console_scripts]\nother = other:main\n")
    _dist(tmp_path, "bare", None)
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "missing")])
    assert not entry_points_declared(ENTRY_POINT_GROUP)
    assert entry_points_declared("console_scripts")
    _dist(tmp_path, "plug", f"[{ENTRY_POINT_GROUP}]\nplug = plug\n")
    assert entry_points_declared(ENTRY_POINT_GROUP)


def test_what_it_cannot_read_is_left_to_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("x-1.0.dist-info/METADATA", "Name: x\n")
    monkeypatch.setattr(sys, "path", [str(archive)])
    assert entry_points_declared(ENTRY_POINT_GROUP)  # a zip: importlib.metadata reads inside
    monkeypatch.setattr(sys, "path", [str(tmp_path / "x.egg")])
    assert entry_points_declared(ENTRY_POINT_GROUP)

    class Finder:
        @staticmethod
        def find_distributions(*args: object) -> list[object]:
            return []

    monkeypatch.setattr(sys, "path", [])
    assert not entry_points_declared(ENTRY_POINT_GROUP)
    monkeypatch.setattr(sys, "meta_path", [Finder, *sys.meta_path])
    assert entry_points_declared(ENTRY_POINT_GROUP)  # another finder of distributions


# ---- the parser's policy names ----------------------------------------------------------------


def test_policy_names_are_the_registry_s() -> None:
    names = PolicyNames()
    assert "lpm" in names and "no-such-policy" not in names and 3 not in names
    assert list(names) == list(POLICIES) and len(names) == len(POLICIES)
    assert names[0] == next(iter(POLICIES)) and ", ".join(names) == ", ".join(POLICIES)


def test_an_unknown_policy_s_error_lists_them_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--schedule-policy", "lmp"]) == 2
    err = capsys.readouterr().err
    assert ", ".join(repr(n) for n in POLICIES) in err and "did you mean 'lpm'?" in err


# ---- the collector at the start -------------------------------------------------------------


def test_the_start_s_objects_go_to_the_oldest_generation() -> None:
    was = gc.isenabled()
    try:
        pause_collection_for_start()
        assert not gc.isenabled()
        made = [[i] for i in range(2000)]  # young objects, no pass over them
        end_of_start()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        assert gc.get_count()[0] < 100 and made  # nothing young left for a pass
        gc.disable()
        end_of_start()  # once only: a second call (or one with nothing paused) changes nothing
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_a_call_with_arguments_leaves_the_collector_alone(tmp_path: Path) -> None:
    was = gc.isenabled()
    gc.disable()
    try:
        assert main(["simulate", "--workload", f"mooncake:{SAMPLE}", "--policy", "lpm",
                     "--num-requests", "5", "--quiet"]) == 0  # fmt: skip
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_the_command_s_setup_runs_with_the_collector_on() -> None:
    # The setup makes cyclic garbage that holds large arrays (the preflight's throw-away
    # schedulers and their KV pools' tables): paused through it, a run with a 1e8-token pool
    # peaked at 4.0 GB instead of 2.4 GB.
    code = (
        "import gc, sys\nimport radixsched.cli.main as m\n"
        "def cmd(args):\n    print('enabled', gc.isenabled(), flush=True)\n    return 0\n"
        "m.cmd_simulate = cmd\nsys.argv = ['radixsched', 'simulate']\nm.main()\n"
    )
    assert _run(code) == ["enabled", "True"]


def _simulate_sample(patch: str, tmp: Path) -> list[str]:
    """``patch`` (code run first), then simulate as the program does on the sample trace."""
    code = (
        f"import gc, os, sys, weakref\n{patch}\nimport radixsched.cli.main as m\n"
        f"sys.argv = ['radixsched', 'simulate', '--workload', 'mooncake:{SAMPLE}', "
        "'--policy', 'lpm', '--num-requests', '20', '--quiet']\nm.main()\n"
    )
    return _run(code, env={**os.environ, "RADIXSCHED_CACHE_DIR": str(tmp)})


def test_the_preflight_runs_with_the_collector_on_and_its_garbage_goes_before_the_load(
    tmp_path: Path,
) -> None:
    # A garbage cycle made at the preflight's very end (as its throw-away schedulers are) is
    # freed before the load starts, not moved with the load's objects to the oldest generation.
    patch = (
        "import radixsched.sim.preflight as pf, radixsched.sim.workloads.load as ld\n"
        "real_check, real_load, seen = pf.check, ld.load_workload, {}\n"
        "class Cycle:\n    pass\n"
        "def check(*a, **k):\n    print('preflight', gc.isenabled())\n"
        "    c = Cycle(); c.me = c; seen['c'] = weakref.ref(c)\n    return real_check(*a, **k)\n"
        "def load(*a, **k):\n    print('freed', seen['c']() is None)\n"
        "    return real_load(*a, **k)\n"
        "pf.check, ld.load_workload = check, load"
    )
    assert _simulate_sample(patch, tmp_path)[:4] == ["preflight", "True", "freed", "True"]


def test_the_load_s_objects_are_frozen_for_the_command_then_go_to_the_oldest_generation(
    tmp_path: Path,
) -> None:
    # Frozen through the runs (in no generation a pass walks: no run's frozen heap collects
    # them all), thawed into the oldest generation when the command ends, however it ends.
    patch = (
        "import radixsched.sim.policy_runs as pr, radixsched.cli.main as cm\n"
        "real_run, real_exit, seen = pr.run_policies, cm.exit_now, []\n"
        "def run(runs, *a, **k):\n"
        "    seen.append(runs.workload.requests[0])\n"
        "    print('walked', any(o is seen[0] for o in gc.get_objects()), gc.isenabled())\n"
        "    return real_run(runs, *a, **k)\n"
        "def exit_now(status):\n"
        "    print('oldest', gc.get_freeze_count() == 0,\n"
        "          any(o is seen[0] for o in gc.get_objects(2)), flush=True)\n"
        "    real_exit(status)\n"
        "pr.run_policies, cm.exit_now = run, exit_now"
    )
    out = _simulate_sample(patch, tmp_path)
    walked, oldest = out.index("walked"), out.index("oldest")
    assert out[walked : walked + 3] == ["walked", "False", "True"]
    assert out[oldest:] == ["oldest", "True", "True"]


def test_a_call_leaves_the_load_s_objects_young(monkeypatch: pytest.MonkeyPatch) -> None:
    # main(argv): the collector's generations are the caller's (paused here: no pass moves
    # anything meanwhile).
    from radixsched.sim import policy_runs

    seen: dict[str, bool] = {}

    def run(runs: Any, *args: Any, **kwargs: Any) -> Any:
        req = runs.workload.requests[0]
        seen["oldest"] = any(o is req for o in gc.get_objects(2))
        seen["young"] = any(o is req for o in gc.get_objects(0))  # not frozen either
        raise KeyboardInterrupt  # the command stops here: status 130

    monkeypatch.setattr(policy_runs, "run_policies", run)
    was = gc.isenabled()
    gc.disable()
    try:
        assert main(["simulate", "--workload", f"mooncake:{SAMPLE}", "--policy", "lpm",
                     "--num-requests", "5", "--quiet"]) == 130  # fmt: skip
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == {"oldest": False, "young": True}


def test_the_run_s_modules_are_ones_a_run_imports_anyway(tmp_path: Path) -> None:
    # Imported in the start (``import_run_modules``), each would be imported by the run: the
    # start adds none that a run of built-in policies does without.
    from radixsched.cli.simulate import RUN_MODULES

    patch = "import radixsched.cli.simulate as s\nwanted, s.RUN_MODULES = s.RUN_MODULES, ()\n"
    patch += "import atexit\natexit.register(lambda: print(*(w in sys.modules for w in wanted)))"
    assert _simulate_sample(patch, tmp_path)[-len(RUN_MODULES) :] == ["True"] * len(RUN_MODULES)


def _script_start() -> str:
    """The ``radixsched`` script's start as pip writes it: its entry point imported, called."""
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    module, func = re.findall(r'^radixsched = "([\w.]+):(\w+)"$', text, re.MULTILINE)[0]
    return f"from {module} import {func} as run\n    sys.exit(run())"


@pytest.mark.parametrize(
    "start",
    ["runpy.run_module('radixsched', run_name='__main__')", _script_start()],
    ids=["python -m radixsched", "radixsched"],
)
def test_the_program_s_imports_run_with_the_collector_paused(start: str) -> None:
    # No pass walks the start's imports, the CLI's and what it imports (the collector runs
    # again once the arguments are parsed). A pass before them (the interpreter's own start,
    # the package's ``__init__``, an editable install's import hook) is the environment's.
    code = (
        "import gc, runpy, sys\npasses = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start'\n"
        "                    and 'radixsched.cli' in sys.modules and passes.append(info))\n"
        f"sys.argv = ['radixsched', '--version']\ntry:\n    {start}\n"
        "except SystemExit:\n    pass\nprint(len(passes), gc.isenabled())\n"
    )
    assert _run(code)[-2:] == ["0", "True"]


# ---- the exit -----------------------------------------------------------------------------


def test_exit_now_runs_the_exit_functions_and_flushes() -> None:
    code = (
        "import atexit, sys\nfrom radixsched.cli.main import exit_now\n"
        "atexit.register(print, 'at exit')\n"
        "sys.stdout.write('buffered ')\nsys.stderr.write('err')\n"
        "exit_now(3)\nprint('not reached')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (out.returncode, out.stdout, out.stderr) == (3, "buffered at exit\n", "err")


def test_exit_now_leaves_a_running_thread_to_the_interpreter_s_exit() -> None:
    code = (
        "import threading, time\nfrom radixsched.cli.main import exit_now\n"
        "t = threading.Thread(target=lambda: (time.sleep(0.2), print('thread done')))\n"
        "t.start()\nexit_now(3)\nprint('returned')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split("\n")[:2] == ["returned", "thread done"]


def test_a_simulation_s_outputs_are_complete_at_the_quick_exit(tmp_path: Path) -> None:
    env = {**os.environ, "RADIXSCHED_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "radixsched", "simulate", "--workload", f"mooncake:{SAMPLE}",
         "--policy", "fcfs,lpm", "--jobs", "2", "--quiet", "--json", str(tmp_path / "r.json"),
         "--csv", str(tmp_path / "r.csv")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith(f"wrote {tmp_path / 'r.csv'}")
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 3
    assert (tmp_path / "r.json").read_text().rstrip().endswith("}")


@pytest.mark.parametrize("own_process", [True, False])
def test_a_simulation_leaves_its_objects_to_the_program_s_exit(
    own_process: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # As the program (its exit frees nothing) the workload and the last run stay referenced
    # until the exit; a call frees them as usual.
    import radixsched.cli.main as cli_main
    from radixsched.sim import policy_runs

    seen: dict[str, Any] = {}
    real = policy_runs.run_policies

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        seen["left"] = kwargs.get("left")
        return out

    monkeypatch.setattr(policy_runs, "run_policies", spy)
    monkeypatch.setattr(cli_main, "exit_now", lambda status: seen.setdefault("exit", status))
    argv = ["simulate", "--workload", f"mooncake:{SAMPLE}", "--policy", "fcfs,lpm", "--jobs",
            "1", "--quiet", "--num-requests", "8", "--json", str(tmp_path / "r.json")]  # fmt: skip
    assert cli_main._main(argv, own_process=own_process) == 0
    left = seen["left"]
    if not own_process:
        assert left is None and "exit" not in seen
        return
    assert seen["exit"] == 0
    assert [type(o).__name__ for o in left] == ["PolicyRuns", "SimRun"]
    assert left[1].result.policy == "lpm"  # the last run only


def test_the_collector_runs_again_after_a_usage_error() -> None:
    code = (
        "import gc, sys\nfrom radixsched.cli.main import main\n"
        "sys.argv = ['radixsched', 'simulate', '--no-such-flag']\n"
        "rc = main()\nprint(rc, gc.isenabled())\n"
    )
    assert _run(code)[-2:] == ["2", "True"]

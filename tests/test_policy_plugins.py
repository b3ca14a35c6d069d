"""Policies from other packages: the ``radixsched.policies`` entry points.

The example package (``examples/custom_policy``) is made importable with its distribution
metadata in a temporary directory on ``PYTHONPATH`` (what ``pip install`` leaves behind, without
installing into the test's environment), and the CLI is run as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "custom_policy" / "src" / "radixsched_example_policy"
WORKLOAD = "shared-prefix:groups=4,prompts=4,system_len=256,question_len=32,output_len=8"


def _site(tmp: Path, module: str, source: str | None = None) -> dict[str, str]:
    """A directory with ``module`` and a dist-info declaring it as a policy entry point."""
    if source is None:
        shutil.copytree(EXAMPLE, tmp / module)
    else:
        (tmp / f"{module}.py").write_text(source)
    info = tmp / f"{module}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[radixsched.policies]\nplugin = {module}\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), env.get("PYTHONPATH", "")])
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "radixsched", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _site(tmp_path_factory.mktemp("site"), "radixsched_example_policy")


def test_an_installed_policy_is_a_simulate_choice(
    plugin_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    proc = _cli(plugin_env, "simulate", "--workload", WORKLOAD, "--request-rate", "20",
                "--policy", "fcfs,cache-then-short,shortest-output-first", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert [r["policy"] for r in doc["results"]] == [
        "fcfs",
        "cache-then-short",
        "shortest-output-first",
    ]
    assert all(r["num_requests"] == 16 for r in doc["results"])


def test_sweep_and_serve_see_it(plugin_env: dict[str, str], tmp_path: Path) -> None:
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(
        f'name: plugin\nbase:\n  workload: "{WORKLOAD}"\n  request_rate: 20\n'
        "vary:\n  schedule_policy: [cache-then-short, fcfs]\nmetrics: [hit_rate]\n"
    )
    proc = _cli(plugin_env, "sweep", str(cfg), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "cache-then-short" in proc.stdout + proc.stderr
    serve = _cli(plugin_env, "serve", "--help")
    assert serve.returncode == 0 and "cache-then-short" in serve.stdout


def test_a_match_reading_plugin_gets_the_kept_order(plugin_env: dict[str, str]) -> None:
    from radixsched.native import core

    if core() is None:
        pytest.skip("the accelerated queue runs over the native tree, which is not built or off")
    code = (
        "from radixsched.native.radix import NativeRadixCache\n"
        "from radixsched.config import SchedulerConfig\n"
        "from radixsched.native.orders import KeyedEngine\n"
        "from radixsched.native.queue import NativeWaitingQueue\n"
        "cfg = SchedulerConfig(schedule_policy='cache-then-short')\n"
        "q = NativeWaitingQueue(cfg, NativeRadixCache(None))\n"
        "assert isinstance(q.engine, KeyedEngine) and q.matcher is not None\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=plugin_env, timeout=60)  # fmt: skip
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_a_broken_plugin_is_reported_and_the_builtins_still_work(tmp_path: Path) -> None:
    env = _site(tmp_path, "broken_policy_plugin", "raise ImportError('no such thing')\n")
    proc = _cli(env, "simulate", "--workload", WORKLOAD, "--policy", "lpm", "--request-rate", "20")
    assert proc.returncode == 0, proc.stderr
    assert "broken_policy_plugin" in proc.stderr and "no such thing" in proc.stderr


def test_register_refuses_a_duplicate_name() -> None:
    from radixsched.policies import Policy, register

    with pytest.raises(ValueError, match="already registered"):
        register(Policy("lpm", "again", key=lambda r, rnd: ()))
    with pytest.raises(ValueError, match="exactly one of"):
        register(Policy("neither", "no key, no order"))

"""Bad inputs of ``sweep``, ``bench`` and ``generate``: one error line naming the flag, file or
key, exit status 2, nothing run and nothing overwritten; never a traceback, a hang or a
silently wrong run."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from radixsched.cli import sweep
from radixsched.sim.sweep.config import SweepConfig, SweepError, validate_points
from radixsched.sim.sweep.result import run_sweep

WORKLOAD = "shared-prefix:groups=2,prompts=2,system_len=32,question_len=8,output_len=4"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def config(tmp_path: Path, vary: str = "{dp: [1, 2]}", name: str = "s", extra: str = "") -> Path:
    return write(
        tmp_path / f"{name}.yaml",
        f"name: {name}\nbase: {{workload: '{WORKLOAD}'}}\nvary: {vary}\n{extra}",
    )


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [ln for ln in err.splitlines() if ln]


# ---- sweep: the config -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"vary": {"dp": [1, 2, 1]}}, r"vary.dp\[2\]: 1 repeats vary.dp\[0\]"),
        ({"vary": {"request_rate": [10, 10.0]}}, r"vary.request_rate\[1\]: 10.0 repeats"),
        ({"vary": {"d": [{"name": "a", "dp": 2}], "dp": [1, 8]}},
         r"vary.d \(case 'a'\) and vary.dp both set 'dp'"),
        ({"vary": {"d": [{"name": "a", "sched.page_size": 4}], "e": [{"page-size": 8}]}},
         r"vary.e \(case 'page-size=8'\) and vary.d \(case 'a'\) both set 'page_size'"),
        ({"vary": {"dp": [{"name": "two", "dp": 2}]}}, r"vary.dp: a key whose values are mappings"),
        ({"vary": {"dp": [1]}, "name": None}, "'name' must be a non-empty string, got None"),
        ({"vary": {"dp": [1]}, "name": ""}, "'name' must be a non-empty string"),
        ({"vary": {"dp": [1]}, "name": ["a"]}, "'name' must be a non-empty string"),
        ({"vary": {"dp": [1]}, "best": {"metric": None}}, "best.metric must be a metric name"),
        ({"vary": {"dp": [1]}, "best": ""}, "'best' must be a metric name"),
    ],
)  # fmt: skip
def test_silently_wrong_configs_are_refused(data: dict[str, Any], match: str) -> None:
    with pytest.raises(SweepError, match=match):
        SweepConfig.from_mapping(data)


def test_distinct_values_and_cases_that_set_other_settings_are_fine() -> None:
    cfg = SweepConfig.from_mapping(
        {"base": {"dp": 4}, "vary": {"flag": [1, True], "d": [{"name": "a", "tp": 2}],
                                     "dp": [1, 2]}}
    )  # fmt: skip
    assert cfg.num_runs == 4


def test_problems_of_many_runs_are_given_as_ranges() -> None:
    points = [{"page_size": 0 if i < 50 or i == 70 else 1} for i in range(100)]
    with pytest.raises(SweepError) as info:
        validate_points(points)
    assert str(info.value).startswith("runs 0-49, 70: ")


def test_a_huge_product_is_refused_before_its_points_are_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def built(self: SweepConfig) -> Any:
        raise AssertionError("the points were built")

    monkeypatch.setattr(SweepConfig, "points", built)
    values = ", ".join(str(v) for v in range(1, 101))
    keys = ["page_size", "max_total_tokens", "chunked_prefill_size", "max_prefill_tokens",
            "max_running_requests", "dp", "workload_seed", "num_requests", "slo_ttft_ms",
            "slo_tpot_ms"]  # fmt: skip
    cfg = write(tmp_path / "huge.yaml", "vary:\n" + "".join(f"  {k}: [{values}]\n" for k in keys))
    out = tmp_path / "out"
    assert sweep.main([str(cfg), "--jobs", "1", "--out", str(out)]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "huge.yaml: vary makes 100,000,000,000,000,000,000 runs" in line
    assert "more than --max-runs 10,000" in line and not out.exists()
    small = config(tmp_path)  # 2 runs
    assert sweep.main([str(small), "--max-runs", "1", "--out", str(out)]) == 2
    assert "more than --max-runs 1;" in capsys.readouterr().err


def test_metric_errors_name_their_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, extra="best: nosuch\n")
    assert sweep.main([str(cfg), "--jobs", "1", "--out", str(tmp_path / "o")]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "s.yaml: best: unknown metric 'nosuch'" in line


def test_bad_trace_lines_fail_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(tmp_path / "t.jsonl", '{"input_length": 10, "output_length": 2}\n{"x": 1}\n')
    cfg = write(tmp_path / "s.yaml", f"base: {{workload: 'jsonl:{trace}'}}\nvary: {{dp: [1, 2]}}\n")
    out = tmp_path / "out"
    assert sweep.main([str(cfg), "--jobs", "1", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    (line,) = error_lines(captured.err)
    assert f"every run: {trace}:2: unknown field 'x'" in line
    assert "run 1/" not in captured.out and not out.exists()


def test_non_finite_values_are_written_to_the_json(tmp_path: Path) -> None:
    cfg = SweepConfig.from_mapping(
        {"vary": {"request_rate": [math.inf, 10]}, "best": "hit_rate", "metrics": ["hit_rate"]}
    )
    result = run_sweep(cfg, run_fn=lambda s: {"hit_rate": 0.5 if s["request_rate"] < 20 else 0.9})
    result.write(tmp_path)
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["sweep"]["vary"]["request_rate"] == ["inf", 10]
    assert doc["best"]["settings"] == {"request_rate": "inf"}
    assert (tmp_path / "report.html").exists()


# ---- sweep: --out and the flags --------------------------------------------------------------


def test_out_holding_another_sweep_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = config(tmp_path, name="a")
    b = config(tmp_path, vary="{page_size: [1, 2]}", name="b")
    out = tmp_path / "out"
    assert sweep.main([str(a), "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sweep.main([str(b), "--jobs", "1", "--quiet", "--out", str(out)]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert f"--out {out}: already holds the results of another sweep ('a')" in line
    assert "--overwrite" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # The same sweep again replaces its own results; --overwrite replaces another's.
    assert sweep.main([str(a), "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    assert sweep.main([str(b), "--jobs", "1", "--quiet", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "sweep.json").read_text())["sweep"]["name"] == "b"


def test_files_of_unknown_origin_in_out_are_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    write(out / "sweep.csv", "mine\n")
    assert sweep.main([str(config(tmp_path)), "--jobs", "1", "--out", str(out)]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "already holds files this sweep would replace (sweep.csv)" in line
    assert (out / "sweep.csv").read_text() == "mine\n"


@pytest.mark.parametrize("name", ["sweep.json", "sweep.csv", "report.html"])
def test_the_config_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    text = f"base: {{workload: '{WORKLOAD}'}}\nvary: {{dp: [1]}}\n"
    cfg = write(tmp_path / name, text)
    for overwrite in ([], ["--overwrite"]):
        assert sweep.main([str(cfg), "--jobs", "1", "--out", str(tmp_path), *overwrite]) == 2
        (line,) = error_lines(capsys.readouterr().err)
        assert f"which is the sweep config {cfg}; refusing to overwrite an input" in line
        assert cfg.read_text() == text


def test_a_name_with_a_slash_needs_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = write(
        tmp_path / "s.yaml", f"name: a/b\nbase: {{workload: '{WORKLOAD}'}}\nvary: {{dp: [1]}}\n"
    )
    assert sweep.main([str(cfg), "--jobs", "1"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "name 'a/b' cannot name the default output folder" in line
    assert list(tmp_path.iterdir()) == [cfg]


def test_jobs_beyond_the_cpus_run_one_process_per_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[int] = []

    class Recording(sweep.LocalExecutor):
        def __init__(self, jobs: int = 1) -> None:
            created.append(jobs)
            super().__init__(1)  # in-process, to stay fast

    monkeypatch.setattr(sweep, "LocalExecutor", Recording)
    monkeypatch.setattr(sweep, "_usable_cpus", lambda: 2)
    cfg = config(tmp_path, vary="{dp: [1, 2, 3]}")
    assert (
        sweep.main([str(cfg), "--jobs", "99999999", "--quiet", "--out", str(tmp_path / "o")]) == 0
    )
    assert created == [2]
    assert "--jobs 99999999: running 2 processes at a time" in capsys.readouterr().err


def test_ray_without_the_package_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray: ImportError
    out = tmp_path / "o"
    assert sweep.main([str(config(tmp_path)), "--ray", "auto", "--out", str(out)]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "--ray auto: the ray package is not installed" in line and not out.exists()
    assert sweep.main([str(config(tmp_path)), "--ray", "auto", "--jobs", "2"]) == 2
    assert "--jobs sets local worker processes: drop it with --ray" in capsys.readouterr().err


def test_an_unreachable_ray_cluster_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("ray")

    def init(**kw: Any) -> None:
        raise ConnectionError("Could not find any running Ray instance.")

    fake.is_initialized = lambda: False  # type: ignore[attr-defined]
    fake.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake)
    out = tmp_path / "o"
    assert sweep.main([str(config(tmp_path)), "--ray", "ray://nowhere:1", "--out", str(out)]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "--ray ray://nowhere:1: cannot connect to Ray: Could not find any running" in line
    assert not out.exists()


# ---- bench -----------------------------------------------------------------------------------


@pytest.fixture
def no_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sending anything fails the test: every case must stop at validation."""
    from radixsched.server import bench

    async def sent(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a request was sent")

    monkeypatch.setattr(bench, "run_bench", sent)
    monkeypatch.setattr(bench, "run_sweep", sent)


BENCH = ["bench", "--url", "http://127.0.0.1:1", "--workload", WORKLOAD]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--url", ""], "--url '': expected http://HOST[:PORT][/PATH], got no http://"),
        (["--url", "localhost:30000"], "(did you mean http://localhost:30000?)"),
        (["--url", "ftp://127.0.0.1:1"], "got the scheme 'ftp'"),
        (["--url", "http://"], "--url 'http://': expected http://HOST[:PORT][/PATH], got no host"),
        (["--url", "http://127.0.0.1:99999"], "--url 'http://127.0.0.1:99999': expected"),
        (["--url", "http://[::1"], "--url 'http://[::1': expected"),
        (["--url", "http://127.0.0.1:1?x=1"], "a base URL takes no ?query or #fragment"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--slo-ttft-ms", "-1"], "--slo-ttft-ms must be a positive number of milliseconds, got -1"),
        (["--slo-tpot-ms", "nan"], "--slo-tpot-ms must be a positive number of milliseconds"),
        (["--sweep-rates", "2"], "--sweep-rates applies to --sweep only"),
        (["--no-sweep-warmup"], "--no-sweep-warmup applies to --sweep only"),
        (["--sweep", "--sweep-rates", "99999999999999999999"], "--sweep-rates must be <= 100"),
        (["--sweep", "--request-rate", "5"], "--request-rate does not apply to --sweep"),
    ],
)  # fmt: skip
def test_bench_flags_fail_before_any_request(
    no_requests: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    args: list[str], needle: str,
) -> None:  # fmt: skip
    from radixsched.cli.main import main

    extra = ["--json", str(tmp_path / "b.json")] if "--sweep" in args else []
    assert main([*BENCH, *args, *extra]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert needle in line


def test_bench_never_writes_over_its_trace_or_its_other_output(
    no_requests: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from radixsched.cli.main import main

    text = '{"input_length": 40, "output_length": 2}\n'
    trace = write(tmp_path / "t.jsonl", text)
    base = ["bench", "--url", "http://127.0.0.1:1", "--workload", f"jsonl:{trace}"]
    for flag in ("--json", "--requests-csv"):
        assert main([*base, flag, str(trace)]) == 2
        (line,) = error_lines(capsys.readouterr().err)
        assert f"{flag} {trace}: is the --workload trace; refusing to overwrite an input" in line
    same = str(tmp_path / "out")
    assert main([*base, "--json", same, "--requests-csv", same]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert f"--requests-csv {same}: is also the file of --json" in line
    assert trace.read_text() == text and not Path(same).exists()


# ---- generate --------------------------------------------------------------------------------


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: every case must stop before."""
    pytest.importorskip("torch")
    from radixsched.engine import loader

    def load(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loader, "load_model", load)


GENERATE = ["generate", "--model", "tiny-random", "--max-new-tokens", "2"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),
        (["--temperature", "inf"], "--temperature must be a finite number >= 0, got inf"),
        (["--top-p", "1.5"], "--top-p: top_p must be in (0, 1], got 1.5"),
        (["--top-k", "-1"], "--top-k: top_k must be >= 0"),
        (["--init-new-token-ratio", "nan"], "--init-new-token-ratio: must be a number >= 0"),
        (["--max-running-requests", "0"], "--max-running-requests: must be an integer >= 1"),
        (["--seed", "-1"], "--seed: must be an integer >= 0, got -1"),
        (["--seed", str(2**70)], "--seed must be between 0 and 2**63 - 1"),
        (["--context-len", "0"], "--context-len must be >= 1, got 0"),
        (["--threads", "99999"], "--threads must be between 1 and the"),
        (["--device", "bogus"], "--device bogus: expected cpu, cuda or cuda:N"),
        (["--system", "a\udcff", "--chat"], "--system: not UTF-8 text (byte 0xff at character 2)"),
        (["--json", ""], "--json: expected a file path, got an empty one"),
    ],
)  # fmt: skip
def test_generate_flags_fail_before_the_model_loads(
    no_model: None, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    from radixsched.cli.main import main

    assert main([*GENERATE, "--prompt", "hi", *args]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert needle in line


def test_generate_prompts_and_json_paths_fail_before_the_model_loads(
    no_model: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from radixsched.cli.main import main

    assert main([*GENERATE, "--prompt", "ok", "--prompt", "x\udcfe"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "--prompt #2: not UTF-8 text (byte 0xfe at character 2)" in line
    assert main([*GENERATE, "--prompt", "hi", "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path}: is a directory" in capsys.readouterr().err
    missing = tmp_path / "no" / "x.json"
    assert main([*GENERATE, "--prompt", "hi", "--json", str(missing)]) == 2
    assert f"--json {missing}: folder {missing.parent} does not exist" in capsys.readouterr().err


def test_generate_never_writes_over_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from radixsched.cli.main import main
    from radixsched.engine import loader

    real = loader.load_model
    monkeypatch.setattr(loader, "load_model", lambda *a, **kw: real("tiny-random"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF weights")
    folder = tmp_path / "m"
    folder.mkdir()
    write(folder / "config.json", "{}")
    for name, path in ((str(model), model), (str(folder), folder / "config.json")):
        before = path.read_bytes()
        assert main([*GENERATE, "--model", name, "--prompt", "hi", "--json", str(path)]) == 2
        (line,) = error_lines(capsys.readouterr().err)
        assert f"--json {path}: is" in line and "refusing to overwrite the model's files" in line
        assert path.read_bytes() == before


def test_generate_kv_pool_too_big_for_memory_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from radixsched.cli.main import main

    assert main([*GENERATE, "--prompt", "hi", "--kv-slots", "99999999999"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "--kv-slots 99999999999: a KV pool of 99,999,999,999 tokens needs" in line
    assert "lower --kv-slots" in line


def test_generate_huge_max_new_tokens_is_capped_to_the_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")
    from radixsched.cli.main import main

    argv = ["generate", "--model", "tiny-random", "--prompt", "hi", "--threads", "1",
            "--max-new-tokens", "99999999999", "--context-len", "32", "--ignore-eos", "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    (c,) = doc["completions"]
    assert c["error"] is None and 0 < c["prompt_tokens"] + c["completion_tokens"] <= 32
    assert doc["summary"]["kv_slots"] < 100


def test_generate_model_errors_name_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from radixsched.cli.main import main

    folder = tmp_path / "m"
    folder.mkdir()
    write(folder / "config.json", "garbage")
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"\xff\xfe")
    for model in (folder, gguf):
        assert main([*GENERATE, "--model", str(model), "--prompt", "hi"]) == 2
        (line,) = error_lines(capsys.readouterr().err)
        assert f"--model {model}" in line

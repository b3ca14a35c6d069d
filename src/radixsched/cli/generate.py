"""The ``generate`` subcommand: offline generation through the same scheduler loop the simulator
and the server run (``engine.offline.Engine`` over a ``TorchRunner``).

All prompts are submitted at once, so prompts sharing a prefix (a chat template's system
prompt, say) are served from the radix cache once the first of them has been prefilled. A
prompt is wrapped as a user turn of the model's chat template when the model has one (an
instruct model answers nothing to bare text); ``--raw`` sends the text as it is. torch is
imported only when the command runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from radixsched.cli.common import (
    COMMAND_HELP,
    MODEL_HELP,
    CliError,
    add_threads_arg,
    default_threads,
    model_error,
    scheduler_choices,
    scheduler_config,
    threads_error,
    torch_device,
)
from radixsched.config import SchedulerConfig, add_config_args
from radixsched.request import FinishReason, Req, SamplingParams, as_tokens

if TYPE_CHECKING:
    import torch

    from radixsched.engine.loader import LoadedModel

MAX_SEED = 2**63 - 1  # torch's generators take a 64-bit seed
# The sampling field each flag sets (its errors name the field; the message adds the flag).
_SAMPLING_FLAGS = {
    "max_new_tokens": "--max-new-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
}


def add_generate_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``generate`` on a subparsers object (``radixsched generate``)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "generate",
        help=COMMAND_HELP["generate"],
        description="Generate completions for one or more prompts with a real model, through "
        "the radixsched scheduler (prefix cache included). Scheduler flags carry SGLang's names.",
    )
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument(
        "--prompt",
        action="append",
        required=True,
        help="prompt text; repeat for several prompts (all are submitted at once)",
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument(
        "--raw",
        action="store_true",
        help="send each prompt as plain text (default: as a user turn of the model's chat "
        "template when it has one)",
    )
    fmt.add_argument(
        "--chat",
        action="store_true",
        help="use the chat template even for a model without one (random models: ChatML)",
    )
    p.add_argument("--system", help="system message of the chat template")
    p.add_argument("--max-new-tokens", type=int, default=128, help="(default: 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="(default: 1.0, off)")
    p.add_argument("--top-k", type=int, default=0, help="(default: 0, off)")
    p.add_argument("--ignore-eos", action="store_true", help="generate past EOS")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of sampling, of random-preset weights and of the random policy (default: 0)",
    )
    p.add_argument(
        "--kv-slots",
        type=int,
        help="KV pool size in tokens (default: every prompt plus its max-new-tokens)",
    )
    p.add_argument("--context-len", type=int, help="context length (default: the model's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--dtype", help="float32, bfloat16, float16 (default: by device)")
    add_threads_arg(p)
    p.add_argument(
        "--verbose",
        dest="show_stats",
        action="store_true",
        help="also print token counts (prompt, cached, completion) and timings",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        nargs="?",
        const="-",
        metavar="PATH",
        help="write completions, counts and timings as JSON to PATH (no PATH: stdout, "
        "instead of the text output)",
    )
    add_config_args(p, SchedulerConfig, skip={"seed"}, choices=scheduler_choices())
    p.set_defaults(func=cmd_generate)
    return p


@dataclasses.dataclass(frozen=True)
class Completion:
    index: int
    prompt: str
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None
    error: str | None
    ttft_s: float | None
    e2e_s: float | None


def _sampling(args: argparse.Namespace) -> SamplingParams:
    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    # NaN passes SamplingParams' range checks (and fails the first sampling step).
    if not math.isfinite(args.temperature):
        raise CliError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    try:
        return SamplingParams(
            max_new_tokens=args.max_new_tokens,
            ignore_eos=args.ignore_eos,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
        )
    except ValueError as e:
        flag = next((f for name, f in _SAMPLING_FLAGS.items() if str(e).startswith(name)), None)
        raise CliError(f"{flag}: {e}" if flag else str(e)) from e


def _text_error(flag: str, text: str) -> str | None:
    """Why ``text`` (an argument) cannot be tokenized: bytes that are not UTF-8 reach Python
    as lone surrogates (``\\udcff`` for the byte 0xff)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        return f"{flag}: not UTF-8 text ({what} at character {e.start + 1})"
    return None


def _check_args(args: argparse.Namespace) -> None:
    """The flags that need no model: ``CliError`` naming the flag (before torch loads)."""
    from radixsched.sim.settings.limits import check_output_path

    errors = []
    for i, prompt in enumerate(args.prompt):
        err = _text_error(f"--prompt #{i + 1}" if len(args.prompt) > 1 else "--prompt", prompt)
        if err:
            errors.append(err)
    if args.system is not None and (err := _text_error("--system", args.system)):
        errors.append(err)
    if not 0 <= args.seed <= MAX_SEED:
        errors.append(f"--seed must be between 0 and 2**63 - 1, got {args.seed}")
    if args.context_len is not None and args.context_len < 1:
        errors.append(f"--context-len must be >= 1, got {args.context_len}")
    if err := threads_error(args.threads):
        errors.append(err)
    if args.json_path is not None and args.json_path != "-":
        err = check_output_path("--json", args.json_path)
        model = Path(args.model).expanduser()
        if err:
            errors.append(err)
        elif model.exists() and _is_within(Path(args.json_path), model):
            what = "in the --model folder" if model.is_dir() else "the --model file"
            errors.append(
                f"--json {args.json_path}: is {what} {args.model}; refusing to overwrite the "
                "model's files"
            )
    if errors:
        raise CliError("\n".join(errors))


def _is_within(path: Path, model: Path) -> bool:
    """Whether ``path`` is the model file, or a file in the model's directory tree."""
    target, root = path.resolve(), model.resolve()
    return target == root or (root.is_dir() and root in target.parents)


def _kv_pool_problem(loaded: LoadedModel, slots: int, device: torch.device) -> str | None:
    """Why a KV pool of ``slots`` tokens cannot be allocated (more than the device's memory),
    or None; checked before allocating, as a pool too big fails with a traceback, or worse,
    is overcommitted and killed later."""
    import torch

    need = (slots + 1) * loaded.config.kv_bytes_per_token(loaded.model.dtype.itemsize)
    if device.type == "cuda":
        limit, where = torch.cuda.mem_get_info(device)[0], f"free on {device}"
    else:
        try:
            limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, OSError, ValueError):  # not on this OS
            return None
        where = "this machine's memory"
    if need <= limit:
        return None
    return (
        f"a KV pool of {slots:,} tokens needs {need / 2**30:,.1f} GiB, more than the "
        f"{limit / 2**30:,.1f} GiB of {where}"
    )


def _encode(loaded: LoadedModel, prompt: str, *, chat: bool, system: str | None) -> list[int]:
    if not chat:
        return loaded.tokenizer.encode(prompt)
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": prompt})
    try:
        rendered = loaded.chat_template.render(messages, add_generation_prompt=True)
    except ValueError as e:
        raise CliError(f"--chat: {e}") from e
    # The template writes its own BOS (if the model uses one).
    return loaded.tokenizer.encode(rendered, add_special_tokens=False)


def uses_chat_template(loaded: LoadedModel, args: argparse.Namespace) -> bool:
    """``--chat``: always; ``--raw``: never; else when the model ships a chat template."""
    if args.raw:
        return False
    return bool(args.chat) or loaded.chat_template.source is not None


def cmd_generate(args: argparse.Namespace) -> int:
    sampling = _sampling(args)
    config = scheduler_config(args, seed=args.seed)
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    if args.raw and args.system is not None:
        raise CliError("--system needs the chat template: drop --raw")
    if args.kv_slots is not None and args.kv_slots < config.page_size:
        raise CliError(f"--kv-slots must be >= the page size ({config.page_size})")
    _check_args(args)

    import torch

    from radixsched.engine.loader import load_model
    from radixsched.engine.offline import Engine
    from radixsched.engine.runner import TorchRunner

    device = torch_device(args.device)
    torch.set_num_threads(args.threads or default_threads())
    t0 = time.perf_counter()
    try:
        loaded = load_model(args.model, device=device, dtype=args.dtype, seed=args.seed)
    except ValueError as e:
        raise CliError(model_error(args.model, e)) from e
    load_s = time.perf_counter() - t0

    prompts: list[str] = args.prompt
    chat = uses_chat_template(loaded, args)
    encoded = [_encode(loaded, p, chat=chat, system=args.system) for p in prompts]
    if empty := [i for i, ids in enumerate(encoded) if not ids]:
        raise CliError(f"prompt {empty[0]} encodes to no tokens")
    page = config.page_size
    kv_slots = args.kv_slots
    if kv_slots is None:
        # Room for every request at once (a page of slack each for page rounding): no
        # retraction. The scheduler caps a request's output to the context, so the pool is too.
        context = loaded.config.max_position_embeddings
        if args.context_len is not None:
            context = min(context, args.context_len)
        kv_slots = sum(min(len(ids) + sampling.max_new_tokens, context) + page for ids in encoded)
    # The allocator hands out slots 1 .. (kv_slots // page + 1) * page - 1 (page 0 reserved).
    slots = (kv_slots // page + 1) * page - 1
    problem = _kv_pool_problem(loaded, slots, device)
    if problem:
        hint = "lower --kv-slots" if args.kv_slots is not None else "set --kv-slots lower"
        flag = f"--kv-slots {args.kv_slots}" if args.kv_slots is not None else "the KV pool"
        raise CliError(f"{flag}: {problem}; {hint}")
    try:
        runner = TorchRunner(loaded, slots, seed=args.seed, max_context_len=args.context_len)
    except (MemoryError, RuntimeError) as e:  # torch.OutOfMemoryError is a RuntimeError
        raise CliError(f"cannot allocate a KV pool of {slots:,} tokens: {e}") from e
    try:
        engine = Engine(runner, config, kv_slots=kv_slots, context_len=runner.max_context_len)
    except ValueError as e:
        raise CliError(str(e)) from e
    reqs = [Req(f"prompt-{i}", as_tokens(ids), sampling) for i, ids in enumerate(encoded)]
    t1 = time.perf_counter()
    outputs = engine.generate(reqs)
    wall_s = time.perf_counter() - t1

    completions: list[Completion] = []
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        error: str | None = None
        if not out.admit.accepted:
            error = out.admit.message or "rejected"
        elif out.finish is not None and out.finish.reason is FinishReason.ABORT:
            error = out.finish.message or "aborted"
        completions.append(
            Completion(
                index=i,
                prompt=prompt,
                text=loaded.tokenizer.decode(out.output_ids),
                prompt_tokens=out.prompt_tokens,
                cached_tokens=out.cached_tokens,
                completion_tokens=len(out.output_ids),
                finish_reason=None if out.finish is None else out.finish.reason.value,
                error=error,
                ttft_s=out.ttft_s,
                e2e_s=out.e2e_s,
            )
        )
    stats = engine.scheduler.stats
    summary: dict[str, Any] = {
        "model": loaded.name,
        "device": str(runner.device),
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "chat_template": chat,
        "kv_slots": kv_slots,
        "load_s": load_s,
        "wall_s": wall_s,
        "prompt_tokens": stats.prompt_tokens,
        "cached_prompt_tokens": stats.cached_prompt_tokens,
        "prefill_tokens_computed": stats.prefill_tokens_computed,
        "completion_tokens": sum(c.completion_tokens for c in completions),
        "prefill_steps": stats.prefill_steps,
        "decode_steps": stats.decode_steps,
        "retractions": stats.retractions,
    }
    if args.json_path is not None:
        doc = {
            "summary": summary,
            "scheduler": dataclasses.asdict(config),
            "completions": [dataclasses.asdict(c) for c in completions],
        }
        if args.json_path == "-":
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            with open(args.json_path, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=2)
    if args.json_path != "-":
        _print_text(completions, summary, sys.stdout, show_stats=args.show_stats)
    for c in completions:
        if c.error is not None:
            print(f"radixsched: error: prompt {c.index}: {c.error}", file=sys.stderr)
        elif not c.text.strip():
            print(f"radixsched: note: prompt {c.index}: {_empty_note(c, chat)}", file=sys.stderr)
    return 1 if any(c.error is not None for c in completions) else 0


def _empty_note(c: Completion, chat: bool) -> str:
    """Why a completion can be empty, and what to try."""
    what = (
        f"the completion is empty ({c.completion_tokens} token(s), finish reason {c.finish_reason})"
    )
    if not chat:
        return (
            f"{what}: the prompt was sent as plain text (--raw or no chat template); an "
            "instruct model usually needs its chat template (drop --raw, or pass --chat)"
        )
    return f"{what}: the model ended at once; try another prompt, or --ignore-eos"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f} ms"


def _print_text(
    completions: Sequence[Completion], summary: dict[str, Any], out: IO[str], *, show_stats: bool
) -> None:
    many = len(completions) > 1
    for c in completions:
        if many:
            print(f"=== prompt {c.index}: {c.prompt}", file=out)
        print(c.text, file=out)
        if show_stats:
            print(
                f"--- prompt {c.prompt_tokens} tokens (cached {c.cached_tokens}), completion "
                f"{c.completion_tokens} tokens ({c.finish_reason}), ttft {_ms(c.ttft_s)}, "
                f"e2e {_ms(c.e2e_s)}",
                file=out,
            )
    if show_stats:
        s = summary
        tok_s = s["completion_tokens"] / s["wall_s"] if s["wall_s"] > 0 else 0.0
        print(
            f"--- {s['model']} on {s['device']} ({s['dtype']}, {s['threads']} threads): load "
            f"{s['load_s']:.2f} s, generate {s['wall_s']:.2f} s ({tok_s:,.1f} completion tok/s); "
            f"prefill computed {s['prefill_tokens_computed']} of {s['prompt_tokens']} prompt "
            f"tokens, cached {s['cached_prompt_tokens']}; {s['retractions']} retractions",
            file=out,
        )

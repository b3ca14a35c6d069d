"""Generated workloads with SGLang's benchmark shapes: shared-prefix, multi-turn, tree-of-thought,
few-shot; each builder is seeded and returns drafts, each sizer the requests and tokens it will make."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from radixsched.sim.workloads.tokens import (
    MAX_GENERATED_REQUESTS,
    MAX_GENERATED_TOKENS,
    _Draft,
    _randint,
    _rng,
    _shuffled,
)


def _build_shared_prefix(p: dict[str, Any], seed: int) -> list[_Draft]:
    rng, vocab = _rng(seed), p["vocab"]
    drafts: list[_Draft] = []
    for _ in range(p["groups"]):
        system = _randint(rng, p["system_len"], vocab)
        for _ in range(p["prompts"]):
            question = _randint(rng, p["question_len"], vocab)
            drafts.append(_Draft(np.concatenate([system, question]), p["output_len"], len(drafts)))
    return _shuffled(drafts, rng, p["shuffle"])


def _build_multi_turn(p: dict[str, Any], seed: int) -> list[_Draft]:
    rng, vocab, out_len = _rng(seed), p["vocab"], p["output_len"]
    drafts: list[_Draft] = []
    for conv in range(p["conversations"]):
        context = _randint(rng, p["first_len"], vocab)
        for turn in range(p["turns"]):
            if turn:
                # The next turn sees the whole previous exchange, then the new user message.
                prev = drafts[-1]
                assert prev.scripted is not None
                context = np.concatenate(
                    [prev.prompt, prev.scripted, _randint(rng, p["turn_len"], vocab)]
                )
            output = _randint(rng, out_len, vocab)
            drafts.append(
                _Draft(context, out_len, conv, offset_s=turn * p["think_time_s"], scripted=output)
            )
    return drafts


def _build_tree_of_thought(p: dict[str, Any], seed: int) -> list[_Draft]:
    rng, vocab, out_len = _rng(seed), p["vocab"], p["output_len"]
    drafts: list[_Draft] = []
    for tree in range(p["trees"]):
        level = [_Draft(_randint(rng, p["root_len"], vocab), out_len, tree)]
        level[0].scripted = _randint(rng, out_len, vocab)
        for depth in range(p["depth"]):
            drafts.extend(level)
            if depth + 1 == p["depth"]:
                break
            children = []
            for parent in level:
                assert parent.scripted is not None
                for _ in range(p["branching"]):
                    step = _randint(rng, p["step_len"], vocab)
                    prompt = np.concatenate([parent.prompt, parent.scripted, step])
                    children.append(
                        _Draft(
                            prompt,
                            out_len,
                            tree,
                            offset_s=(depth + 1) * p["think_time_s"],
                            scripted=_randint(rng, out_len, vocab),
                        )
                    )
            level = children
    return drafts


def _build_few_shot(p: dict[str, Any], seed: int) -> list[_Draft]:
    rng, vocab = _rng(seed), p["vocab"]
    shots = [_randint(rng, p["shots"] * p["shot_len"], vocab) for _ in range(p["num_subjects"])]
    drafts: list[_Draft] = []
    for q in range(p["questions"]):
        question = _randint(rng, p["question_len"], vocab)
        prompt = np.concatenate([shots[q % p["num_subjects"]], question])
        drafts.append(_Draft(prompt, p["output_len"], q))
    return _shuffled(drafts, rng, p["shuffle"])


# ---- generated sizes: (requests, tokens of prompts and scripted outputs), checked before a
# generator runs (a tree's levels are summed only until the limits are passed)


def _size_shared_prefix(p: Mapping[str, Any]) -> tuple[int, int]:
    n = p["groups"] * p["prompts"]
    return n, n * (p["system_len"] + p["question_len"])


def _size_multi_turn(p: Mapping[str, Any]) -> tuple[int, int]:
    turns, grow = p["turns"], p["output_len"] + p["turn_len"]
    per_chat = turns * (p["first_len"] + p["output_len"]) + grow * turns * (turns - 1) // 2
    return p["conversations"] * turns, p["conversations"] * per_chat


def _size_tree_of_thought(p: Mapping[str, Any]) -> tuple[int, int]:
    n = tokens = 0
    for level in range(p["depth"]):
        nodes = p["trees"] * p["branching"] ** level
        n += nodes
        tokens += nodes * (
            p["root_len"] + level * (p["output_len"] + p["step_len"]) + p["output_len"]
        )
        if n > MAX_GENERATED_REQUESTS or tokens > MAX_GENERATED_TOKENS:
            break
    return n, tokens


def _size_few_shot(p: Mapping[str, Any]) -> tuple[int, int]:
    shots = p["shots"] * p["shot_len"]
    return p["questions"], p["questions"] * (shots + p["question_len"]) + p["num_subjects"] * shots

"""What the HTTP layer knows about the model it serves (no FastAPI here: the engine's builders
and the app both use it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixsched.engine.loader import LoadedModel, LoadedTokenizer
    from radixsched.engine.tokenizer import ChatTemplate, Tokenizer


@dataclass(frozen=True)
class ServedModel:
    """What the HTTP layer needs to know about the model behind the scheduler.

    ``model_path`` / ``tokenizer_path``: what ``/model_info`` and ``/server_info`` report.
    ``model_path`` is a folder on this machine whenever there is one (the model's own folder,
    else its tokenizer's), as SGLang reports the path it loaded: sglang-router and SGLang's
    bench load the tokenizer from it instead of looking the name up on a model hub.
    ``tokenizer_path`` is None where there is no tokenizer folder."""

    name: str
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    vocab_size: int
    context_len: int
    model_path: str | None = None
    tokenizer_path: str | None = None
    model_type: str | None = None
    architectures: tuple[str, ...] | None = None


def served_model(
    source: LoadedModel | LoadedTokenizer,
    context_len: int,
    *,
    served_model_name: str | None = None,
    tokenizer_path: str | None = None,
) -> ServedModel:
    """The ``ServedModel`` of a loaded model or of its tokenizer alone."""
    return ServedModel(
        name=served_model_name or source.name,
        tokenizer=source.tokenizer,
        chat_template=source.chat_template,
        vocab_size=source.config.vocab_size,
        context_len=context_len,
        model_path=_local_model_path(source.name, tokenizer_path),
        tokenizer_path=tokenizer_path,
        model_type=source.config.architecture.value,
        architectures=(source.config.architecture.hf_class,),
    )


def _local_model_path(name: str, tokenizer_path: str | None) -> str:
    """The folder the model loads from (``name`` when it is one), else its tokenizer folder,
    else the name itself."""
    if tokenizer_path is None or os.path.isdir(name):
        return name
    return tokenizer_path


def max_prompt_chars(tokenizer: Tokenizer, vocab_size: int, context_len: int) -> int:
    """Characters a prompt of ``context_len`` tokens can have at most: no token's text is longer
    than the longest vocabulary entry (a byte-level entry has one character per byte, and a
    character is at least a byte)."""
    longest = max((len(t) for i in range(vocab_size) if (t := tokenizer.token_text(i))), default=1)
    return context_len * max(longest, 1)

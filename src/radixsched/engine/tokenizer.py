"""Tokenizers (byte-level for random models; ``tokenizers`` for real ones) and chat templates.

Sources: a local ``tokenizer.json`` (+ ``tokenizer_config.json``), or a GGUF's gpt2-style BPE
metadata (tokens + merges + pre-tokenizer name), converted into a ``tokenizers.Tokenizer``.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixsched.engine.config import BYTE_BOS_ID, BYTE_EOS_ID, BYTE_PAD_ID


class TextEncodingError(ValueError):
    """Text that cannot be tokenized: it is not valid Unicode (a lone UTF-16 surrogate, which
    a Python str can hold and JSON can spell as ``"\\ud800"``)."""


def _surrogate_error(text: str, e: UnicodeEncodeError) -> TextEncodingError:
    return TextEncodingError(
        f"text is not valid Unicode: lone surrogate U+{ord(text[e.start]):04X} at index {e.start}"
    )


class Tokenizer(ABC):
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # Whether ``encode(text)`` prepends BOS by default (the model's convention for raw prompts).
    add_bos: bool

    @abstractmethod
    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds BOS where the model expects one
        (pass False for text rendered by a chat template, which writes its own BOS). Raises
        ``TextEncodingError`` for text that is not valid Unicode."""

    @abstractmethod
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...

    @abstractmethod
    def token_text(self, token_id: int) -> str | None:
        """The vocabulary entry of one id (None when out of range)."""


class ByteTokenizer(Tokenizer):
    """Ids 0..255 are bytes; 256/257/258 are BOS/EOS/PAD. Ids above are model-only (a random
    model with a larger vocab can emit them; they decode to nothing)."""

    def __init__(self, *, add_bos: bool = False) -> None:
        self.bos_token_id = BYTE_BOS_ID
        self.eos_token_ids = (BYTE_EOS_ID,)
        self.add_bos = add_bos

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        try:
            ids = list(text.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise _surrogate_error(text, e) from None
        return [BYTE_BOS_ID, *ids] if add_special_tokens and self.add_bos else ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str | None:
        special = {BYTE_BOS_ID: "<bos>", BYTE_EOS_ID: "<eos>", BYTE_PAD_ID: "<pad>"}
        if token_id in special:
            return special[token_id]
        return bytes([token_id]).decode("latin-1") if 0 <= token_id < 256 else None


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer``; BOS is prepended by us (not by a post-processor) so that
    ``add_special_tokens`` means the same for every source."""

    def __init__(
        self, tok: Any, *, bos_token_id: int | None, eos_token_ids: tuple[int, ...], add_bos: bool
    ) -> None:
        self._tok = tok
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.add_bos = add_bos and bos_token_id is not None

    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _surrogate_error(text, e) from None
        # ``encode_batch`` releases the GIL while it works (``encode`` holds it): a long text
        # tokenized in a worker thread does not stop the event loop or the scheduler thread.
        ids: list[int] = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text: str = self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def token_text(self, token_id: int) -> str | None:
        text: str | None = self._tok.id_to_token(token_id)
        return text

    def save(self, path: Path) -> None:
        self._tok.save(str(path))

    def config_json(self, **extra: Any) -> dict[str, Any]:
        """Its ``tokenizer_config.json``: the class and ``add_bos_token``, then ``extra``, then
        the names of its BOS and first EOS token (when it has them)."""
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos,
            **extra,
        }
        if self.bos_token_id is not None:
            config["bos_token"] = self.token_text(self.bos_token_id)
        if self.eos_token_ids:
            config["eos_token"] = self.token_text(self.eos_token_ids[0])
        return config

    @classmethod
    def from_dir(cls, path: Path, *, eos_token_ids: tuple[int, ...] = ()) -> HFTokenizer:
        """``tokenizer.json`` plus special-token names from ``tokenizer_config.json``; EOS ids
        are the union of the model config's and the tokenizer config's."""
        from tokenizers import Tokenizer as RawTokenizer

        tok = RawTokenizer.from_file(str(path / "tokenizer.json"))
        cfg = read_json(path / "tokenizer_config.json")
        bos_name = _token_name(cfg.get("bos_token"))
        eos_name = _token_name(cfg.get("eos_token"))
        bos = tok.token_to_id(bos_name) if bos_name else None
        # Does the checkpoint's post-processor prepend BOS (Llama 3, Mistral) or not (Qwen2)?
        with_special = tok.encode("a", add_special_tokens=True).ids
        plain = tok.encode("a", add_special_tokens=False).ids
        post_adds_bos = len(with_special) > len(plain) and with_special[0] != plain[0]
        if post_adds_bos and bos is None:
            bos = with_special[0]
        # We prepend BOS ourselves (see the class docstring), so the post-processor goes.
        tok.post_processor = None
        eos = list(eos_token_ids)
        eos_id = tok.token_to_id(eos_name) if eos_name else None
        if eos_id is not None and eos_id not in eos:
            eos.append(eos_id)
        add_bos = bool(cfg.get("add_bos_token", post_adds_bos))
        return cls(tok, bos_token_id=bos, eos_token_ids=tuple(eos), add_bos=add_bos)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> HFTokenizer:
        """Build a byte-level BPE tokenizer from ``tokenizer.ggml.*`` metadata (gpt2-style only;
        ``meta`` maps the key names to decoded values)."""
        from tokenizers import AddedToken, Regex, decoders, pre_tokenizers
        from tokenizers import Tokenizer as RawTokenizer
        from tokenizers.models import BPE

        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"GGUF tokenizer model {kind!r} is not supported (only gpt2-style byte-level BPE); "
                "use a model directory with tokenizer.json instead"
            )
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        pattern = _GGUF_PRE_PATTERNS.get(pre)
        if pattern is None and pre not in _GGUF_PRE_GPT2:
            raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported")
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        types: list[int] = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = RawTokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        splits: list[Any] = []
        if pre == "smollm":
            splits.append(pre_tokenizers.Digits(individual_digits=True))
        if pattern is None:
            splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
        else:
            splits.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False))
            splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
        tok.decoder = decoders.ByteLevel()
        # Control (3) and user-defined (4) tokens match as whole strings before BPE.
        tok.add_special_tokens(
            [
                AddedToken(tokens[i], special=True, normalized=False)
                for i, ty in enumerate(types)
                if ty in (3, 4)
            ]
        )
        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eot = meta.get("tokenizer.ggml.eot_token_id")
        eos_ids = tuple(dict.fromkeys(int(e) for e in (eos, eot) if e is not None))
        return cls(
            tok,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=eos_ids,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        )


# llama.cpp pre-tokenizer names -> split regex (None entries: gpt2's own regex via ByteLevel).
_GGUF_PRE_GPT2 = {"default", "gpt2", "gpt-2", "smollm", "starcoder"}
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_PRE_PATTERNS: dict[str, str] = {"llama-bpe": _LLAMA3_PATTERN, "qwen2": _QWEN2_PATTERN}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file's object ({} when the file is absent)."""
    if not path.exists():
        return {}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _token_name(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as strings or AddedToken dicts."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


# ---- chat templates ------------------------------------------------------------------------

_CHATML_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)(.*?)<\|im_end\|>", re.DOTALL)


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template. ``render`` uses jinja2 (sandboxed) when installed; without it,
    ChatML templates (``<|im_start|>``) are rendered by a built-in equivalent, including the
    template's default system prompt. ``source=None`` (random models): plain ChatML."""

    source: str | None
    bos_token: str = ""
    eos_token: str = ""

    def render(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        if self.source is not None:
            try:
                import jinja2  # noqa: F401
            except ImportError:
                return self.render_chatml(messages, add_generation_prompt=add_generation_prompt)
            return self.render_jinja(messages, add_generation_prompt=add_generation_prompt)
        return self.render_chatml(messages, add_generation_prompt=add_generation_prompt)

    def render_jinja(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        if self.source is None:
            raise ValueError("no chat template to render with jinja2")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.source).render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def render_chatml(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        if self.source is not None and "<|im_start|>" not in self.source:
            raise ValueError("chat template is not ChatML and jinja2 is not installed")
        parts: list[str] = []
        default_system = self._default_system()
        if default_system is not None and messages and messages[0]["role"] != "system":
            parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
        for m in messages:
            parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def _default_system(self) -> str | None:
        if self.source is None:
            return None
        match = _CHATML_SYSTEM.search(self.source)
        if match is None:
            return None
        return match.group(1).replace("\\n", "\n")

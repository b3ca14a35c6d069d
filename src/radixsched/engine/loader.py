"""``load_model``: one entry point for every model source.

Names resolved, in order: a random preset (``tiny-random``, ``<shape>-random`` for every shape in
``config.SHAPE_PRESETS``), ``smollm2-135m`` (GGUF converted once into the cache, see
``smollm2``), a directory (HF ``config.json`` + ``*.safetensors`` + ``tokenizer.json``), or a
``.gguf`` file (dequantized on every load). Nothing is ever fetched from a hub.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixsched.engine.config import ModelConfig, random_preset_config, random_preset_names
from radixsched.engine.model import CausalLM
from radixsched.engine.smollm2 import SMOLLM2_NAMES, converted_dir
from radixsched.engine.tokenizer import ByteTokenizer, ChatTemplate, HFTokenizer, Tokenizer
from radixsched.engine.weights import (
    build_empty_model,
    init_random_,
    load_weights_,
    read_gguf,
    read_gguf_header,
    read_hf_config,
    read_safetensors_dir,
)


@dataclass(frozen=True)
class LoadedModel:
    model: CausalLM
    tokenizer: Tokenizer
    config: ModelConfig
    chat_template: ChatTemplate
    name: str


@dataclass(frozen=True)
class LoadedTokenizer:
    """What the HTTP side of a server needs of a model: no weights."""

    tokenizer: Tokenizer
    config: ModelConfig
    chat_template: ChatTemplate
    name: str


def model_names() -> list[str]:
    """Names ``load_model`` resolves without a path (for CLI help)."""
    return [*random_preset_names(), SMOLLM2_NAMES[0]]


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """None: float32 on CPU, bfloat16 on an accelerator."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r} (choose from {', '.join(_DTYPES)})") from None


def load_model(
    name_or_path: str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    seed: int = 0,
) -> LoadedModel:
    dev = torch.device(device)
    dt = resolve_dtype(dtype, dev)
    random_config = random_preset_config(name_or_path)
    if random_config is not None:
        model = build_empty_model(random_config, dev, dt)
        init_random_(model, seed)
        return LoadedModel(model, ByteTokenizer(), random_config, ChatTemplate(None), name_or_path)
    if name_or_path in SMOLLM2_NAMES:
        return _load_dir(converted_dir(), dev, dt, name=SMOLLM2_NAMES[0])
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return _load_dir(path, dev, dt, name=name_or_path)
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, dev, dt)
    raise ValueError(
        f"unknown model {name_or_path!r}: not a preset ({', '.join(model_names())}), "
        "a model directory or a .gguf file"
    )


def load_tokenizer(name_or_path: str) -> LoadedTokenizer:
    """``load_model``'s tokenizer, chat template and config for the same name, without the
    weights (a server's HTTP process; the engine process loads the model)."""
    if (random_config := random_preset_config(name_or_path)) is not None:
        return LoadedTokenizer(ByteTokenizer(), random_config, ChatTemplate(None), name_or_path)
    if name_or_path in SMOLLM2_NAMES:
        return _dir_tokenizer(converted_dir(), name=SMOLLM2_NAMES[0])
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return _dir_tokenizer(path, name=name_or_path)
    if path.is_file() and path.suffix == ".gguf":
        config, meta = _read_gguf(read_gguf_header, path)
        tokenizer = HFTokenizer.from_gguf_metadata(meta)
        template = meta.get("tokenizer.chat_template")
        return LoadedTokenizer(
            tokenizer,
            config,
            _template(None if template is None else str(template), tokenizer),
            str(path),
        )
    raise ValueError(
        f"unknown model {name_or_path!r}: not a preset ({', '.join(model_names())}), "
        "a model directory or a .gguf file"
    )


def _json_object(path: Path, *, required: bool = False) -> dict[str, Any]:
    """A JSON file holding an object ({} when absent and not ``required``); a file that cannot
    be read, is not JSON or holds something else is a ``ValueError`` naming it."""
    if not path.exists():
        if required:
            raise FileNotFoundError(f"no {path.name} in {path.parent}")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if required and not data:
        raise ValueError(f"{path}: empty JSON object (expected a model config)")
    return data


def _hf_config(path: Path) -> ModelConfig:
    """``read_hf_config``, its errors naming the file at fault."""
    config_file = path / "config.json"
    _json_object(config_file, required=True)
    _json_object(path / "generation_config.json")
    try:
        return read_hf_config(path)
    except KeyError as e:
        raise ValueError(f"{config_file}: missing {e} (not a supported model config)") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{config_file}: not a supported model config ({e})") from None


def _read_gguf(read: Any, path: Path, **kw: Any) -> Any:
    """``read(path)`` of a GGUF file, its errors naming the file (the gguf package's own
    messages, "GGUF magic invalid" and worse, do not)."""
    try:
        return read(path, **kw)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, OSError, EOFError) as e:
        text = str(e)
        if text.startswith(str(path)):
            raise ValueError(text) from None
        raise ValueError(
            f"{path}: not a valid GGUF model file ({text or type(e).__name__})"
        ) from None


def _dir_tokenizer(path: Path, *, name: str) -> LoadedTokenizer:
    config = _hf_config(path)
    if not (path / "tokenizer.json").exists():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    source = _json_object(path / "tokenizer_config.json").get("chat_template")
    try:
        tokenizer = HFTokenizer.from_dir(path, eos_token_ids=config.eos_token_ids)
    except Exception as e:  # the tokenizers package raises a bare Exception for a bad file
        raise ValueError(f"{path / 'tokenizer.json'}: cannot load the tokenizer ({e})") from e
    jinja_file = path / "chat_template.jinja"
    if source is None and jinja_file.exists():
        source = jinja_file.read_text(encoding="utf-8")
    return LoadedTokenizer(tokenizer, config, _template(source, tokenizer), name)


def _template(source: Any, tokenizer: Tokenizer) -> ChatTemplate:
    if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source}
        source = named.get("default", next(iter(named.values()), None))
    bos = (
        tokenizer.token_text(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else None
    )
    eos = tokenizer.token_text(tokenizer.eos_token_ids[0]) if tokenizer.eos_token_ids else None
    return ChatTemplate(
        None if source is None else str(source), bos_token=bos or "", eos_token=eos or ""
    )


def _load_dir(path: Path, device: torch.device, dtype: torch.dtype, *, name: str) -> LoadedModel:
    tok = _dir_tokenizer(path, name=name)
    model = build_empty_model(tok.config, device, dtype)
    load_weights_(model, read_safetensors_dir(path))
    return LoadedModel(model, tok.tokenizer, tok.config, tok.chat_template, name)


def _load_gguf(path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    g = _read_gguf(read_gguf, path, dtype=dtype)
    tokenizer = HFTokenizer.from_gguf_metadata(g.metadata)
    model = build_empty_model(g.config, device, dtype)
    load_weights_(model, g.tensors)
    return LoadedModel(model, tokenizer, g.config, _template(g.chat_template, tokenizer), str(path))

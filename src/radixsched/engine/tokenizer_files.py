"""A model's tokenizer as files other programs load offline (``tokenizer.json`` +
``tokenizer_config.json``, what HF ``AutoTokenizer.from_pretrained`` and GuideLLM read).

Models whose tokenizer lives in memory only (the random presets' byte tokenizer, a GGUF's
embedded vocabulary) get their files written once into the cache folder; a model directory
that has ``tokenizer.json`` is used as it is. The files encode text to the same ids as the
server's own tokenizer (BOS is left to the caller, as ``add_special_tokens=False`` does)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radixsched.engine.config import BYTE_BOS_ID, BYTE_EOS_ID, BYTE_PAD_ID
from radixsched.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from radixsched.paths import cache_root

TOKENIZERS_FOLDER = "tokenizers"
BYTE_TOKENIZER_FOLDER = "byte-tokenizer-v1"  # bump when the files written for it change


def tokenizer_files_dir(model_name: str, tokenizer: Tokenizer) -> Path | None:
    """A folder holding ``tokenizer.json`` and ``tokenizer_config.json`` for ``tokenizer``
    (the model's own folder when it has ``tokenizer.json``), or None for a tokenizer kind that
    cannot be written as files."""
    own = Path(model_name).expanduser()
    if own.is_dir() and (own / "tokenizer.json").is_file():
        return own.resolve()
    if isinstance(tokenizer, ByteTokenizer):
        return _write_folder_once(BYTE_TOKENIZER_FOLDER, _byte_tokenizer_files)
    if isinstance(tokenizer, HFTokenizer):
        backend_json = tokenizer.backend.to_str()
        digest = hashlib.sha256(backend_json.encode()).hexdigest()[:16]
        folder = f"{Path(model_name).stem}-{digest}"
        return _write_folder_once(folder, lambda out: _hf_tokenizer_files(tokenizer, out))
    return None


def _write_folder_once(folder: str, write: Callable[[Path], None]) -> Path:
    """``cache_root()/tokenizers/folder``, written by ``write(tmp)`` into a sibling temporary
    folder and renamed into place (a reader never sees half a folder)."""
    out = cache_root() / TOKENIZERS_FOLDER / folder
    if (out / "tokenizer_config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder}-", dir=out.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, out)
        except OSError:  # a concurrent writer got there first: its files are the same
            if not (out / "tokenizer_config.json").is_file():
                raise
    finally:
        if tmp.exists():
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    return out


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False), encoding="utf-8")


def _byte_tokenizer_files(out: Path) -> None:
    """``ByteTokenizer`` as a byte-level BPE without merges: byte b is id b (GPT-2's printable
    stand-ins name the bytes), then ``<bos>``, ``<eos>``, ``<pad>``."""
    from tokenizers import AddedToken, decoders, pre_tokenizers
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import BPE

    byte_chars = pre_tokenizers.ByteLevel.alphabet()  # the 256 stand-ins, in no fixed order
    by_byte = {ord(c) if ord(c) < 256 else _stand_in_byte(c): c for c in byte_chars}
    vocab = {by_byte[b]: b for b in range(256)}
    tok = RawTokenizer(BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = {BYTE_BOS_ID: "<bos>", BYTE_EOS_ID: "<eos>", BYTE_PAD_ID: "<pad>"}
    tok.add_special_tokens([AddedToken(specials[i], special=True) for i in sorted(specials)])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    _write_json(out / "tokenizer_config.json", config)


def _stand_in_byte(char: str) -> int:
    """The byte GPT-2's byte-level alphabet names with a character outside Latin-1: the
    non-printable bytes, in order, are mapped to 256, 257, ..."""
    non_printable = [
        b
        for b in range(256)
        if not (ord("!") <= b <= ord("~") or ord("¡") <= b <= ord("¬") or ord("®") <= b <= 255)
    ]
    return non_printable[ord(char) - 256]


def _hf_tokenizer_files(tokenizer: HFTokenizer, out: Path) -> None:
    tokenizer.save(out / "tokenizer.json")
    config = tokenizer.config_json(clean_up_tokenization_spaces=False)
    _write_json(out / "tokenizer_config.json", config)

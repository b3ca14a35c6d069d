"""Write a Hugging Face tokenizer folder that counts tokens as radixsched's random presets do
(id = UTF-8 byte; 256/257/258 = bos/eos/pad), for benchmark clients that need a tokenizer.

Usage: python make_byte_tokenizer.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def _byte_chars() -> dict[int, str]:
    """The byte-level pre-tokenizer's printable character for each byte (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return chars


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    vocab = {c: b for b, c in _byte_chars().items()}
    vocab.update({"<bos>": 256, "<eos>": 257, "<pad>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<bos>", "<eos>", "<pad>")])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "model_max_length": 4096,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 259}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""The real engine's model side: a Llama-family PyTorch model behind ``ModelRunner``.

Modules (torch is imported by all but ``config`` and ``smollm2``, so importing this package
itself stays torch-free):

- ``config``: ``ModelConfig`` (HF config.json in/out), shape presets, random-preset names
- ``model``: the decoder over a slot-indexed KV pool
- ``weights``: safetensors directories, GGUF (dequantize + un-permute), seeded random values
- ``tokenizer``: byte-level and ``tokenizers``-based tokenizers, chat templates
- ``sampling``: greedy / temperature / top-k / top-p, seeded per request and position
- ``smollm2``: locating SmolLM2's GGUF and caching its conversion
- ``loader``: ``load_model(name_or_path, device=, dtype=, seed=) -> LoadedModel``
- ``runner``: ``TorchRunner(loaded, kv_slots, device=, seed=, max_context_len=)``
"""

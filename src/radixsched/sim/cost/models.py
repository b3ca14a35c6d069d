"""Model shapes by name: the presets, the local engine's own models, or a Hugging Face
``config.json`` (file or directory), in one lookup."""

from __future__ import annotations

from radixsched.sim.cost.hardware import MODEL_ALIASES, MODELS, ModelSpec, PresetError, _lookup
from radixsched.sim.cost.hfconfig import config_path, load_hf_config


def engine_model(name: str) -> ModelSpec | None:
    """The shape of one of the local engine's presets (``tiny-random``, ``smollm2-135m``,
    ``<shape>-random``) as the local engine runs it on CPU (float32), else None."""
    from radixsched.engine.config import RANDOM_SUFFIX, SHAPE_PRESETS, random_preset_config

    lowered = name.lower()
    shape = random_preset_config(lowered)
    if shape is None:
        base = lowered[: -len(RANDOM_SUFFIX)] if lowered.endswith(RANDOM_SUFFIX) else lowered
        if base not in SHAPE_PRESETS or base not in ("smollm2-135m",):
            return None
        shape = SHAPE_PRESETS[base]
    from radixsched.sim.cost.hfconfig import spec_from_engine_config

    return spec_from_engine_config(name, shape, dtype_bytes=4)


def get_model(name: str) -> ModelSpec:
    """Case-insensitive lookup that also takes common spellings and Hugging Face ids
    (``meta-llama/Llama-3.1-8B-Instruct``); the local engine's presets (``tiny-random``,
    ``smollm2-135m``) in float32. Raises ``PresetError`` listing valid names."""
    try:
        return _lookup(MODELS, MODEL_ALIASES, name, "model")
    except PresetError:
        local = engine_model(name)
        if local is None:
            raise
        return local


def resolve_model(name: str) -> ModelSpec:
    """A preset (or local engine model) by name, else a config.json file or directory."""
    if config_path(name) is not None:
        return load_hf_config(name)
    try:
        return get_model(name)
    except PresetError as e:
        if "/" in name or name.endswith(".json"):
            raise PresetError(f"{e} (and {name!r} is no config.json or model directory)") from None
        raise

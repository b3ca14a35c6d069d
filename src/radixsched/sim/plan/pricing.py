"""GPU-hour prices: the presets' list prices (``sim.cost.hardware.GPU_PRICES_PER_HOUR``),
overridden by ``--gpu-price h100=2.5,b200=4``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from radixsched.sim.cost.hardware import GPU_PRICES_PER_HOUR, PresetError, get_gpu

FLAG = "--gpu-price"


class PriceError(ValueError):
    """A bad price list; the message names the flag."""


def parse_prices(text: str | Mapping[str, object] | None) -> dict[str, float]:
    """``h100=2.5,b200=4`` (or a mapping from a config file) as {preset name: dollars per
    GPU-hour}; each price finite and > 0, each GPU a preset, given once."""
    if text is None:
        return {}
    items: list[tuple[str, object]]
    if isinstance(text, Mapping):
        items = [(str(k), v) for k, v in text.items()]
    else:
        pairs = [p.strip() for p in str(text).split(",") if p.strip()]
        if not pairs:
            raise PriceError(f"{FLAG}: expected GPU=PRICE pairs (h100=2.5), got {text!r}")
        items = []
        for pair in pairs:
            key, sep, text_value = pair.partition("=")
            if not sep:
                raise PriceError(f"{FLAG}: expected GPU=PRICE (h100=2.5), got {pair!r}")
            items.append((key.strip(), text_value.strip()))
    out: dict[str, float] = {}
    for name, value in items:
        try:
            gpu = get_gpu(name).name
        except PresetError as e:
            raise PriceError(f"{FLAG}: {e}") from None
        try:
            price = float(str(value))
        except ValueError:
            raise PriceError(
                f"{FLAG}: {name}: expected dollars per GPU-hour, got {value!r}"
            ) from None
        if not (math.isfinite(price) and price > 0):
            raise PriceError(f"{FLAG}: {name}: a price must be a positive number, got {value!r}")
        if gpu in out:
            raise PriceError(f"{FLAG}: {gpu} is priced twice")
        out[gpu] = price
    return out


def price_table(overrides: Mapping[str, float]) -> dict[str, float]:
    """The presets' prices with ``overrides`` over them."""
    return {**GPU_PRICES_PER_HOUR, **overrides}


def missing_prices(gpus: Iterable[str], table: Mapping[str, float]) -> list[str]:
    """Preset names among ``gpus`` without a price, each once, in order."""
    return list(dict.fromkeys(gpu for gpu in gpus if gpu not in table))


def cost_per_million_tokens(cost_per_hour: float, tokens_per_s: float) -> float | None:
    """Dollars per million tokens produced at ``tokens_per_s`` (None: no tokens)."""
    if tokens_per_s <= 0:
        return None
    return cost_per_hour / (tokens_per_s * 3600.0) * 1e6


def deployment_gpus(sim: Any) -> list[tuple[str, int]]:
    """(GPU preset, how many) of a deployment: co-located ``dp x tp``, or each role's."""
    if not sim.disaggregation:
        return [(get_gpu(sim.gpu).name, sim.dp * sim.tp)]
    from radixsched.sim.settings.deployment import role_specs

    pre, dec = role_specs(sim)
    return [
        (get_gpu(pre.gpu).name, sim.prefill_instances * pre.tp),
        (get_gpu(dec.gpu).name, sim.decode_instances * dec.tp),
    ]


def hourly_cost(sim: Any, table: Mapping[str, float]) -> float:
    """Dollars per hour of a deployment's GPUs (every GPU must be in ``table``)."""
    return sum(table[gpu] * n for gpu, n in deployment_gpus(sim))

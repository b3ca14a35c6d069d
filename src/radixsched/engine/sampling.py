"""Token sampling: greedy, temperature, top-k, top-p, seeded per request and position.

Sampling is stateless: the random stream for a token is derived from (request seed, position of
the token being generated). So a request with a fixed seed produces the same text whatever it
is batched with, and a request that is retracted and recomputed samples the same tokens again.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

from radixsched.request import SamplingParams

_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, position: int) -> int:
    """SplitMix64 of (seed, position), folded to a non-negative int63 for ``manual_seed``."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def request_seed(params: SamplingParams, rid: str, runner_seed: int) -> int:
    """The request's own seed, else one derived from the runner seed and the request id."""
    if params.seed is not None:
        return params.seed
    return mix_seed(runner_seed, zlib.crc32(rid.encode("utf-8")))


# Below this temperature sampling is greedy: dividing logits by a near-zero temperature
# overflows float32 to inf and the softmax to NaN.
MIN_TEMPERATURE = 1e-5
# top_p below this keeps only the most likely token anyway; a denormal top_p would round to 0.
MIN_TOP_P = 1e-6


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < MIN_TEMPERATURE or params.top_k == 1


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities ``[vocab]`` after temperature, top-k and top-p (float32; sums to 1)."""
    scaled = logits.float() / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        # Tokens tied with the k-th largest logit are all kept (no arbitrary tie-break).
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, _ = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # Keep the smallest prefix reaching top_p; the most likely token is always kept.
        # The cut is a probability, so tokens tied with the last kept one are kept too (a
        # sort would otherwise break such ties arbitrarily).
        kept = mass_before < max(params.top_p, MIN_TOP_P)
        cutoff = sorted_probs[kept].min()
        probs = probs.masked_fill(probs < cutoff, 0.0)
        probs = probs / probs.sum()
    return probs


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    positions: Sequence[int],
) -> list[int]:
    """One token per row of ``logits`` ``[N, vocab]``; row i samples with ``params[i]`` from the
    stream of (``seeds[i]``, ``positions[i]``)."""
    if not len(params) == len(seeds) == len(positions) == logits.shape[0]:
        raise ValueError("logits, params, seeds and positions must have the same length")
    logits = logits.float().cpu()
    out = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if is_greedy(p):
            continue
        gen = torch.Generator().manual_seed(mix_seed(seeds[i], positions[i]))
        probs = filter_logits(logits[i], p)
        out[i] = int(torch.multinomial(probs, 1, generator=gen).item())
    return [int(t) for t in out]

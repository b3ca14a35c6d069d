"""The running batch: requests that have been prefilled and decode one token per step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixsched.cache.base import ceil_page
from radixsched.policies import prio_value
from radixsched.request import Req


class RunningBatch:
    """The running requests, in the order they joined (decode batch order)."""

    def __init__(self) -> None:
        self.reqs: list[Req] = []

    def extend(self, reqs: list[Req]) -> None:
        self.reqs.extend(reqs)

    def remove(self, reqs: list[Req]) -> None:
        gone = {id(r) for r in reqs}
        self.reqs[:] = [r for r in self.reqs if id(r) not in gone]  # in place: the adder holds it

    def decode_tokens(self, clip: int) -> tuple[int, int]:
        """(ignore_eos, other) sums of the clipped decode tokens still to come: the adder
        reserves the first in full, the second discounted by the new-token ratio."""
        full = discounted = 0
        for r in self.reqs:
            rem = min(r.sampling.max_new_tokens - len(r.output_ids), clip)
            if rem > 0:
                if r.sampling.ignore_eos:
                    full += rem
                else:
                    discounted += rem
        return full, discounted

    def progress(self) -> tuple[int, int]:
        """(output tokens so far, max_new_tokens) summed over the batch."""
        return sum(len(r.output_ids) for r in self.reqs), sum(r.max_new_tokens for r in self.reqs)

    def step_need(self, page: int) -> list[int]:
        """Slots each request must allocate before its next decode step (its row must cover
        ``[0, fill_len)``, in whole pages)."""
        return [max(ceil_page(r.fill_len, page) - len(r.kv_row), 0) for r in self.reqs]

    def retraction_order(self, policy: str, sign: int) -> list[Req]:
        """The running requests in ``policy``'s victim order: ``pop()`` is the next victim."""
        return retraction_order(self.reqs, [len(r.output_ids) for r in self.reqs], policy, sign)


def _by_length(reqs: list[Req], out_lens: list[int], by_priority: bool, sign: int) -> list[Req]:
    def key(i: int) -> tuple[Any, ...]:
        base = (out_lens[i], -len(reqs[i].prompt_ids))
        return (prio_value(reqs[i], sign) * -sign, *base) if by_priority else base

    return [reqs[i] for i in sorted(range(len(reqs)), key=key, reverse=True)]


# ``--retraction-policy``: length (SGLang's): the fewest output tokens, then the longest prompt;
# priority: the least important first, then as length; newest (vLLM's recompute preemption):
# the request that joined the batch last, its KV left matchable in the cache until evicted.
RETRACTION_ORDERS: dict[str, Callable[[list[Req], list[int], int], list[Req]]] = {
    "length": lambda reqs, out, sign: _by_length(reqs, out, False, sign),
    "priority": lambda reqs, out, sign: _by_length(reqs, out, True, sign),
    "newest": lambda reqs, out, sign: list(reqs),
}


def retraction_order(reqs: list[Req], out_lens: list[int], policy: str, sign: int) -> list[Req]:
    return RETRACTION_ORDERS[policy](reqs, out_lens, sign)  # ``pop()`` is the next victim

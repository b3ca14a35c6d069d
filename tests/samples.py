"""Per-request latency samples computed request by request, the simple way: what the run
summary's arrays (``results.reqarrays``) and the per-request rows are checked against."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from radixsched.request import Req
from radixsched.results.requests import _completed, _queue_wait, _ttft, token_gaps


def _tpot(done: Sequence[Req]) -> np.ndarray:
    return np.array(
        [
            (r.times.finish - r.times.first_token) / (r.output_len - 1)
            for r in done
            if r.output_len > 1 and r.times.first_token is not None and r.times.finish is not None
        ],
        dtype=np.float64,
    )


def ttft_samples(reqs: Iterable[Req]) -> np.ndarray:
    """TTFT of every completed request that produced a token (for CDFs)."""
    return _ttft(_completed(reqs))


def tpot_samples(reqs: Iterable[Req]) -> np.ndarray:
    """TPOT of every completed request with more than one output token."""
    return _tpot(_completed(reqs))


def itl_samples(reqs: Iterable[Req]) -> np.ndarray:
    """All gaps between consecutive token times within each completed request, pooled."""
    return token_gaps([r.times.token_times for r in _completed(reqs)])


def queue_wait_samples(reqs: Iterable[Req]) -> np.ndarray:
    return _queue_wait(_completed(reqs))

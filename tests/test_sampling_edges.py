"""Sampling parameters at the edge of float32 never produce NaN (found by schemathesis)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from radixsched.engine.sampling import sample_tokens  # noqa: E402
from radixsched.request import SamplingParams  # noqa: E402


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1e-300),
        SamplingParams(temperature=1.0, top_p=5e-324),
        SamplingParams(temperature=1e-30, top_p=1e-30, top_k=3),
    ],
)
def test_extreme_sampling_parameters_are_finite(params: SamplingParams) -> None:
    logits = torch.linspace(-3.0, 3.0, 64)[None]
    (tok,) = sample_tokens(logits, [params], [0], [0])
    assert tok == 63  # collapses to the most likely token

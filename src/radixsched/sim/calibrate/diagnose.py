"""What a fit's constants say about the model: a constant that ends at a bound of the fit is
not a measurement of the hardware but the fit compensating for something the replay gets
wrong. ``at_bounds`` names each such constant with the likeliest causes, for
``radixsched calibrate`` to print and the calibration file to record."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# How close to a bound (relative) a constant must end to count as stopped by it.
AT_BOUND_TOLERANCE = 0.01


@dataclass(frozen=True)
class Mismatch:
    """A constant that ended at a bound: its value, the bound, and what likely causes it."""

    constant: str
    value: float
    bound: float
    cause: str

    def describe(self) -> str:
        return (
            f"{self.constant} ended at its bound ({self.value:.4g}, bound {self.bound:.4g}): "
            f"a model mismatch, not a measurement. Likely: {self.cause}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_CAUSES = {
    "mfu": (
        "prefill ran faster than the GPU can compute it: the replay recomputes prompt "
        "tokens the server had cached (shared prefixes the benchmark sent, which the replay "
        "does not reproduce), or the runs were served on another GPU, TP degree or "
        "quantised model than the one given (--gpu, --tp, --model)"
    ),
    "mbu": (
        "decode steps were faster than reading the weights and KV at the GPU's bandwidth "
        "allows: quantised weights or KV cache (fp8, int4), speculative decoding, or another "
        "GPU or TP degree than the one given"
    ),
    "prefill_eff_tokens": (
        "small prefills cost far more than large ones: per-request CPU time the model puts "
        "in no term (tokenisation of long prompts, a gateway in front of the server)"
    ),
    "step_overhead_s": (
        "every step takes about a second more than modelled: the client measured something "
        "else than the server's step (a remote or overloaded client, network time)"
    ),
    "sched_per_req_s": (
        "each running request adds more CPU time per step than any scheduler spends: "
        "detokenisation or streaming of every request per step is slow (a Python front "
        "end at high concurrency), or another model size than the one given"
    ),
    "sched_per_prefill_s": (
        "each admitted request costs ~a second: a slow tokenizer or multimodal processing "
        "on the server's critical path"
    ),
    "request_latency_s": (
        "TTFT holds seconds no step explains: queueing in front of the server (a gateway, "
        "a rate limiter), or client and server clocks that disagree"
    ),
    "request_serial_s": (
        "the front end admits requests at most one per 50 ms: the front end itself is the "
        "bottleneck (a single-threaded tokenizer under a burst)"
    ),
}


def at_bounds(constants: dict[str, float], max_efficiency: float) -> list[Mismatch]:
    """Every fitted constant that ended at the upper bound the fit allowed it (within
    ``AT_BOUND_TOLERANCE``): efficiencies at ``max_efficiency``, times and the prefill size
    term at their largest. A time at 0 is no mismatch: the runs did not need it."""
    from radixsched.sim.calibrate.params import upper_bounds

    out = []
    for name, bound in upper_bounds(max_efficiency).items():
        value = constants.get(name)
        if value is not None and value >= bound * (1.0 - AT_BOUND_TOLERANCE):
            out.append(Mismatch(name, float(value), float(bound), _CAUSES[name]))
    return out

"""The constants a calibration fits, as the fit sees them: their names, their physical bounds
(``--max-efficiency``), the mapping between a constants dict and the fit's parameter vector,
and the fit's result."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
logger = logging.getLogger(__name__)

# Fitted parameters: a = 1/mfu, b = prefill_eff_tokens/mfu, c = 1/mbu, o, q, L, p, s (seconds).
_NAMES = (
    "a",
    "b",
    "c",
    "step_overhead_s",
    "sched_per_req_s",
    "request_latency_s",
    "sched_per_prefill_s",
    "request_serial_s",
)
_LOWER = np.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
_UPPER = np.array([1e4, 1e8, 1e4, 1.0, 0.1, 10.0, 1.0, 0.05])
# The most of the GPU's datasheet peak (mfu) and bandwidth (mbu) a fit may credit it with:
# large GEMMs reach ~80% of bf16 peak on H100, streaming copies ~90% of HBM bandwidth
# (``sim.cost.hardware``); a fit that wants more is compensating for something the replay
# gets wrong (``sim.calibrate.diagnose``). ``calibrate --max-efficiency`` widens it.
DEFAULT_MAX_EFFICIENCY = 0.9


def upper_bounds(max_efficiency: float) -> dict[str, float]:
    """The largest value the fit allows each constant (``sim.calibrate.diagnose``)."""
    times = {n: float(u) for n, u in zip(_NAMES, _UPPER, strict=True) if n.endswith("_s")}
    return {
        "mfu": max_efficiency,
        "mbu": max_efficiency,
        "prefill_eff_tokens": _MAX_PREFILL_EFF_TOKENS,
        **times,
    }


def param_bounds(max_efficiency: float) -> tuple[FloatArray, FloatArray]:
    """Lower and upper bounds of the fitted parameters: ``a = 1/mfu`` and ``c = 1/mbu`` at
    least ``1 / max_efficiency``."""
    if not 0.0 < max_efficiency <= 1.0:
        raise CalibrateError(f"max_efficiency must be in (0, 1], got {max_efficiency}")
    lower = _LOWER.copy()
    lower[0] = lower[2] = 1.0 / max_efficiency
    return lower, _UPPER.copy()


_SERIAL = _NAMES.index("request_serial_s")
_K = len(_NAMES)
_QUANTILES = (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0)
_MAX_PREFILL_EFF_TOKENS = 8192.0
FIT_START_PREFILL_EFF_TOKENS = 64.0
HUBER_DELTA = 0.1  # relative error beyond which a residual's weight falls off


class CalibrateError(ValueError):
    """Runs that cannot be calibrated on (nothing succeeded, unknown model, ...)."""


# ---- constants <-> parameters ------------------------------------------------------------


def _params(constants: dict[str, float]) -> FloatArray:
    a = 1.0 / constants["mfu"]
    return np.array(
        [
            a,
            constants["prefill_eff_tokens"] * a,
            1.0 / constants["mbu"],
            constants["step_overhead_s"],
            constants["sched_per_req_s"],
            constants["request_latency_s"],
            constants["sched_per_prefill_s"],
            constants["request_serial_s"],
        ]
    )


def _constants(theta: FloatArray, base: dict[str, float]) -> dict[str, float]:
    a, b, c, o, q, lat, qp, serial = (float(v) for v in theta)
    out = dict(base)
    out.update(
        mfu=min(1.0, 1.0 / a),
        mbu=min(1.0, 1.0 / c),
        prefill_eff_tokens=min(b / a, _MAX_PREFILL_EFF_TOKENS),
        step_overhead_s=o,
        sched_per_req_s=q,
        request_latency_s=lat,
        sched_per_prefill_s=qp,
        request_serial_s=serial,
    )
    return out


# ---- the fit --------------------------------------------------------------------------------


@dataclass
class FitResult:
    constants: dict[str, float]
    errors: list[dict[str, Any]]  # per run: compare() plus name
    iterations: int
    objective: float
    max_efficiency: float = DEFAULT_MAX_EFFICIENCY  # the bound mfu and mbu were fitted under

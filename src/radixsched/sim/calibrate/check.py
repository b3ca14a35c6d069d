"""Measured runs predicted with constants fixed beforehand (``radixsched calibrate --check``).

The constants are a calibration file's (fitted on other runs: another rate, another day,
another benchmark client) or the defaults an uncalibrated simulation uses. Nothing is fitted
to the runs checked, so their errors are what a user of those constants should expect on
them: out of sample, unlike a fit's own errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixsched.sim.calibrate.replay import Replay, predict
from radixsched.sim.cost.build import default_constants
from radixsched.sim.cost.calibration_file import check_fitted_on, read_calibration
from radixsched.sim.cost.hardware import GPUSpec
from radixsched.sim.cost.table import CalibrationError

DEFAULTS = "default"


def check_constants(
    source: str, gpu: GPUSpec, model: str, engine_mode: str | None
) -> tuple[dict[str, float], list[str]]:
    """The constants ``source`` names (``default``, or a calibration file with fitted
    constants, which replace the defaults they set) and warnings when that file was fitted
    on another model or GPU. ``CalibrationError`` for a file that cannot be read or that
    holds a step table (no constants to replay with)."""
    base = default_constants(gpu, engine_mode)
    if source == DEFAULTS:
        return base, []
    cal = read_calibration(source)
    if cal.table is not None or not cal.constants:
        raise CalibrationError(
            f"{source}: a step-time table, not fitted constants: --check replays with the "
            "constants a 'radixsched calibrate' run writes (simulate --calibration takes tables)"
        )
    return {**base, **cal.constants}, check_fitted_on(cal, model=model, gpu=gpu.name)


def predict_runs(replays: Sequence[Replay], constants: dict[str, float]) -> list[dict[str, Any]]:
    """Each run replayed with ``constants``, beside what was measured (``fit.compare``'s
    layout, as a fit reports its runs)."""
    return [predict(r, constants) for r in replays]

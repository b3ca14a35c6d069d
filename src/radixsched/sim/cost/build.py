"""One way to build the simulator's cost model: the specs by name, the roofline's constants
(defaults, flags, a calibration file), and the calibrated table when one is given."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from radixsched.sim.cost.hardware import GPUSpec, ModelSpec, PresetError, get_gpu
from radixsched.sim.cost.roofline import (
    CONSTANTS,
    DEFAULT_MEM_FRACTION_STATIC,
    CostModel,
    CostModelError,
)
from radixsched.sim.cost.table import CalibratedCostModel
from radixsched.sim.settings.simconfig import SimConfig, _ms, logger


def resolve_specs(
    gpu: str, model: str, context_length: int | None = None
) -> tuple[GPUSpec, ModelSpec]:
    """The GPU and model specs for names (presets, or a config.json path for the model),
    with the model's context limit replaced by ``context_length`` when given."""
    from radixsched.sim.cost.models import resolve_model

    try:
        gpu_spec, model_spec = get_gpu(gpu), resolve_model(model)
    except PresetError as exc:
        raise CostModelError(str(exc)) from None
    if context_length is not None:
        if context_length < 2:
            raise CostModelError(f"context_length must be >= 2, got {context_length}")
        model_spec = dataclasses.replace(model_spec, max_context_len=context_length)
    return gpu_spec, model_spec


def load_cost_model(
    *,
    gpu: str = "H100",
    model: str = "llama-3.1-8b",
    tp: int = 1,
    mfu: float | None = None,
    mbu: float | None = None,
    step_overhead_s: float | None = None,
    prefill_eff_tokens: float | None = None,
    sched_step_s: float | None = None,
    sched_per_req_s: float | None = None,
    sched_per_prefill_s: float | None = None,
    request_latency_s: float | None = None,
    request_serial_s: float | None = None,
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC,
    max_total_tokens: int | None = None,
    context_length: int | None = None,
    calibration: str | Path | None = None,
) -> CostModel | CalibratedCostModel:
    """The roofline model for preset names (case-insensitive) or a model's config.json.
    Constants left None take the calibration file's value (a fitted-constants file from
    ``radixsched calibrate``), else the defaults; a step-time table in the file (or a plain
    table file) calibrates step times. Raises ``CostModelError`` (unknown preset, bad numbers,
    a model that does not fit) or ``CalibrationError`` (a bad file); both are ``ValueError``s."""
    from radixsched.sim.cost.calibration_file import read_calibration

    gpu_spec, model_spec = resolve_specs(gpu, model, context_length)
    cal = None if calibration is None else read_calibration(calibration)
    given = {
        "mfu": mfu,
        "mbu": mbu,
        "step_overhead_s": step_overhead_s,
        "prefill_eff_tokens": prefill_eff_tokens,
        "sched_step_s": sched_step_s,
        "sched_per_req_s": sched_per_req_s,
        "sched_per_prefill_s": sched_per_prefill_s,
        "request_latency_s": request_latency_s,
        "request_serial_s": request_serial_s,
    }
    constants = dict(CONSTANTS)
    if cal is not None:
        constants.update(cal.constants)
    constants.update({k: v for k, v in given.items() if v is not None})
    base = CostModel(
        gpu_spec,
        model_spec,
        tp=tp,
        mem_fraction_static=mem_fraction_static,
        max_total_tokens=max_total_tokens,
        **constants,
    )
    base.kv_capacity_tokens()  # fail now, with the reason, if the model does not fit
    if cal is None or cal.table is None:
        return base
    return CalibratedCostModel(base, cal.table)


def build_cost_model(cfg: SimConfig) -> Any:
    """The cost model ``cfg`` describes; warns when its calibration file was fitted on
    another model or GPU."""
    from radixsched.sim.cost.calibration_file import check_fitted_on, read_calibration

    cost = load_cost_model(
        gpu=cfg.gpu,
        model=cfg.model,
        tp=cfg.tp,
        mfu=cfg.mfu,
        mbu=cfg.mbu,
        step_overhead_s=_ms(cfg.step_overhead_ms),
        prefill_eff_tokens=cfg.prefill_eff_tokens,
        sched_step_s=_ms(cfg.sched_step_ms),
        sched_per_req_s=_ms(cfg.sched_per_req_ms),
        sched_per_prefill_s=_ms(cfg.sched_per_prefill_ms),
        request_latency_s=_ms(cfg.request_latency_ms),
        request_serial_s=_ms(cfg.request_serial_ms),
        mem_fraction_static=cfg.mem_fraction_static,
        max_total_tokens=cfg.max_total_tokens,
        context_length=cfg.context_length,
        calibration=cfg.calibration,
    )
    if cfg.calibration is not None:
        cal = read_calibration(cfg.calibration)
        for warning in check_fitted_on(cal, model=cost.model.name, gpu=cost.gpu.name):
            if warning not in _WARNED:
                _WARNED.add(warning)
                logger.warning(warning)
    return cost


_WARNED: set[str] = set()

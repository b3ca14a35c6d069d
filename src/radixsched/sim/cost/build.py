"""One way to build the simulator's cost model: the specs by name, the roofline's constants
(defaults, flags, a calibration file), and the calibrated table when one is given."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixsched.sim.cost.hardware import GPUSpec, ModelSpec, PresetError, get_gpu
from radixsched.sim.cost.roofline import (
    CONSTANTS,
    DEFAULT_MEM_FRACTION_STATIC,
    CostModel,
    CostModelError,
)
from radixsched.sim.settings.simconfig import SimConfig, _ms, logger

if TYPE_CHECKING:  # the calibrated table (and its file readers) load only with a calibration
    from radixsched.sim.cost.table import CalibratedCostModel


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
    engine_mode: str | None = None,
) -> CostModel | CalibratedCostModel:
    """The roofline model for preset names (case-insensitive) or a model's config.json.
    Constants left None take the calibration file's value (a fitted-constants file from
    ``radixsched calibrate``), else the defaults (``default_constants``: the GPU's prefill
    curve, ``engine_mode``'s front-end latency); a step-time table in the file (or a plain
    table file) calibrates step times. Raises ``CostModelError`` (unknown preset, bad numbers,
    a model that does not fit) or ``CalibrationError`` (a bad file); both are ``ValueError``s."""
    gpu_spec, model_spec = resolve_specs(gpu, model, context_length)
    cal = None
    if calibration is not None:  # the file's readers (csv, the table) only for a file
        from radixsched.sim.cost.calibration_file import read_calibration

        cal = read_calibration(calibration)
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
    constants = default_constants(gpu_spec, engine_mode)
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
    from radixsched.sim.cost.table import CalibratedCostModel

    return CalibratedCostModel(base, cal.table)


def default_constants(gpu: GPUSpec, engine_mode: str | None) -> dict[str, float]:
    """The constants an uncalibrated run uses: the roofline's generic ones, the GPU's prefill
    efficiency curve where it has one (``hardware.PREFILL_CURVES``), and the engine mode's
    per-request front-end latency (``engine_modes.FRONTEND_LATENCY_S``; none without a
    mode, as the library's ``load_cost_model`` callers had it)."""
    from radixsched.sim.settings.engine_modes import FRONTEND_LATENCY_S

    constants = dict(CONSTANTS)
    if gpu.mfu is not None:
        constants["mfu"] = gpu.mfu
    if gpu.prefill_eff_tokens is not None:
        constants["prefill_eff_tokens"] = gpu.prefill_eff_tokens
    if engine_mode in FRONTEND_LATENCY_S:  # (an unknown mode: preflight says so)
        constants["request_latency_s"] = FRONTEND_LATENCY_S[engine_mode]
    return constants


# Cost models this process built, by what they were built from: a run builds its cost model
# once (the preflight, the header and every policy's simulation share it; forked workers
# inherit it). A cost model is never changed after it is built.
_BUILT: dict[tuple[Any, ...], CostModel | CalibratedCostModel] = {}
_BUILT_MAX = 64


def _cost_key(cfg: SimConfig) -> tuple[Any, ...] | None:
    """What the cost model of ``cfg`` depends on: its settings, and the calibration file's
    identity on disk (an edited file builds again); None when that file cannot be read."""
    fields = (
        cfg.gpu, cfg.model, cfg.tp, cfg.mfu, cfg.mbu, cfg.step_overhead_ms,
        cfg.prefill_eff_tokens, cfg.sched_step_ms, cfg.sched_per_req_ms,
        cfg.sched_per_prefill_ms, cfg.request_latency_ms, cfg.request_serial_ms,
        cfg.mem_fraction_static, cfg.max_total_tokens, cfg.context_length, cfg.calibration,
        cfg.engine_mode,  # (its front-end latency is a default constant)
    )  # fmt: skip
    if cfg.calibration is None:
        return fields
    try:
        st = Path(cfg.calibration).stat()
    except OSError:
        return None
    return (*fields, st.st_mtime_ns, st.st_size, st.st_ino)


def build_cost_model(cfg: SimConfig) -> CostModel | CalibratedCostModel:
    """The cost model ``cfg`` describes, built once per process for the same settings."""
    key = _cost_key(cfg)
    if key is None:  # an unreadable calibration file: its error is raised every time
        return _build_cost_model(cfg)
    cost = _BUILT.get(key)
    if cost is None:
        if len(_BUILT) >= _BUILT_MAX:
            _BUILT.clear()
        cost = _BUILT[key] = _build_cost_model(cfg)
    return cost


def _build_cost_model(cfg: SimConfig) -> CostModel | CalibratedCostModel:
    """The cost model ``cfg`` describes; warns when its calibration file was fitted on
    another model or GPU."""
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
        engine_mode=cfg.engine_mode,
    )
    if cfg.calibration is not None:
        from radixsched.sim.cost.calibration_file import check_fitted_on, read_calibration

        cal = read_calibration(cfg.calibration)
        for warning in check_fitted_on(cal, model=cost.model.name, gpu=cost.gpu.name):
            if warning not in _WARNED:
                _WARNED.add(warning)
                logger.warning(warning)
    return cost


_WARNED: set[str] = set()

"""Value checks for every setting: the ranges no other check covers, the coercion of config
file and flag values to their fields' types, and output paths. Below everything that uses them."""

from __future__ import annotations

import math
import os
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from radixsched.config import unwrap_optional

# Bounds that keep simulated times and sizes representable: a step or delay longer than an
# hour, an efficiency below the calibrator's smallest fit (1 / 1e4), a host tier over 1 PB.
MAX_MS = 3_600_000.0
MIN_EFFICIENCY = 1e-4
MAX_PREFILL_EFF_TOKENS = 1e6
MAX_HICACHE_GB = 1e6
MIN_LINK_GB_S = 1e-3


class Limit(NamedTuple):
    """The valid range of a numeric setting (None: unbounded on that side); NaN is never
    valid, infinity only where ``infinite`` (``inf`` meaning "never" or "unlimited")."""

    low: float | None
    high: float | None
    infinite: bool = False
    unit: str = ""

    def text(self, kind: str = "a number") -> str:
        """The range in words: ``an integer >= 1``, ``a number between 0 and 1``."""
        lo, hi, unit = self.low, self.high, self.unit
        if lo is not None and hi is not None:
            out = f"{kind} between {_num(lo)} and {_num(hi)}{unit}"
        elif lo is not None:
            out = f"{kind} >= {_num(lo)}{unit}"
        else:
            out = f"a finite {kind.split()[-1]} <= {_num(hi or 0.0)}{unit}"
        return out + (" (or inf)" if self.infinite else "")

    def allows(self, value: int | float) -> bool:
        if isinstance(value, float) and (
            math.isnan(value) or (math.isinf(value) and not self.infinite)
        ):
            return False
        if self.low is not None and value < self.low:
            return False
        return self.high is None or value <= self.high


def _num(x: float) -> str:
    """A bound as text: ``3,600,000``, ``0.0001``."""
    return f"{x:,.0f}" if x == int(x) else f"{x:g}"


_MS = Limit(None, MAX_MS, unit=" ms")  # below 0 (and NaN): the cost model's own check
_COUNT, _POSITIVE = Limit(0, None), Limit(1, None)
# The ranges that no other check covers (``SchedulerConfig``, ``CostModel`` and
# ``check_disaggregation`` check the rest with their own messages), by setting.
LIMITS: dict[str, Limit] = {
    "seed": _COUNT,
    "priority_scheduling_preemption_threshold": _COUNT,
    "max_prefix_match_queue": _COUNT,
    "in_batch_prefix_check_threshold": _COUNT,
    "in_batch_prefix_deprioritize_threshold": _COUNT,
    "lpm_max_wait_s": Limit(0, None, infinite=True, unit=" s"),
    "lpm_max_wait_tokens": _COUNT,
    "prefill_max_requests": _POSITIVE,
    "max_running_requests": _POSITIVE,
    "schedule_conservativeness": _COUNT,
    "clip_max_new_tokens": _COUNT,
    "init_new_token_ratio": _COUNT,
    "min_new_token_ratio_factor": _COUNT,
    "new_token_ratio_decay_steps": _POSITIVE,
    "retract_decode_steps": _COUNT,
    "mfu": Limit(MIN_EFFICIENCY, None),
    "mbu": Limit(MIN_EFFICIENCY, None),
    "step_overhead_ms": _MS,
    "sched_step_ms": _MS,
    "sched_per_req_ms": _MS,
    "sched_per_prefill_ms": _MS,
    "request_latency_ms": _MS,
    "request_serial_ms": _MS,
    "prefill_eff_tokens": Limit(None, MAX_PREFILL_EFF_TOKENS, unit=" tokens"),
    "prefill_delayer_max_delay_passes": _POSITIVE,
    "prefill_delayer_max_delay_ms": Limit(0, MAX_MS, unit=" ms"),
    "prefill_delayer_token_usage_low_watermark": Limit(0, 1),
    "prefill_delayer_queue_min_ratio": Limit(0, None, infinite=True),
    "disaggregation_link_bandwidth_gb_s": Limit(MIN_LINK_GB_S, None, infinite=True, unit=" GB/s"),
    "disaggregation_link_latency_ms": Limit(0, MAX_MS, unit=" ms"),
    "disaggregation_bootstrap_ms": Limit(0, MAX_MS, unit=" ms"),
    "hicache_size": Limit(0, MAX_HICACHE_GB, unit=" GB"),
    "hicache_page_size": _POSITIVE,
}


class RunConfigError(ValueError):
    """An invalid setting; the message is one line naming the key."""


def parse_rate(value: Any, name: str = "request_rate") -> float | None:
    """A request rate: a positive number or ``inf``; None stays None (see ``RATE_RULE``)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(value, bool):
        raise RunConfigError(f"{name} must be a number or 'inf', got {value!r}")
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise RunConfigError(f"{name} must be a number or 'inf', got {value!r}") from None
    if not rate > 0:
        raise RunConfigError(f"{name} must be > 0 (or inf), got {value!r}")
    return rate


# ---- values ----------------------------------------------------------------------------------


def coerce(cls: type[Any], name: str, value: Any, where: str) -> Any:
    """``value`` as the type of field ``name`` of ``cls`` (YAML gives typed values, flags
    strings), within its ``LIMITS``; ``RunConfigError`` naming ``where`` otherwise."""
    out = _coerce(cls, name, value, where)
    limit = LIMITS.get(name)
    number = isinstance(out, int | float) and not isinstance(out, bool)
    if limit is not None and number and not limit.allows(out):
        kind = "an integer" if isinstance(out, int) else "a number"
        raise RunConfigError(f"{where}: must be {limit.text(kind)}, got {value!r}")
    return out


def _coerce(cls: type[Any], name: str, value: Any, where: str) -> Any:
    tp, optional = unwrap_optional(typing.get_type_hints(cls)[name])
    if value is None or (isinstance(value, str) and value.lower() == "none" and optional):
        if optional:
            return None
        raise RunConfigError(f"{where}: a value is required")
    if typing.get_origin(tp) is Literal:
        allowed = [str(a) for a in typing.get_args(tp)]
        if str(value) not in allowed:
            raise RunConfigError(
                f"{where}: expected one of {', '.join(allowed)}, got {value!r}"
                + suggest(str(value), allowed)
            )
        return str(value)
    if tp is bool:
        return _bool(value, where)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value))
        except ValueError:
            raise RunConfigError(f"{where}: expected an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        try:
            return float(str(value))
        except ValueError:
            raise RunConfigError(f"{where}: expected a number, got {value!r}") from None
    if isinstance(value, dict | list):
        raise RunConfigError(f"{where}: expected a single value, got {value!r}")
    return str(value)


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise RunConfigError(f"{where}: expected true or false, got {value!r}")


def _positive_ms(value: Any, where: str) -> float | None:
    if value is None:
        return None
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise RunConfigError(f"{where}: expected milliseconds, got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(ms) and ms > 0):
        raise RunConfigError(f"{where}: must be a positive number of milliseconds, got {value!r}")
    return ms


def _int_or_none(value: Any, where: str, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise RunConfigError(f"{where}: expected an integer, got {value!r}")
    try:
        n = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        n = None
    if n is None:
        raise RunConfigError(f"{where}: expected an integer, got {value!r}")
    if n < minimum:
        raise RunConfigError(f"{where}: must be >= {minimum}, got {value!r}")
    return n


# ---- checking --------------------------------------------------------------------------------


def check_output_path(key: str, path: str) -> str | None:
    """Why ``path`` cannot be written (its folder missing or read-only, a folder itself), or
    None. Nothing is created."""
    if not path.strip():
        return f"{key}: expected a file path, got an empty one"
    p = Path(path)
    if p.is_dir():
        return f"{key} {path}: is a directory"
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        return f"{key} {path}: folder {parent} does not exist"
    if not parent.is_dir():
        return f"{key} {path}: {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{key} {path}: folder {parent} is not writable"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{key} {path}: file is not writable"
    return None


def suggest(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or nothing."""
    import difflib  # here: only a mistake needs it

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""

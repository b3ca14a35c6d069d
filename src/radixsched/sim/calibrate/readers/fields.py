"""Checked reading of a result file's fields: every failure a ``ResultFileError`` naming the
file, the place in it and the field."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from radixsched.sim.calibrate.runs import MeasuredRequest, ResultFileError

# One request's prompt or output beyond this many tokens is no measurement (no model's
# context holds it): a corrupt file, which a replay would try to allocate.
MAX_TOKENS = 1 << 24
# Timestamps of one request may disagree by this much (rounded token times) and still count
# as in order.
_TIME_SLACK_S = 1e-6


def _show(value: Any) -> str:
    """``value`` for a message: JSON's null as such, anything long cut short."""
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    """The JSON type of ``value``, for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = ((Mapping, "an object"), (list, "an array"), (str, "a string"))
    return next((name for t, name in kinds if isinstance(value, t)), "a number")


def _bad(where: str, field: str, expected: str, value: Any) -> ResultFileError:
    return ResultFileError(f"{where}: field {field!r}: expected {expected}, got {_show(value)}")


def _number(value: Any, where: str, field: str) -> float:
    """A finite number (JSON's NaN and Infinity, booleans and strings are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(where, field, "a number", value)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _bad(where, field, "a finite number", value)
    return number


def _count(value: Any, where: str, field: str, minimum: int) -> int:
    """A whole number of tokens in ``[minimum, MAX_TOKENS]``."""
    number = _number(value, where, field)
    if not number.is_integer() or not minimum <= number <= MAX_TOKENS:
        raise _bad(where, field, f"a whole number from {minimum} to {MAX_TOKENS}", value)
    return int(number)


def _rate(value: Any, where: str, field: str) -> float:
    """Requests/s: a positive number, or ``inf`` (also null, "inf", "trace": all at once)."""
    if value is None or value in ("inf", "Infinity", "trace"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _bad(where, field, "a positive number or 'inf'", value)
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        return math.inf


def _concurrency(value: Any, where: str, field: str) -> int | None:
    """A max concurrency: a whole number >= 1, or null (none)."""
    if value is None:
        return None
    number = _number(value, where, field)
    if not number.is_integer() or number < 1:
        raise _bad(where, field, "a whole number >= 1 or null", value)
    return int(number)


def _object(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """``doc[key]``, an object; absent or null: an empty one."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad(where, key, "an object", value)
    return value


def _list(doc: Mapping[str, Any], key: str, where: str) -> list[Any] | None:
    """``doc[key]``, a list; absent or null: None."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad(where, key, "a list", value)
    return value


def _optional(doc: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    """``doc[key]`` when it is null, absent or a ``kind`` (not a bool)."""
    value = doc.get(key)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise _bad(where, key, f"{'a string' if kind is str else 'a whole number'} or null", value)


def _request(
    where: str,
    prompt_len: int,
    output_len: int,
    ttft_s: float,
    e2e_s: float,
    sent: float | None,
    cached: int | None = None,
) -> MeasuredRequest:
    """A measured request whose times are in order (first token after the send, finish
    after the first token)."""
    if ttft_s < -_TIME_SLACK_S:
        raise ResultFileError(f"{where}: first token {ttft_s:.6g} s before the request was sent")
    if e2e_s < ttft_s - _TIME_SLACK_S:
        raise ResultFileError(
            f"{where}: finished {e2e_s:.6g} s after the send, before its first token "
            f"({ttft_s:.6g} s)"
        )
    ttft_s = max(ttft_s, 0.0)
    return MeasuredRequest(prompt_len, output_len, ttft_s, max(e2e_s, ttft_s), sent, cached)

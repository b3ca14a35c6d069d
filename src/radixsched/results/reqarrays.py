"""A finished run's requests as numpy columns, read in one pass (``RequestArrays``), and what a
run's summary takes from them: latency samples, token totals, hit rates, the load check's inputs.

Every value is the one the per-request Python in ``results.requests`` and ``results.service``
gives, bit for bit: each sample is the same IEEE operation on the same float64 operands (a
Python float is a float64; an int is converted exactly, as Python's ``float / int`` does), and
the requests keep their order, so a mean over the samples adds the same numbers in the same
order. Integer totals are exact int64 sums. ``tests/test_reqarrays.py`` compares the two."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from radixsched.native import core
from radixsched.request import FinishReason, Req
from radixsched.results.gapstats import gap_stats
from radixsched.results.requests import HitRates, hit_rates_of, token_gaps
from radixsched.results.stats import FloatArray, Stats

BoolArray: TypeAlias = npt.NDArray[np.bool_]
IntArray: TypeAlias = npt.NDArray[np.int64]

# A request's finish, as ``RequestArrays.of`` codes it.
_RUNNING, _ENDED, _ABORTED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class RequestArrays:
    """One entry per request, in the order given. A time a request never reached is NaN, and
    its mask (``scheduled``, ``has_token``, ``has_finish``) is False there: the masks, not the
    NaNs, say which times exist."""

    arrival: FloatArray
    first_scheduled: FloatArray
    first_token: FloatArray
    finish: FloatArray
    scheduled: BoolArray
    has_token: BoolArray
    has_finish: BoolArray
    completed: BoolArray  # finished without an abort, with a finish time (``_completed``)
    aborted: BoolArray  # finished by an abort (rejected at the door or later)
    prompt_len: IntArray
    output_len: IntArray
    cached: IntArray
    host_cached: IntArray
    computed: IntArray
    num_tenants: int  # distinct ``tenant_key`` values
    # The completed requests' token times, in order (their only per-token data).
    token_times: list[list[float]]

    @classmethod
    def of(cls, reqs: Sequence[Req]) -> RequestArrays:
        """The columns of ``reqs``: read natively in one pass (``_native_of``) where the
        core has ``request_columns`` and takes every value, else field by field."""
        native = _native_of(reqs)
        return native if native is not None else cls._of(reqs)

    @classmethod
    def _of(cls, reqs: Sequence[Req]) -> RequestArrays:
        # Field by field, each a list of numbers: no object per request that the cyclic
        # collector tracks (a tuple per request would start its passes here, over the run's
        # young objects: a gen-2 pass took 32 ms at the end of a run).
        abort = FinishReason.ABORT  # a local: enum member lookup is slow in a long loop
        times = [r.times for r in reqs]
        first_scheduled, scheduled = _times([t.first_scheduled for t in times])
        first_token, has_token = _times([t.first_token for t in times])
        finish, has_finish = _times([t.finish for t in times])
        code = np.array(
            [
                _RUNNING if r.finish is None else _ABORTED if r.finish.reason is abort else _ENDED
                for r in reqs
            ],
            dtype=np.int8,
        )
        completed = (code == _ENDED) & has_finish
        return cls(
            arrival=np.fromiter([t.arrival for t in times], dtype=np.float64, count=len(times)),
            first_scheduled=first_scheduled,
            first_token=first_token,
            finish=finish,
            scheduled=scheduled,
            has_token=has_token,
            has_finish=has_finish,
            completed=completed,
            aborted=code == _ABORTED,
            prompt_len=_ints([len(r.prompt_ids) for r in reqs]),  # ``prompt_len``, no call
            output_len=_ints([len(r.output_ids) for r in reqs]),  # ``output_len``
            cached=_ints([r.cached_tokens for r in reqs]),
            host_cached=_ints([r.host_cached_tokens for r in reqs]),
            computed=_ints([r.computed_prefill_tokens for r in reqs]),
            num_tenants=len({r.tenant_key for r in reqs}),
            token_times=[t.token_times for t in itertools.compress(times, completed.tolist())],
        )

    # ---- samples of the completed requests (``results.requests``' ``_x(done)``) ----------

    def ttft(self) -> FloatArray:
        m = self.completed & self.has_token
        return self.first_token[m] - self.arrival[m]

    def tpot(self) -> FloatArray:
        """Requests with more than one output token: (finish - first token) / (tokens - 1)."""
        m = self.completed & self.has_token & (self.output_len > 1)
        # int64 - 1 then to float64 in the division: Python's ``float / int`` converts the
        # same int exactly (token counts are far below 2**53).
        return (self.finish[m] - self.first_token[m]) / (self.output_len[m] - 1)

    def e2e(self) -> FloatArray:
        m = self.completed  # a completed request has a finish time
        return self.finish[m] - self.arrival[m]

    def queue_wait(self) -> FloatArray:
        m = self.completed & self.scheduled
        return self.first_scheduled[m] - self.arrival[m]

    def service(self) -> FloatArray:
        """Time from first scheduled to finish (``LoadCheck.service_s``' sample)."""
        m = self.completed & self.scheduled
        return self.finish[m] - self.first_scheduled[m]

    def itl(self) -> FloatArray:
        return token_gaps(self.token_times)

    def itl_stats(self) -> Stats:
        """``Stats.of(self.itl(), consume=True)``, bit for bit, without the array of every gap
        where there are millions (``results.gapstats``)."""
        return gap_stats(self.token_times)

    def completed_finishes(self) -> FloatArray:
        return self.finish[self.completed]

    # ---- totals -------------------------------------------------------------------------

    @property
    def num_requests(self) -> int:
        return int(self.arrival.size)

    @property
    def num_completed(self) -> int:
        return int(np.count_nonzero(self.completed))

    def makespan(self) -> float:
        """Last completed finish minus first arrival (0.0 with neither)."""
        finishes = self.completed_finishes()
        if not (finishes.size and self.arrival.size):
            return 0.0
        return float(finishes.max()) - float(self.arrival.min())

    def hit_rates(self) -> HitRates:
        """``results.requests.hit_rates``: over the requests that were scheduled."""
        s = self.scheduled
        cached = int(self.cached[s].sum())
        host = int(self.host_cached[s].sum())
        prompt = int(self.prompt_len[s].sum())
        return hit_rates_of(cached, host, prompt)

    def backlog(self, last_arrival: float) -> int:
        """Requests started after ``last_arrival``, or never started and not aborted."""
        late = self.scheduled & (self.first_scheduled > last_arrival)
        return int(np.count_nonzero(late | (~self.scheduled & ~self.aborted)))


def _native_of(reqs: Sequence[Req]) -> RequestArrays | None:
    """``RequestArrays._of(reqs)``, its columns read in one native pass (``request_columns``,
    ``_native/bulk.hpp``: each value as numpy converts it, bit for bit); None without the
    core, or where a value is not exactly a float (a time: or None) or an int in int64's
    range, which ``_of`` converts."""
    read = getattr(core(), "request_columns", None)
    if read is None:
        return None
    n = len(reqs)
    times = np.empty((4, n), dtype=np.float64)  # arrival, first scheduled, first token, finish
    present = np.empty((3, n), dtype=np.bool_)  # the last three's masks
    code = np.empty(n, dtype=np.int8)
    ints = np.empty((5, n), dtype=np.int64)  # prompt, output, cached, host cached, computed
    out = read(reqs, FinishReason.ABORT, times, present, code, ints)
    if out is None:
        return None
    tenants, token_times = out
    completed = (code == _ENDED) & present[2]
    return RequestArrays(
        times[0], times[1], times[2], times[3], present[0], present[1], present[2],
        completed, code == _ABORTED, ints[0], ints[1], ints[2], ints[3], ints[4], tenants,
        token_times,
    )  # fmt: skip


def _ints(values: list[int]) -> IntArray:
    return np.array(values, dtype=np.int64)


def _times(values: Sequence[float | None]) -> tuple[FloatArray, BoolArray]:
    """``values`` as float64, NaN for None, and where they are not None: where the array is
    not NaN, and at a NaN whether its value was one (only NaNs ask the list)."""
    arr = np.array(values, dtype=np.float64)
    nans = np.flatnonzero(np.isnan(arr)).tolist()
    present = np.ones(arr.size, dtype=np.bool_)
    present[nans] = [values[k] is not None for k in nans]
    return arr, present

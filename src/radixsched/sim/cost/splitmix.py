"""SplitMix64: the deterministic 64-bit mixer behind generated tokens and stand-in outputs."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# ---- the runner ------------------------------------------------------------------------


_GOLDEN_INT = 0x9E3779B97F4A7C15
_MIX1_INT, _MIX2_INT = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(_GOLDEN_INT)
_MIX1, _MIX2 = np.uint64(_MIX1_INT), np.uint64(_MIX2_INT)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)
# The same constants as 0-d arrays: a ufunc takes them faster than numpy scalars.
_GOLDEN_0D, _MIX1_0D, _MIX2_0D = (np.array(c, dtype=np.uint64) for c in (_GOLDEN, _MIX1, _MIX2))
_S27_0D, _S30_0D, _S31_0D = (np.array(c, dtype=np.uint64) for c in (_S27, _S30, _S31))


def splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """A strong 64-bit mixer (wrapping uint64 arithmetic on arrays), used for hashed tokens."""
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    result: npt.NDArray[np.uint64] = z ^ (z >> _S31)
    return result


def _splitmix64_inplace(z: npt.NDArray[np.uint64]) -> None:
    """``z[...] = splitmix64(z)`` for a uint64 array, with one temporary instead of seven."""
    np.add(z, _GOLDEN_0D, out=z)
    t = np.right_shift(z, _S30_0D)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _MIX1_0D, out=z)
    np.right_shift(z, _S27_0D, out=t)
    np.bitwise_xor(z, t, out=z)
    np.multiply(z, _MIX2_0D, out=z)
    np.right_shift(z, _S31_0D, out=t)
    np.bitwise_xor(z, t, out=z)


def _splitmix64_int(x: int) -> int:
    """``splitmix64`` of one value in ``[0, 2**64)`` on Python ints, masked to 64 bits after
    every operation that can carry past them: the same value as the uint64 array path."""
    z = (x + _GOLDEN_INT) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1_INT) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2_INT) & _MASK64
    return z ^ (z >> 31)

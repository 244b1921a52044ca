"""Numba scalar namespace (see :mod:`popplay.xp`)."""
from __future__ import annotations

import math
from typing import Callable

import numba
import numpy as np

vectorized = False


def fn(function: Callable) -> Callable:
    """Compile a rule piece for use inside numba kernels (cached on disk)."""
    return numba.njit(cache=True, inline="never")(function)


# numba marks signed int64 add/mul "no signed wrap", so LLVM may assume hash
# arithmetic never overflows and fold it wrongly; unsigned ops wrap by definition.
@numba.njit(cache=True)
def add64(a, b):
    return np.int64(np.uint64(a) + np.uint64(b))


@numba.njit(cache=True)
def mul64(a, b):
    return np.int64(np.uint64(a) * np.uint64(b))


@numba.njit(cache=True)
def to_float(x):
    return float(x)


@numba.njit(cache=True)
def to_int(x):
    return np.int64(x)


@numba.njit(cache=True)
def floor(x):
    return np.floor(x)


@numba.njit(cache=True)
def frexp(x):
    return math.frexp(x)


@numba.njit(cache=True)
def ldexp(m, e):
    return math.ldexp(m, e)


@numba.njit(cache=True)
def where(condition, a, b):
    return a if condition else b


@numba.njit(cache=True)
def abs(x):  # noqa: A001 - mirrors the torch name
    return -x if x < 0 else x


@numba.njit(cache=True)
def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))

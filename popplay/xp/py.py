"""Plain Python scalar namespace, for the slow reference implementations."""
from __future__ import annotations

import math
from typing import Callable

vectorized = False
_MASK = (1 << 64) - 1


def fn(function: Callable) -> Callable:
    return function


def _wrap(x: int) -> int:
    """Reduce a Python int to the signed 64-bit value numba and torch would hold."""
    x &= _MASK
    return x - (1 << 64) if x >> 63 else x


def add64(a: int, b: int) -> int:
    return _wrap(a + b)


def mul64(a: int, b: int) -> int:
    return _wrap(a * b)


def to_float(x: int) -> float:
    return float(x)


def to_int(x: float) -> int:
    return int(x)


def floor(x: float) -> float:
    return float(math.floor(x))


frexp = math.frexp


def ldexp(m: float, e: int) -> float:
    return math.ldexp(m, int(e))


def where(condition: bool, a, b):
    return a if condition else b


def abs(x):  # noqa: A001
    return -x if x < 0 else x


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))

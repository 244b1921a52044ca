"""NumPy array namespace (see :mod:`popplay.xp`): the torch rules' vectorised twin for
set-up work (stream keys, arm means) that must not pay for importing torch."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

vectorized = True


def fn(function: Callable) -> Callable:
    return function


# NumPy's int64 array arithmetic wraps modulo 2**64 like torch's; only its scalar path
# warns about the wrap, which is the point of the hash.
def add64(a: Any, b: Any) -> Any:
    with np.errstate(over="ignore"):
        return np.add(a, b, dtype=np.int64)


def mul64(a: Any, b: Any) -> Any:
    with np.errstate(over="ignore"):
        return np.multiply(a, b, dtype=np.int64)


def to_float(x: Any) -> Any:
    return np.asarray(x).astype(np.float64)


def to_int(x: Any) -> Any:
    return np.asarray(x).astype(np.int64)


floor = np.floor
frexp = np.frexp
ldexp = np.ldexp
where = np.where
abs = np.abs  # noqa: A001


# Array plumbing for rules that run a state machine over pending lanes (the ziggurat).
def broadcast(*arrays: Any) -> tuple[Any, ...]:
    return tuple(np.broadcast_arrays(*arrays))


def nonzero(mask: Any) -> tuple[Any, ...]:
    return np.nonzero(mask)


def size(x: Any) -> int:
    return x.size


def arange(n: int, like: Any) -> Any:
    return np.arange(n)


def empty_float(like: Any) -> Any:
    return np.empty(like.shape, dtype=np.float64)


def zeros_bool(like: Any) -> Any:
    return np.zeros(like.shape, dtype=bool)


zeros_like = np.zeros_like


def zeros_float(like: Any) -> Any:
    return np.zeros(like.shape, dtype=np.float64)


def compact(mask: Any, capacity: int) -> tuple[Any, Any, Any]:
    """As :func:`popplay.xp.th.compact` (NumPy knows the count anyway)."""
    true = np.flatnonzero(mask)
    lanes = np.zeros(capacity, dtype=np.int64)
    used = min(true.size, capacity)
    lanes[:used] = true[:used]
    return lanes, np.arange(capacity) < used, np.bool_(true.size > capacity)


def flat_take(x: Any, lanes: Any) -> Any:
    return np.asarray(x).reshape(-1)[lanes]


def flat_put(x: Any, lanes: Any, valid: Any, values: Any) -> Any:
    out = np.array(x, copy=True)
    out.reshape(-1)[lanes[valid]] = values[valid]
    return out


def table(values: Any) -> Any:
    """A float64 look-up table indexed by arrays."""
    return np.asarray(values, dtype=np.float64)


def sigmoid(x: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-x))

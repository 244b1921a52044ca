"""Population operators: functions over batched arrays whose agent axis is axis -2.

Each operator accepts NumPy arrays (run by a numba kernel) or torch tensors (run by
torch on their device) and returns new arrays of the same kind; inputs are never
modified.
"""
from __future__ import annotations

from typing import Any, TypeVar

import numba
import numpy as np
from numba import prange

from popplay.xp import nb, th

Array = TypeVar("Array", np.ndarray, Any)


def make_merge(xp: Any) -> Any:
    """The weighted-mean rule shared by every merge: Σ w·v / Σ w, or the plain mean
    of the values where all weights are zero."""

    @xp.fn
    def merge(weighted_sum, weight_sum, plain_mean):
        return xp.where(weight_sum > 0.0, weighted_sum / xp.where(weight_sum > 0.0, weight_sum, 1.0),
                        plain_mean)

    return merge


_merge_nb = make_merge(nb)
_merge_th = make_merge(th)


@numba.njit(cache=True, parallel=True)
def _share_counts_kernel(values, counts, out_values, out_counts):
    blocks, agents, arms = values.shape
    for index in prange(blocks * arms):
        b = index // arms
        a = index - b * arms
        n_total = 0.0
        weighted = 0.0
        plain = 0.0
        for i in range(agents):
            n_total += counts[b, i, a]
            weighted += counts[b, i, a] * values[b, i, a]
            plain += values[b, i, a]
        q_total = _merge_nb(weighted, n_total, plain / agents)
        for i in range(agents):
            out_values[b, i, a] = q_total
            out_counts[b, i, a] = n_total / agents


def share_counts(values: Array, counts: Array) -> tuple[Array, Array]:
    """Count-weighted sharing, Bell's equations (1)–(4), over the agent axis.

    For every arm j of every block (all leading axes)::

        n_total(j) = Σ_i n_i(j)                            (1)
        Q_total(j) = Σ_i n_i(j) Q_i(j) / Σ_i n_i(j)        (2)
        Q_i(j) ← Q_total(j)                                (3)
        n_i(j) ← n_total(j) / P                            (4)

    so the total count over agents is preserved. Where no agent has pulled an arm,
    Q_total is the plain mean of the agents' values.

    Args:
        values: estimates Q, shaped (..., agents, arms), float.
        counts: pull counts n, same shape, non-negative.

    Returns:
        ``(values, counts)`` after sharing, new arrays of the input kind and shape.
    """
    _check_pair(values, counts, "counts")
    if _is_torch(values):
        import torch

        agents = values.shape[-2]
        n_total = counts.sum(dim=-2, keepdim=True)
        weighted = (counts * values).sum(dim=-2, keepdim=True)
        q_total = _merge_th(weighted, n_total, values.mean(dim=-2, keepdim=True))
        return q_total.expand_as(values).clone(), torch.broadcast_to(n_total / agents, counts.shape).clone()
    v = np.ascontiguousarray(values, dtype=np.float64)
    n = np.ascontiguousarray(counts, dtype=np.float64)
    if (n < 0).any():
        raise ValueError("counts must be non-negative")
    flat_v = v.reshape((-1,) + v.shape[-2:])
    flat_n = n.reshape(flat_v.shape)
    out_v = np.empty_like(flat_v)
    out_n = np.empty_like(flat_n)
    _share_counts_kernel(flat_v, flat_n, out_v, out_n)
    return out_v.reshape(v.shape), out_n.reshape(n.shape)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _check_pair(values: Any, weights: Any, weight_name: str) -> None:
    if _is_torch(values) != _is_torch(weights):
        raise TypeError(f"values and {weight_name} must both be NumPy arrays or both torch tensors")
    if tuple(values.shape) != tuple(weights.shape):
        raise ValueError(
            f"values and {weight_name} must have the same shape (got {tuple(values.shape)} "
            f"and {tuple(weights.shape)})"
        )
    if len(values.shape) < 2:
        raise ValueError("values must have at least two axes (..., agents, items)")
    if values.shape[-2] < 1:
        raise ValueError("the agent axis (-2) must not be empty")

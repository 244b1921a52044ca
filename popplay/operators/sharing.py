"""Population operators: functions over batched arrays whose agent axis is axis -2.

Each operator accepts NumPy arrays (run by a numba kernel) or torch tensors (run by
torch on their device) and returns new arrays of the same kind; inputs are never
modified.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, TypeVar

import numba
import numpy as np
from numba import prange

from popplay.rng import make_rng
from popplay.xp import nb

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
        import torch  # defers torch

        if bool((counts < 0).any()):
            raise ValueError("counts must be non-negative")
        agents = values.shape[-2]
        n_total = counts.sum(dim=-2, keepdim=True)
        weighted = (counts * values).sum(dim=-2, keepdim=True)
        q_total = _torch_rules().merge(weighted, n_total, values.mean(dim=-2, keepdim=True))
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


# ---------------------------------------------------------------------------
# Weighted sharing and differentiation (Bell §2.3–2.4, equations (5)–(10))
#
# Sums over agents follow one fixed pairwise tree (pairs (0, 1), (2, 3), … at every
# level, an odd last element carried up unchanged), on NumPy and on torch alike, so
# both give the same bits whatever the device: float sums depend on their order.


def _tree_sum_th(x: Any) -> Any:
    """The same tree over axis -2 of a tensor; keeps that axis (length 1)."""
    import torch  # defers torch

    while x.shape[-2] > 1:
        n = x.shape[-2]
        half = n // 2
        pairs = x[..., 0:2 * half:2, :] + x[..., 1:2 * half:2, :]
        x = torch.cat([pairs, x[..., 2 * half:, :]], dim=-2) if n % 2 else pairs
    return x


@numba.njit(cache=True)
def _tree_sums(values, weights, b, first, width, use_products, out):
    """out[:width] = tree sums over agents of values·weights (``use_products``) or of
    values, and out[width:2 width] = those of weights, for items first .. first +
    width - 1 of block b. Each agent's row segment is read once, contiguously."""
    agents = values.shape[1]
    depth = 1
    while (1 << (depth - 1)) < agents:
        depth += 1
    stack = np.empty((depth, 2 * width))
    term = np.empty(2 * width)
    top = 0
    for i in range(agents):
        for c in range(width):
            v = values[b, i, first + c]
            wt = weights[b, i, first + c]
            term[c] = v * wt if use_products else v
            term[width + c] = wt
        m = i
        while m & 1:
            top -= 1
            for c in range(2 * width):
                term[c] = stack[top, c] + term[c]
            m >>= 1
        for c in range(2 * width):
            stack[top, c] = term[c]
        top += 1
    for c in range(2 * width):
        out[c] = stack[top - 1, c]
    for level in range(top - 2, -1, -1):
        for c in range(2 * width):
            out[c] = stack[level, c] + out[c]


@numba.njit(cache=True, parallel=True)
def _share_weighted_kernel(values, weights, initial_weight, parts, out_values, out_weights):
    """Equations (6)-(8) with the tree sums streamed over agents: a binary counter of
    partial sums (adding agent i merges as many subtrees as i has trailing one bits,
    left operand first, and the leftovers merge right to left at the end) forms the
    very tree described above, reading each agent's row once. Each block's items are
    split into ``parts`` tasks (threads for a single block). The plain sum of the
    values is taken (a second pass) only where an item has no weight at all."""
    blocks, agents, items = values.shape
    inv_agents = 1.0 / agents
    for index in prange(blocks * parts):
        b = index // parts
        part = index - b * parts
        first = part * items // parts
        width = (part + 1) * items // parts - first
        if width == 0:
            continue
        sums = np.empty(2 * width)
        plain = np.zeros(2 * width)
        _tree_sums(values, weights, b, first, width, True, sums)
        unweighted = False
        for c in range(width):
            unweighted |= not sums[width + c] > 0.0
        if unweighted:
            _tree_sums(values, weights, b, first, width, False, plain)
        for c in range(width):
            sums[c] = _merge_nb(sums[c], sums[width + c], plain[c] * inv_agents)
        for i in range(agents):
            for c in range(width):
                out_values[b, i, first + c] = sums[c]
                out_weights[b, i, first + c] = initial_weight


def share_weighted(values: Array, weights: Array, initial_weight: float,
                   out: tuple[Array, Array] | None = None) -> tuple[Array, Array]:
    """Weight-averaged sharing, Bell's equations (6)–(8), over the agent axis.

    During learning each agent grows a weight per state-action, wgt_i(s, a) +=
    α e_i(s, a) (equation (5), the learner's job). Sharing then sets, for every item
    of every block (all leading axes)::

        Q_total = Σ_i Q_i wgt_i / Σ_i wgt_i      (6)
        Q_i ← Q_total                            (7)
        wgt_i ← initial_weight                   (8)

    Where all weights of an item are zero, Q_total is the plain mean. Sums over
    agents use a fixed pairwise tree, so NumPy and torch results are bit-identical.

    Args:
        values: Q values shaped (..., agents, items), float.
        weights: sharing weights, same shape, non-negative.
        initial_weight: the weight every agent restarts from (>= 0).
        out: optional ``(values, weights)`` arrays of the same kind and shape to
            write the results into (they may be the inputs: sharing in place).

    Returns:
        ``(values, weights)`` after sharing: new arrays of the input kind and shape,
        or ``out``.
    """
    _check_pair(values, weights, "weights")
    initial_weight = float(initial_weight)
    if not (initial_weight >= 0.0 and np.isfinite(initial_weight)):
        raise ValueError(f"initial_weight must be non-negative and finite (got {initial_weight!r})")
    if out is not None:
        for target in out:
            _check_pair(values, target, "out")
    if _is_torch(values):
        import torch  # defers torch

        if bool((weights < 0).any()):
            raise ValueError("weights must be non-negative")
        v64 = values.to(torch.float64)
        w64 = weights.to(torch.float64)
        agents = values.shape[-2]
        q_total = _torch_rules().merge(_tree_sum_th(v64 * w64), _tree_sum_th(w64), _tree_sum_th(v64) * (1.0 / agents))
        if out is None:
            return q_total.expand_as(v64).clone(), torch.full_like(w64, initial_weight)
        out[0].copy_(q_total.expand_as(v64))
        out[1].fill_(initial_weight)
        return out[0], out[1]
    v = np.ascontiguousarray(values, dtype=np.float64)
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if (w < 0).any():
        raise ValueError("weights must be non-negative")
    flat_v = v.reshape((-1,) + v.shape[-2:])
    flat_w = w.reshape(flat_v.shape)
    if out is None:
        out_v, out_w = np.empty_like(flat_v), np.empty_like(flat_w)
    else:
        out_v, out_w = (_flat_out(target, flat_v.shape) for target in out)
    # A single block is split over the threads; many blocks already keep them busy.
    parts = max(1, min(flat_v.shape[-1], numba.get_num_threads() // flat_v.shape[0]))
    _share_weighted_kernel(flat_v, flat_w, initial_weight, parts, out_v, out_w)
    if out is not None:
        return out[0], out[1]
    return out_v.reshape(v.shape), out_w.reshape(w.shape)


def _flat_out(target: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A flat view of an ``out`` array (it must be float64 and C-contiguous)."""
    if target.dtype != np.float64 or not target.flags.c_contiguous or not target.flags.writeable:
        raise ValueError("out arrays must be writeable, C-contiguous float64")
    return target.reshape(shape)


def make_bias(xp: Any) -> Any:
    """Equation (9)'s term: Rand(-1, 1) × max_bias from one half of a stream word."""

    r = make_rng(xp)
    uniform_hi32, uniform_lo32 = r.uniform_hi32, r.uniform_lo32

    @xp.fn
    def bias(word, low_half, max_bias):
        u = xp.where(low_half, uniform_lo32(word), uniform_hi32(word))
        return (2.0 * u - 1.0) * max_bias

    return bias


def _make_words(xp: Any) -> tuple[Any, Any]:
    r = make_rng(xp)
    return r.draw, r.mix_counter


_bias_nb = make_bias(nb)
_draw_nb, _mix_counter_nb = _make_words(nb)


def _torch_rules() -> Any:
    """The torch twins of the rules above, built on first use: importing torch costs
    seconds, and the numba paths never need it."""
    global _TORCH_RULES
    if _TORCH_RULES is None:

        from popplay.xp import th  # defers torch

        draw, mix_counter = _make_words(th)
        _TORCH_RULES = SimpleNamespace(merge=make_merge(th), bias=make_bias(th), draw=draw, mix_counter=mix_counter)
    return _TORCH_RULES


_TORCH_RULES: Any = None


@numba.njit(cache=True, parallel=True)
def _differentiate_kernel(values, keys, counter, max_bias, out):
    rows, items = values.shape
    words = (items + 1) // 2
    mixed = np.empty(words, dtype=np.int64)
    for i in range(words):
        mixed[i] = _mix_counter_nb(counter + i)
    for r in prange(rows):
        key = keys[r]
        for i in range(words):
            word = _draw_nb(key, mixed[i])
            out[r, 2 * i] = values[r, 2 * i] + _bias_nb(word, False, max_bias)
            if 2 * i + 1 < items:
                out[r, 2 * i + 1] = values[r, 2 * i + 1] + _bias_nb(word, True, max_bias)


def differentiate(values: Array, max_bias: float, keys: Array, counter: int,
                  bias_decay: float = 1.0, out: Array | None = None) -> tuple[Array, float]:
    """Differentiation after a share, Bell's equations (9)–(10)::

        Q_i(s, a) ← Q_i(s, a) + Rand(-1, 1) × max_bias     (9)
        max_bias ← max_bias / bias_decay                   (10)

    Applied right after :func:`share_weighted`, ``Q_i`` is ``Q_total``. Rand of item
    ``j`` of the agent with stream key ``k`` is ``2 u - 1`` where ``u`` is the 32-bit
    uniform of the high (even ``j``) or low (odd ``j``) half of the word
    ``rng.draw(k, rng.mix_counter(counter + j // 2))``: it depends only on the stream
    and the counter, never on batch layout or device (pass e.g. ``counter =
    share_index * items`` to use fresh words at every share).

    Args:
        values: Q values shaped (..., agents, items), float (NumPy or torch).
        max_bias: the current maximum bias (>= 0).
        keys: int64 stream keys shaped (..., agents), of the same kind as ``values``
            (see :func:`popplay.rng.stream_keys`).
        counter: the counter of item 0 (>= 0).
        bias_decay: equation (10)'s factor (>= 1 shrinks the bias).
        out: optional array like ``values`` to write into (may be ``values``).

    Returns:
        ``(values, max_bias)``: the biased values (a new array of the input kind, or
        ``out``) and the next max bias.
    """
    max_bias = float(max_bias)
    bias_decay = float(bias_decay)
    if not (max_bias >= 0.0 and np.isfinite(max_bias)):
        raise ValueError(f"max_bias must be non-negative and finite (got {max_bias!r})")
    if not (bias_decay > 0.0 and np.isfinite(bias_decay)):
        raise ValueError(f"bias_decay must be positive and finite (got {bias_decay!r})")
    if int(counter) < 0:
        raise ValueError(f"counter must be non-negative (got {counter!r})")
    if _is_torch(values) != _is_torch(keys):
        raise TypeError("values and keys must both be NumPy arrays or both torch tensors")
    if len(values.shape) < 2:
        raise ValueError("values must have at least two axes (..., agents, items)")
    if tuple(keys.shape) != tuple(values.shape[:-1]):
        raise ValueError(f"keys must be shaped like values without the last axis (got {tuple(keys.shape)} "
                         f"for values {tuple(values.shape)})")
    if out is not None:
        _check_pair(values, out, "out")
    if _is_torch(values):
        import torch  # defers torch

        items = values.shape[-1]
        index = torch.arange(items, dtype=torch.int64, device=values.device)
        rules = _torch_rules()
        words = rules.draw(keys.to(torch.int64)[..., None], rules.mix_counter(index // 2 + int(counter)))
        biased = values.to(torch.float64) + rules.bias(words, index % 2 == 1, max_bias)
        if out is None:
            return biased, max_bias / bias_decay
        out.copy_(biased)
        return out, max_bias / bias_decay
    v = np.ascontiguousarray(values, dtype=np.float64)
    k = np.ascontiguousarray(keys, dtype=np.int64)
    flat = v.reshape(-1, v.shape[-1])
    target = np.empty_like(flat) if out is None else _flat_out(out, flat.shape)
    _differentiate_kernel(flat, k.reshape(-1), int(counter), max_bias, target)
    return (target.reshape(v.shape) if out is None else out), max_bias / bias_decay

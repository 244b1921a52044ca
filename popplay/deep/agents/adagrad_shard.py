"""AdaGrad over a flattened parameter vector, split into contiguous shards.

Gorila's parameter server (Nair et al. 2015, after DistBelief) holds the Q-network's
parameters as one flat vector cut into ``S`` disjoint, contiguous slices; each shard
applies the gradients that reach it with AdaGrad, independently of the others:

    G ← G + g²,        θ ← θ − lr · g / (√G + ε)

(elementwise; ``G`` starts at ``initial_accumulator``). The rule is elementwise, so a
shard needs nothing but its own slice, and ``S`` shards fed the same gradient sequence
hold *bitwise* the vector that one unsharded server would: every operation below is a
separate, correctly rounded IEEE operation (``*``, ``+``, ``sqrt``, ``/``, ``−``) with
no fused multiply-add, so the result of each element does not depend on where it sits
in a tensor or on how a kernel vectorises it. torch's own ``Adagrad`` fuses
(``addcmul_``/``addcdiv_``) and therefore agrees only to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``shards`` contiguous slices of ``n`` values; sizes
    differ by at most one, the larger slices first (NumPy's ``array_split`` rule)."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1 (got {shards})")
    if n < shards:
        raise ValueError(f"cannot split {n} parameters into {shards} non-empty shards")
    base, extra = divmod(n, shards)
    bounds, start = [], 0
    for s in range(shards):
        stop = start + base + (1 if s < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def adagrad_update_(params: torch.Tensor, accumulator: torch.Tensor, grad: torch.Tensor, lr: float,
                    eps: float) -> None:
    """One AdaGrad step in place on ``params`` and ``accumulator`` (same shape as ``grad``)."""
    if not (params.shape == accumulator.shape == grad.shape):
        raise ValueError(f"shapes differ: params {tuple(params.shape)}, accumulator "
                         f"{tuple(accumulator.shape)}, gradient {tuple(grad.shape)}")
    # Separate operations on purpose (see the module docstring): no fused kernels.
    accumulator.add_(grad * grad)
    params.sub_((grad * lr) / (accumulator.sqrt() + eps))


@dataclass
class AdaGradShard:
    """One shard: the slice ``[start, stop)`` of the flat vector, its accumulator and
    its version (how many gradients it has applied)."""

    start: int
    stop: int
    params: torch.Tensor
    accumulator: torch.Tensor
    lr: float
    eps: float = 1e-10
    version: int = 0

    @classmethod
    def from_vector(cls, vector: torch.Tensor, start: int, stop: int, lr: float, eps: float = 1e-10,
                    initial_accumulator: float = 0.0) -> "AdaGradShard":
        if not (0 <= start < stop <= vector.numel()):
            raise ValueError(f"slice [{start}, {stop}) lies outside a vector of {vector.numel()}")
        if not lr > 0:
            raise ValueError(f"lr must be positive (got {lr})")
        if initial_accumulator < 0 or eps < 0:
            raise ValueError("initial_accumulator and eps must be non-negative")
        params = vector.detach()[start:stop].to(torch.float32).clone()
        return cls(start, stop, params, torch.full_like(params, float(initial_accumulator)), float(lr), float(eps))

    @property
    def size(self) -> int:
        return self.stop - self.start

    def apply(self, grad_slice: torch.Tensor) -> int:
        """Apply one gradient slice; return the new version."""
        if grad_slice.numel() != self.size:
            raise ValueError(f"gradient slice has {grad_slice.numel()} values; shard [{self.start}, "
                             f"{self.stop}) holds {self.size}")
        adagrad_update_(self.params, self.accumulator, grad_slice.reshape(-1).to(torch.float32), self.lr, self.eps)
        self.version += 1
        return self.version


def make_shards(vector: torch.Tensor, shards: int, lr: float, eps: float = 1e-10,
                initial_accumulator: float = 0.0) -> list[AdaGradShard]:
    """``shards`` AdaGrad shards covering ``vector`` (see :func:`shard_bounds`)."""
    return [AdaGradShard.from_vector(vector, a, b, lr, eps, initial_accumulator)
            for a, b in shard_bounds(vector.numel(), shards)]


def gather(shards: list[AdaGradShard]) -> tuple[torch.Tensor, torch.Tensor]:
    """The full parameter vector and accumulator, concatenated in slice order."""
    ordered = sorted(shards, key=lambda s: s.start)
    return torch.cat([s.params for s in ordered]), torch.cat([s.accumulator for s in ordered])


def adagrad_reference(params: np.ndarray, grads: list[np.ndarray], lr: float, eps: float = 1e-10,
                      initial_accumulator: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Plain-Python float64 AdaGrad over a gradient sequence (slow; for tests)."""
    theta = [float(v) for v in np.asarray(params, dtype=np.float64)]
    acc = [float(initial_accumulator)] * len(theta)
    for g in grads:
        for i, gi in enumerate(np.asarray(g, dtype=np.float64)):
            acc[i] += gi * gi
            theta[i] -= lr * gi / (acc[i] ** 0.5 + eps)
    return np.array(theta), np.array(acc)

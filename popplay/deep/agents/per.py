"""Proportional prioritised experience replay (Schaul et al. 2016) on a sum-tree.

Item ``i`` is drawn with probability ``P(i) = p_i^alpha / sum_k p_k^alpha`` where
``p_i = |TD error_i| + eps``; new items get the largest priority seen so far so
that each is replayed at least about once before its error is known. The bias of
the non-uniform draw is undone by importance weights ``w_i = (N P(i))^-beta``,
divided by their largest possible value ``(N P_min)^-beta`` so they only ever
scale updates down; ``beta`` is annealed linearly from ``beta0`` to 1 over
``beta_steps`` draws (full correction matters most near convergence).

The tree keeps ``p^alpha`` at its leaves and at every inner node the sum (for
drawing) and the minimum (for the weights' normaliser) of its children. Inner
nodes are always recomputed from their two children, never incremented, so the
sums do not drift and repeated indices in one update are harmless. Draws are
stratified: a batch of ``k`` splits the total mass into ``k`` equal segments and
draws one mass uniformly in each, which keeps each item's expected count at
``k P(i)`` with less spread than independent draws.

:class:`PrioritizedReplay` is :class:`~popplay.deep.agents.replay.ReplayBuffer` (same
ring, same :class:`~popplay.deep.agents.replay.Batch`, same run-file arrays) plus the
tree; its priorities travel in run files beside the transitions.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from popplay.deep.agents.replay import Batch, ReplayBuffer


class SumTree:
    """Sums and minima of ``capacity`` non-negative leaf values, in float64 on the CPU."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SumTree: capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        size = 1
        while size < capacity:
            size *= 2
        self._size = size
        self._depth = size.bit_length() - 1
        self._sums = torch.zeros(2 * size, dtype=torch.float64)
        self._mins = torch.full((2 * size,), float("inf"), dtype=torch.float64)

    @property
    def total(self) -> float:
        return float(self._sums[1])

    @property
    def min(self) -> float:
        """Smallest leaf value set so far (``inf`` before any)."""
        return float(self._mins[1])

    def values(self, indices: torch.Tensor) -> torch.Tensor:
        return self._sums[self._size + indices.to(torch.int64)]

    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaves ``indices`` to ``values`` (>= 0); with repeats, the last one wins."""
        indices = indices.to(torch.int64).reshape(-1)
        values = values.to(torch.float64).reshape(-1)
        if indices.numel() != values.numel():
            raise ValueError("SumTree.update: indices and values differ in length")
        if indices.numel() == 0:
            return
        if int(indices.min()) < 0 or int(indices.max()) >= self.capacity:
            raise IndexError("SumTree.update: index out of range")
        if bool((values < 0).any()) or not bool(torch.isfinite(values).all()):
            raise ValueError("SumTree.update: values must be finite and >= 0")
        nodes = indices + self._size
        self._sums[nodes] = values
        self._mins[nodes] = values
        for _ in range(self._depth):
            nodes = torch.unique(nodes // 2)
            left = 2 * nodes
            self._sums[nodes] = self._sums[left] + self._sums[left + 1]
            self._mins[nodes] = torch.minimum(self._mins[left], self._mins[left + 1])

    def find(self, masses: torch.Tensor) -> torch.Tensor:
        """Leaf index whose cumulative-sum interval holds each mass in ``[0, total)``."""
        masses = masses.to(torch.float64).reshape(-1).clone()
        nodes = torch.ones_like(masses, dtype=torch.int64)
        for _ in range(self._depth):
            left = 2 * nodes
            left_sum = self._sums[left]
            go_left = masses < left_sum
            masses = torch.where(go_left, masses, masses - left_sum)
            nodes = torch.where(go_left, left, left + 1)
        return nodes - self._size


class PrioritizedBatch(NamedTuple):
    """A prioritised draw: the transitions, their buffer ``indices`` and importance ``weights``."""

    batch: Batch
    indices: torch.Tensor  # int64 [k], slots in the ring
    weights: torch.Tensor  # float32 [k], in (0, 1]
    probabilities: torch.Tensor  # float64 [k], P(i) of each drawn item


def annealed_beta(draws: int, beta0: float, beta_steps: int) -> float:
    """``beta0`` rising linearly to 1 after ``beta_steps`` draws."""
    if beta_steps <= 0:
        return 1.0
    return beta0 + (1.0 - beta0) * min(1.0, draws / beta_steps)


class PrioritizedReplay(ReplayBuffer):
    """The replay ring with proportional prioritised sampling.

    :meth:`sample_prioritized` gives indices and importance weights with the batch;
    :meth:`sample` (what code written for uniform replay calls) draws by priority too
    and drops them.
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        action_dim: int = 0,
        device: str = "cpu",
        *,
        alpha: float = 0.6,
        beta0: float = 0.4,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(capacity, obs_dim, action_dim, device)
        if alpha < 0:
            raise ValueError(f"alpha must be non-negative (got {alpha})")
        if not 0 <= beta0 <= 1:
            raise ValueError(f"beta0 must be in [0, 1] (got {beta0})")
        if not eps > 0:
            raise ValueError(f"priority eps must be positive (got {eps})")
        self.alpha = float(alpha)
        self.beta0 = float(beta0)
        self.beta_steps = int(beta_steps)
        self.eps = float(eps)
        self.tree = SumTree(capacity)
        self.draws = 0  # prioritised draws so far: the clock of beta's schedule
        self.max_priority = 1.0  # largest raw priority |delta| + eps seen, before alpha

    @property
    def beta(self) -> float:
        return annealed_beta(self.draws, self.beta0, self.beta_steps)

    def add(self, batch: Batch) -> None:
        """Append transitions at the largest priority seen so far."""
        n = min(int(batch.obs.shape[0]), self.capacity)
        start = self.position
        super().add(batch)
        if n:
            slots = (start + torch.arange(n, dtype=torch.int64)) % self.capacity
            self.tree.update(slots, torch.full((n,), self.max_priority**self.alpha, dtype=torch.float64))

    def probabilities(self, indices: torch.Tensor) -> torch.Tensor:
        """P(i) of stored items."""
        return self.tree.values(indices) / self.tree.total

    def sample_prioritized(
        self, batch_size: int, generator: torch.Generator | None = None, beta: float | None = None
    ) -> PrioritizedBatch:
        """Draw ``batch_size`` items (with replacement) in proportion to their priority.

        ``beta`` defaults to the annealed schedule, whose clock this call advances.
        """
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 (got {batch_size})")
        if beta is None:
            beta = self.beta
        self.draws += 1
        total = self.tree.total
        offsets = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        masses = (torch.arange(batch_size, dtype=torch.float64) + offsets) * (total / batch_size)
        # rounding can carry a mass past the last stored item into empty leaves
        indices = torch.clamp(self.tree.find(masses), max=self.size - 1)
        leaf = self.tree.values(indices)
        # (N P(i))^-beta / (N P_min)^-beta = (p_i / p_min)^-beta
        weights = (leaf / self.tree.min) ** (-beta)
        idx = indices.to(self.device)
        batch = Batch(self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx], self.terminated[idx])
        return PrioritizedBatch(
            batch=batch,
            indices=indices,
            weights=weights.to(device=self.device, dtype=torch.float32),
            probabilities=leaf / total,
        )

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Batch:
        return self.sample_prioritized(batch_size, generator).batch

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """New priorities ``|td_errors| + eps`` for items drawn earlier."""
        priorities = td_errors.detach().to("cpu", torch.float64).abs().reshape(-1) + self.eps
        indices = indices.to("cpu", torch.int64).reshape(-1)
        if indices.numel() != priorities.numel():
            raise ValueError("update_priorities: one TD error per index")
        if indices.numel() == 0:
            return
        if int(indices.max()) >= self.size:
            raise IndexError("update_priorities: index of an empty slot")
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(indices, priorities**self.alpha)

    # --- run-file arrays ------------------------------------------------------------
    def _ordered_slots(self) -> torch.Tensor:
        if self.size < self.capacity:
            return torch.arange(self.size)
        return (self.position + torch.arange(self.capacity)) % self.capacity

    def arrays(self, prefix: str = "replay") -> dict[str, np.ndarray]:
        """Transitions and their tree values (``p^alpha``), oldest first, for a run file."""
        out = super().arrays(prefix)
        out[f"{prefix}.priority"] = self.tree.values(self._ordered_slots()).numpy().copy()
        out[f"{prefix}.per_state"] = np.array([self.max_priority, float(self.draws)], dtype=np.float64)
        return out

    def load(self, arrays: dict[str, np.ndarray], added: int, prefix: str = "replay") -> None:
        self.tree = SumTree(self.capacity)
        super().load(arrays, added, prefix)
        values = torch.as_tensor(arrays[f"{prefix}.priority"], dtype=torch.float64)
        if values.numel() != self.size:
            raise ValueError(f"{prefix}.priority has {values.numel()} values for {self.size} transitions")
        self.tree = SumTree(self.capacity)
        self.tree.update(self._ordered_slots(), values)  # each priority back beside its transition
        self.max_priority = float(arrays[f"{prefix}.per_state"][0])
        self.draws = int(arrays[f"{prefix}.per_state"][1])

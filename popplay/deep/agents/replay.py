"""A uniform replay buffer held in preallocated tensors (a ring).

Transitions are ``(obs, action, reward, next_obs, terminated)``; ``terminated`` is
true only where the environment ended the episode (a time-limit cut still
bootstraps). :meth:`ReplayBuffer.arrays` and :meth:`ReplayBuffer.load` move the whole
buffer, in insertion order, to and from run files.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch


class Batch(NamedTuple):
    obs: torch.Tensor  # (B, obs_dim) float32
    action: torch.Tensor  # (B,) int64 (discrete) or (B, action_dim) float32
    reward: torch.Tensor  # (B,) float32
    next_obs: torch.Tensor  # (B, obs_dim) float32
    terminated: torch.Tensor  # (B,) float32, 1 where the episode ended (no bootstrap)


class ReplayBuffer:
    def __init__(self, capacity: int, obs_dim: int, action_dim: int = 0, device: str = "cpu") -> None:
        """``action_dim`` 0: discrete actions (int64); otherwise continuous vectors."""
        if capacity < 1:
            raise ValueError(f"replay capacity must be at least 1 (got {capacity})")
        self.capacity = capacity
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.device = device
        self.obs = torch.zeros(capacity, obs_dim, dtype=torch.float32, device=device)
        self.next_obs = torch.zeros(capacity, obs_dim, dtype=torch.float32, device=device)
        self.action = (torch.zeros(capacity, dtype=torch.int64, device=device) if action_dim == 0
                       else torch.zeros(capacity, action_dim, dtype=torch.float32, device=device))
        self.reward = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.terminated = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.position = 0  # next slot to write
        self.size = 0
        self.added = 0  # every transition ever added

    def __len__(self) -> int:
        return self.size

    def add(self, batch: Batch) -> None:
        """Append transitions (oldest overwritten once full)."""
        n = batch.obs.shape[0]
        if n == 0:
            return
        if n > self.capacity:  # only the newest fit
            batch = Batch(*(t[-self.capacity:] for t in batch))
            self.added += n - self.capacity
            n = self.capacity
        idx = (self.position + torch.arange(n, device=self.device)) % self.capacity
        self.obs[idx] = batch.obs.to(self.device, torch.float32)
        self.next_obs[idx] = batch.next_obs.to(self.device, torch.float32)
        self.action[idx] = batch.action.to(self.device, self.action.dtype)
        self.reward[idx] = batch.reward.to(self.device, torch.float32)
        self.terminated[idx] = batch.terminated.to(self.device, torch.float32)
        self.position = int((self.position + n) % self.capacity)
        self.size = min(self.capacity, self.size + n)
        self.added += n

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` transitions drawn uniformly with replacement."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        idx = torch.randint(self.size, (batch_size,), generator=generator).to(self.device)
        return Batch(self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx], self.terminated[idx])

    def blank(self, batch_size: int) -> Batch:
        """``batch_size`` all-zero transitions of the stored shapes: what a data-parallel
        learner with no replay yet takes its (zero-weighted) part of a step on."""
        def zeros(like: torch.Tensor) -> torch.Tensor:
            return torch.zeros(batch_size, *like.shape[1:], dtype=like.dtype, device=self.device)

        return Batch(zeros(self.obs), zeros(self.action), zeros(self.reward), zeros(self.next_obs),
                     zeros(self.terminated))

    def ordered(self) -> Batch:
        """Every stored transition, oldest first."""
        if self.size < self.capacity:
            idx = torch.arange(self.size, device=self.device)
        else:
            idx = (self.position + torch.arange(self.capacity, device=self.device)) % self.capacity
        return Batch(self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx], self.terminated[idx])

    def arrays(self, prefix: str = "replay") -> dict[str, np.ndarray]:
        """The contents, oldest first, for a run file."""
        b = self.ordered()
        return {f"{prefix}.{name}": t.cpu().numpy().copy() for name, t in b._asdict().items()}

    def load(self, arrays: dict[str, np.ndarray], added: int, prefix: str = "replay") -> None:
        """Refill from :meth:`arrays` (oldest first), each transition back in the slot
        it held: a full ring's next slot is ``added`` mod capacity, and minibatches
        draw slots, so a resumed run samples the transitions an unbroken one does."""
        parts = {name: torch.as_tensor(arrays[f"{prefix}.{name}"]) for name in Batch._fields}
        n = parts["obs"].shape[0]
        if n > self.capacity or (n and parts["obs"].shape[1] != self.obs_dim):
            raise ValueError(f"stored replay of shape {tuple(parts['obs'].shape)} does not fit this buffer")
        if int(added) < n:
            raise ValueError(f"replay: {n} transitions stored but only {added} ever added")
        self.position = int(added) % self.capacity if n == self.capacity else n
        slots = (self.position + torch.arange(n)) % self.capacity if n == self.capacity else torch.arange(n)
        slots = slots.to(self.device)
        for name in Batch._fields:
            getattr(self, name)[slots] = parts[name].to(self.device, getattr(self, name).dtype)
        self.size = n
        self.added = int(added)



# --- transitions as rows: the layout topologies ship between processes ----------------

def transition_width(obs_dim: int, action_dim: int = 1) -> int:
    """Columns of a transition row: obs, action (``action_dim``; 1 for an index),
    reward, next_obs, terminated."""
    return 2 * obs_dim + action_dim + 2


def episode_rows(episodes: Any) -> np.ndarray:
    """Played episodes (:class:`popplay.deep.envs.rollout.Episodes`) as float64 rows
    ``[obs, action, reward, next_obs, terminated]`` (exact)."""
    n = episodes.steps
    action = np.asarray(episodes.action, dtype=np.float64)
    # no steps: reshape cannot infer a width from nothing
    action = action.reshape(n, -1) if n else action.reshape(0, action.shape[1] if action.ndim == 2 else 1)
    return np.concatenate([episodes.obs, action,
                           episodes.reward.reshape(n, 1), episodes.next_obs,
                           episodes.terminated.reshape(n, 1)], axis=1, dtype=np.float64)


def rows_batch(rows: "np.ndarray | torch.Tensor", obs_dim: int, discrete: bool = False) -> Batch:
    """The inverse of :func:`episode_rows` and :func:`batch_rows`: a :class:`Batch`
    (``discrete``: the action column as int64 indices)."""
    t = torch.as_tensor(rows)
    d, k = obs_dim, t.shape[1] - 2 * obs_dim - 2
    action = t[:, d].long() if discrete else t[:, d:d + k].float()
    return Batch(t[:, :d].float(), action, t[:, d + k].float(), t[:, d + k + 1:2 * d + k + 1].float(),
                 t[:, 2 * d + k + 1].float())


def batch_rows(batch: Batch) -> torch.Tensor:
    """A :class:`Batch` as float32 transition rows (for sending)."""
    action = batch.action.to(torch.float32).reshape(batch.obs.shape[0], -1)
    return torch.cat([batch.obs, action, batch.reward.reshape(-1, 1), batch.next_obs,
                      batch.terminated.reshape(-1, 1)], dim=1).contiguous()

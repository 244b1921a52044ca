"""Torch engine of the bandit population (private; see :mod:`popplay.games.bandit`).

Every step advances all (trial, agent) pairs at once on dense (trials, agents, arms)
tensors. It draws the same words and applies the same rules as the numba kernels,
so on the CPU both give bit-identical shared tables.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from popplay.games.bandit import WORDS_PER_STEP, make_rules
from popplay.xp import th

_rules = make_rules(th)
_rng = _rules.rng


class TorchBanditEngine:
    """Runs learning phases and shares for a whole population on one device."""

    def __init__(self, *, means: np.ndarray, keys: np.ndarray, static_keys: np.ndarray,
                 epsilons: np.ndarray, topk: np.ndarray, groups: np.ndarray, n_groups: int,
                 bias_scale: float, use_bias: bool, device: str) -> None:
        self.device = torch.device(device)
        put = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=self.device)  # noqa: E731
        self.means = put(means)
        self.keys = put(keys)
        self.epsilons = put(epsilons)
        self.topk = put(topk)
        self.groups = put(groups)
        self.n_groups = n_groups
        self.any_topk = bool((topk > 1).any())
        trials, agents = keys.shape
        arms = means.shape[1]
        self.shape = (trials, agents, arms)
        self.bias = None
        if use_bias:
            static = put(static_keys)[:, :, None]
            counters = torch.arange(arms, dtype=torch.int64, device=self.device)
            self.bias = _rules.arm_bias(_rng.draw(static, _rng.mix_counter(counters)), bias_scale)

    def phase(self, q: torch.Tensor, n: torch.Tensor, first_step: int, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Learn ``n_steps`` steps from the shared tables ``q, n``; return the next shares."""
        trials, agents, arms = self.shape
        base_q = q[:, None, :]
        base_n = (n / agents)[:, None, :]
        values = base_q.expand(self.shape).clone()
        biased = values + self.bias if self.bias is not None else values
        pulls = torch.zeros(self.shape, dtype=torch.int64, device=self.device)
        rewards = torch.zeros(self.shape, dtype=torch.int64, device=self.device)
        for s in range(n_steps):
            counter = (first_step + s) * WORDS_PER_STEP
            w0 = _rng.draw(self.keys, _rng.mix_counter(torch.tensor(counter, device=self.device)))
            counter1 = torch.tensor(counter + 1, device=self.device)
            w1 = _rng.draw(self.keys, _rng.mix_counter(counter1))
            u_choice = _rng.uniform_lo32(w0)
            explore = _rng.uniform_hi32(w0) < self.epsilons
            arm = torch.where(explore, _rules.explore_arm(u_choice, self.groups, self.n_groups, arms),
                              self._greedy(biased, u_choice))
            arm = arm[..., None]
            noise = _rng.normal(self.keys, counter1, w1)
            reward = _rules.reward_fixed(self.means[:, None, :].expand(self.shape).gather(-1, arm)[..., 0], noise)
            pulls.scatter_add_(-1, arm, torch.ones_like(arm))
            rewards.scatter_add_(-1, arm, reward[..., None])
            new_value = _rules.estimate(base_q.expand(self.shape).gather(-1, arm),
                                        base_n.expand(self.shape).gather(-1, arm),
                                        pulls.gather(-1, arm), rewards.gather(-1, arm))
            values.scatter_(-1, arm, new_value)
            if self.bias is not None:
                biased.scatter_(-1, arm, new_value + self.bias.gather(-1, arm))
        n_new = n + pulls.sum(dim=1)
        q_new = _rules.shared_estimate(q, n, n_new, rewards.sum(dim=1))
        return q_new, n_new

    def _greedy(self, biased: torch.Tensor, u_choice: torch.Tensor) -> torch.Tensor:
        """The random-tie argmax of every agent, or its top-k choice where k > 1."""
        best = biased.max(dim=-1, keepdim=True).values
        ties = biased == best
        pick = torch.floor(u_choice * ties.sum(dim=-1)).to(torch.int64)
        arm = (ties.cumsum(dim=-1) > pick[..., None]).to(torch.int8).argmax(dim=-1)
        if self.any_topk:
            order = torch.sort(biased, dim=-1, descending=True, stable=True).indices
            rank = torch.floor(u_choice * self.topk).to(torch.int64)
            arm = torch.where(self.topk > 1, order.gather(-1, rank[..., None])[..., 0], arm)
        return arm


def to_numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy()

"""Torch engine of the bandit population (private; see :mod:`popplay.games.bandit.rules`).

Every step advances all (trial, agent) pairs at once on dense (trials, agents, arms)
tensors. It draws the same words and applies the same rules as the numba kernels,
so on the CPU both give bit-identical shared tables.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from popplay.games.bandit.rules import WORDS_PER_STEP, make_rules
from popplay.xp import th

_rules = make_rules(th)
_rng = _rules.rng


class TorchBanditEngine:
    """Runs learning phases and shares for a whole population on one device."""

    def __init__(self, *, means: np.ndarray, keys: np.ndarray, static_keys: np.ndarray,
                 epsilons: np.ndarray, topk: np.ndarray, groups: np.ndarray, n_groups: int,
                 bias_scale: float, use_bias: bool, device: str, total_agents: int | None = None,
                 reduce_sums: Any = None) -> None:
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
        # With the agents sharded over ranks, ``keys`` holds this rank's agents only:
        # the shared count is still split over the whole trial, and the integer pull
        # and reward sums (exact in any order) are completed by ``reduce_sums``.
        self.total_agents = agents if total_agents is None else int(total_agents)
        self.reduce_sums = reduce_sums
        self.shape = (trials, agents, arms)
        self.bias = None
        if use_bias:
            static = put(static_keys)[:, :, None]
            counters = torch.arange(arms, dtype=torch.int64, device=self.device)
            self.bias = _rules.arm_bias(_rng.draw(static, _rng.mix_counter(counters)), bias_scale)

    def phase(self, q: torch.Tensor, n: torch.Tensor, first_step: int, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Learn ``n_steps`` steps from the shared tables ``q, n``; return the next shares.

        Like the numba kernel, each agent keeps a greedy cache (best arm, best value,
        runner-up bound), so a step needs a pass over all arms only for the agents
        whose values tie or whose leader fell behind.
        """
        trials, agents, arms = self.shape
        base_q = q[:, None, :].expand(self.shape)
        base_n = (n / self.total_agents)[:, None, :].expand(self.shape)
        means = self.means[:, None, :].expand(self.shape)
        values = base_q.clone()
        biased = values + self.bias if self.bias is not None else values
        pulls = torch.zeros(self.shape, dtype=torch.int64, device=self.device)
        rewards = torch.zeros(self.shape, dtype=torch.int64, device=self.device)
        best_arm, best, second = _top2(biased)
        topk_agent = (self.topk > 1).expand(trials, agents) if self.any_topk else None
        for s in range(n_steps):
            counter = (first_step + s) * WORDS_PER_STEP
            w0 = _rng.draw(self.keys, _rng.mix_counter(torch.tensor(counter, device=self.device)))
            counter1 = torch.tensor(counter + 1, device=self.device)
            w1 = _rng.draw(self.keys, _rng.mix_counter(counter1))
            u_choice = _rng.uniform_lo32(w0)
            explore = _rng.uniform_hi32(w0) < self.epsilons
            arm = best_arm.clone()
            needs_scan = (best <= second) & ~explore
            if topk_agent is not None:
                needs_scan &= ~topk_agent
                chosen = (topk_agent & ~explore).nonzero(as_tuple=True)
                if chosen[0].numel():
                    order = torch.sort(biased[chosen], dim=-1, descending=True, stable=True).indices
                    rank = torch.floor(u_choice[chosen] * self.topk.expand(trials, agents)[chosen]).to(torch.int64)
                    arm[chosen] = order.gather(-1, rank[:, None])[:, 0]
            scanned = needs_scan.nonzero(as_tuple=True)
            if scanned[0].numel():
                arm[scanned] = _random_argmax(biased[scanned], u_choice[scanned])
            arm = torch.where(explore, _rules.explore_arm(u_choice, self.groups, self.n_groups, arms), arm)
            index = arm[..., None]
            noise = _rng.normal(self.keys, counter1, w1)
            reward = _rules.reward_fixed(means.gather(-1, index)[..., 0], noise)
            pulls.scatter_add_(-1, index, torch.ones_like(index))
            rewards.scatter_add_(-1, index, reward[..., None])
            new_value = _rules.estimate(base_q.gather(-1, index), base_n.gather(-1, index),
                                        pulls.gather(-1, index), rewards.gather(-1, index))
            values.scatter_(-1, index, new_value)
            if self.bias is not None:
                new_value = new_value + self.bias.gather(-1, index)
                biased.scatter_(-1, index, new_value)
            best_arm, best, second, rescan = _rules.update_greedy(arm, new_value[..., 0], best_arm, best, second)
            lost = rescan.nonzero(as_tuple=True)
            if lost[0].numel():
                best_arm[lost], best[lost], second[lost] = _top2(biased[lost])
        pull_sums, reward_sums = pulls.sum(dim=1), rewards.sum(dim=1)
        if self.reduce_sums is not None:
            pull_sums, reward_sums = self.reduce_sums(pull_sums, reward_sums)
        n_new = n + pull_sums
        q_new = _rules.shared_estimate(q, n, n_new, reward_sums)
        return q_new, n_new


def _top2(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The greedy cache of every row: (an arm holding the maximum, it, the runner-up)."""
    top = torch.topk(values, 2, dim=-1)
    return top.indices[..., 0].clone(), top.values[..., 0].clone(), top.values[..., 1].clone()


def _random_argmax(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the floor(u * c)-th (in index order) of the c arms holding the maximum."""
    ties = rows == rows.max(dim=-1, keepdim=True).values
    pick = torch.floor(u * ties.sum(dim=-1)).to(torch.int64)
    return (ties.cumsum(dim=-1) > pick[..., None]).to(torch.int8).argmax(dim=-1)

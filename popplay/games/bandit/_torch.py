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
# Reward draws made at once, at most, by device type: 32 MiB of words on a CPU; on a
# GPU 1 GiB, so that the normal draws' retry rounds (hundreds of small launches that
# keep the GPU waiting) are paid once per 16 steps at 8.4 M agents, not at every step.
NOISE_BLOCK_DRAWS = {"cpu": 2**22, "cuda": 2**27}


class TorchBanditEngine:
    """Runs learning phases and shares for a whole population on one device."""

    def __init__(self, *, means: np.ndarray, keys: np.ndarray, static_keys: np.ndarray,
                 epsilons: np.ndarray, topk: np.ndarray, groups: np.ndarray, n_groups: int,
                 bias_scale: float, use_bias: bool, device: str, total_agents: int | None = None,
                 reduce_sums: Any = None, compile: bool = False) -> None:
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
        self.topk_agent = (self.topk > 1).expand(trials, agents) if self.any_topk else None
        self._step = th.compiled(self._learning_step, compile)
        self._columns = torch.arange(arms, device=self.device) if compile else None  # see th.put_along
        # The noise words are most of a step's arithmetic (a hash per draw, hundreds
        # of elementwise operations): compiled, they run as one fused kernel. The
        # ziggurat's retry rounds stay eager: compiled with them, the CPU build took
        # minutes, and frexp's int32 exponent breaks inductor's C++ vectoriser (torch 2.13).
        self._noise_words = th.compiled(_noise_words, compile)
        # The reward noise of a block of steps is drawn at once (it depends on the
        # keys and the step only): few, large operations instead of the retry rounds
        # at every step.
        block = NOISE_BLOCK_DRAWS.get(self.device.type, NOISE_BLOCK_DRAWS["cpu"])  # other devices: the CPU's
        self.noise_block = max(1, block // (trials * agents))
        self.bias = None
        if use_bias:
            static = put(static_keys)[:, :, None]
            counters = torch.arange(arms, dtype=torch.int64, device=self.device)
            self.bias = _rules.arm_bias(_rng.draw(static, _rng.mix_counter(counters)), bias_scale)

    def phase(self, q: torch.Tensor, n: torch.Tensor, first_step: int,
              n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Learn ``n_steps`` steps from the shared tables ``q, n``; return the next shares.

        Every step has the same shapes and no step asks the device anything, so the
        host queues a whole phase without waiting. The one read of a phase is whether
        a reward's normal draw ran past its fixed budget of retry rounds (about one
        draw in 10^9); then the phase is learned again with the exact, waiting draw.
        """
        pull_sums, reward_sums, short = self._learn(q, n, first_step, n_steps, exact=False)
        if bool(short):
            pull_sums, reward_sums, _ = self._learn(q, n, first_step, n_steps, exact=True)
        if self.reduce_sums is not None:
            pull_sums, reward_sums = self.reduce_sums(pull_sums, reward_sums)
        n_new = n + pull_sums
        q_new = _rules.shared_estimate(q, n, n_new, reward_sums)
        return q_new, n_new

    def _learn(self, q: torch.Tensor, n: torch.Tensor, first_step: int, n_steps: int,
               exact: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The phase's pull and reward sums per (trial, arm), and whether a bounded
        normal draw fell short (never with ``exact``).

        Each step takes every agent's greedy arm from a full pass over its arms (the
        numba kernel's cached leader and runner-up pick the same arm, but keeping
        that cache needs a branch per agent)."""
        dev = self.device
        base_q = q[:, None, :].expand(self.shape)
        base_n = (n / self.total_agents)[:, None, :].expand(self.shape)
        means = self.means[:, None, :].expand(self.shape)
        biased = base_q.clone()
        if self.bias is not None:
            biased += self.bias
        pulls = torch.zeros(self.shape, dtype=torch.int64, device=dev)
        rewards = torch.zeros(self.shape, dtype=torch.int64, device=dev)
        counters = torch.arange(first_step * WORDS_PER_STEP, (first_step + n_steps) * WORDS_PER_STEP,
                                dtype=torch.int64, device=dev)
        mixed = _rng.mix_counter(counters[::WORDS_PER_STEP])
        short = torch.zeros((), dtype=torch.bool, device=dev)
        for s in range(n_steps):
            if s % self.noise_block == 0:
                block = counters[WORDS_PER_STEP * s + 1::WORDS_PER_STEP][:self.noise_block, None, None]
                words = self._noise_words(self.keys, block)
                noises, fell_short = (_exact_reward_noise(self.keys, block, words) if exact
                                      else _bounded_reward_noise(self.keys, block, words))
                short |= fell_short
            biased, pulls, rewards = self._step(biased, pulls, rewards, base_q, base_n, means, mixed[s],
                                                noises[s % self.noise_block])
        return pulls.sum(dim=1), rewards.sum(dim=1), short


    def _learning_step(self, biased: torch.Tensor, pulls: torch.Tensor, rewards: torch.Tensor, base_q: torch.Tensor,
                       base_n: torch.Tensor, means: torch.Tensor, mixed: torch.Tensor,
                       noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of every agent: choose arms, draw rewards; returns the next
        ``biased`` (greedy values, bias included), ``pulls`` and ``rewards``."""
        arms = self.shape[2]
        w0 = _rng.draw(self.keys, mixed)
        u_choice = _rng.uniform_lo32(w0)
        explore = _rng.uniform_hi32(w0) < self.epsilons
        arm = _random_argmax(biased, u_choice)
        if self.topk_agent is not None:
            order = torch.sort(biased, dim=-1, descending=True, stable=True).indices
            rank = torch.floor(u_choice * self.topk).to(torch.int64)
            arm = torch.where(self.topk_agent, order.gather(-1, rank[..., None])[..., 0], arm)
        arm = torch.where(explore, _rules.explore_arm(u_choice, self.groups, self.n_groups, arms), arm)
        index = arm[..., None]
        reward = _rules.reward_fixed(means.gather(-1, index)[..., 0], noise)[..., None]
        pulls_at = pulls.gather(-1, index) + 1
        rewards_at = rewards.gather(-1, index) + reward
        new_value = _rules.estimate(base_q.gather(-1, index), base_n.gather(-1, index), pulls_at, rewards_at)
        if self.bias is not None:
            new_value = new_value + self.bias.gather(-1, index)
        columns = self._columns
        return (th.put_along(biased, index, new_value, columns), th.put_along(pulls, index, pulls_at, columns),
                th.put_along(rewards, index, rewards_at, columns))


def _noise_words(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """The random words of every agent's reward noise at each of ``counters`` (shaped
    (steps, 1, 1))."""
    return _rng.draw(keys, _rng.mix_counter(counters))


def _exact_reward_noise(keys: torch.Tensor, counters: torch.Tensor,
                        words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reward noise from its :func:`_noise_words`, with as many retry rounds as each
    draw needs (the host waits for them)."""
    return _rng.normal(keys, counters, words), torch.zeros((), dtype=torch.bool, device=keys.device)


def _bounded_reward_noise(keys: torch.Tensor, counters: torch.Tensor,
                          words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_exact_reward_noise` with a fixed budget of retry slots and rounds: the
    normals and whether a draw fell short of that budget (then redone exactly)."""
    draws = words.numel()
    # slots for the draws that need retry rounds: about 1.5 %, plus eight binomial
    # standard deviations and a floor
    expected = 0.015 * draws
    return _rng.normal_bounded(keys, counters, words, min(draws, int(expected + 8 * expected ** 0.5 + 16)))


def _random_argmax(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the floor(u * c)-th (in index order) of the c arms holding the maximum."""
    ties = rows == rows.max(dim=-1, keepdim=True).values
    pick = torch.floor(u * ties.sum(dim=-1)).to(torch.int64)
    return th.nth_true(ties, pick)

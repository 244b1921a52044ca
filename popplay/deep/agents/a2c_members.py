"""P A2C learners batched over a leading member axis, in one process.

A population of A2C members learns as Mnih et al.'s synchronous A2C (and
stable-baselines3's ``A2C``) does: each member steps ``copies`` environments for
``n_steps``, then takes one Adam step on the loss of :mod:`popplay.deep.agents.a2c`

    L = -mean[A_t log pi(a_t|s_t)] + value_coef * 0.5 mean[(G_t - V(s_t))^2] - entropy_coef * mean[H]

over that rollout, where ``G_t`` is the n-step return bootstrapped with V at the
rollout's end (and at time-limit cuts) and ``A_t = G_t - V(s_t)``: V-trace's targets
with every ratio 1, since each member acts with the very network it then learns on.
The rollouts, streams, stacked networks and Adam are PPO's population's
(:class:`popplay.deep.agents.ppo_members.PPOMembers`); only the loss and the one
step per rollout differ.

A one-agent ``popplay train a2c`` is EXARL's learner (whole episodes cut into
segments, an actor copy that may lag, V-trace); a population member learns from
fixed-length rollouts that run on across phases, which keeps the members in lockstep.
"""
from __future__ import annotations

import numpy as np
import torch

from popplay.deep.agents.ppo_members import PPOMembers
from popplay.deep.topologies.exarl_params import A2C_HYPER_BOUNDS

TAG_A2C = 15


class A2CMembers(PPOMembers):
    """P A2C learners for members ``members`` (slots), ``config.copies`` environments
    each, one update per rollout of ``config.n_steps``; ``config`` is a
    :class:`popplay.deep.topologies.exarl_params.A2CParams`."""

    hyper_bounds = A2C_HYPER_BOUNDS
    stream_tag = TAG_A2C

    def learn(self, next_obs: np.ndarray, progress_remaining: float = 1.0) -> int:
        """One step of every member on its whole rollout (``progress_remaining`` is
        unused: A2C's learning rate is constant)."""
        ones = torch.ones(self.count, 1, dtype=torch.float32, device=self.device)  # λ = 1: n-step returns
        obs, action, _, advantages, returns = self._member_rollout(next_obs, ones)
        losses = self._a2c_losses(obs, action, advantages, returns)
        self._step(torch.as_tensor(self.hypers["lr"], dtype=torch.float64, device=self.device))
        return self._learned(losses, 1)

    def _a2c_losses(self, obs: torch.Tensor, action: torch.Tensor, advantages: torch.Tensor,
                    returns: torch.Tensor) -> torch.Tensor:
        """Each member's loss on its rollout (P,); their gradients into ``net.grad``."""
        leaf, logp, entropy, values = self._terms(obs, action)
        policy_loss = -(advantages * logp).mean(dim=1, keepdim=True)
        value_loss = 0.5 * ((returns - values) ** 2).mean(dim=1, keepdim=True)
        losses = (policy_loss + self._column("value_coef") * value_loss
                  - self._column("entropy_coef") * entropy).squeeze(1)
        return self._backward(losses, leaf)

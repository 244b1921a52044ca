"""REINFORCE (Williams 1992) as the parameter-server draft runs it.

A small policy network gives a softmax over actions; a worker plays one episode,
computes the discounted returns G_t = Σ_k γ^k r_{t+k}, normalises them within the
episode, (G - mean) / (std + 0.001), and backpropagates the loss −Σ_t log π(a_t|s_t) G_t
(summed, not averaged). The parameter server sums the workers' gradients and steps
Adam. The running reward follows the parameter-server draft: R ← 0.05·reward + 0.95·R.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from popplay.deep.agents import networks
from popplay.deep.agents.adam import Adam
from popplay.deep.agents.config import ReinforceConfig
from popplay.deep.envs.rollout import episode_seed, play_episodes

RUNNING_RATE = 0.05
NORMALISE_EPS = 0.001


def policy_network(seed: int, obs_dim: int, actions: int, config: ReinforceConfig) -> nn.Module:
    return networks.seeded_mlp(seed, obs_dim, actions, config.hidden)


def discounted_returns(rewards: Sequence[float], gamma: float) -> torch.Tensor:
    """G_t = r_t + γ G_{t+1}, computed backwards in float64 then stored as float32."""
    out = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return torch.as_tensor(out, dtype=torch.float32)


def normalised_returns(returns: torch.Tensor, eps: float = NORMALISE_EPS) -> torch.Tensor:
    """(G - mean) / (std + eps) with the sample standard deviation (0 for one step)."""
    std = returns.std() if returns.numel() > 1 else torch.zeros(())
    return (returns - returns.mean()) / (std + eps)


def reinforce_loss(log_probs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """−Σ_t log π(a_t|s_t) · G_t (summed over the episode)."""
    return -(log_probs * weights).sum()


def update_running_reward(running: float, episode_reward: float, rate: float = RUNNING_RATE) -> float:
    return rate * episode_reward + (1.0 - rate) * running


class SampledPolicy:
    """Acts by sampling the policy's softmax with its own generator."""

    def __init__(self, policy: nn.Module, generator: torch.Generator) -> None:
        self.policy = policy
        self.generator = generator

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            probs = torch.softmax(self.policy(torch.as_tensor(obs, dtype=torch.float32)), dim=-1)
            # Inverse CDF with one uniform per row (cheaper than multinomial for a few actions).
            u = torch.rand(probs.shape[0], 1, generator=self.generator)
            action = (probs.cumsum(dim=-1) < u).sum(dim=-1).clamp_(max=probs.shape[-1] - 1)
        return action.numpy()


def episode_gradient(policy: nn.Module, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                     gamma: float) -> tuple[torch.Tensor, float]:
    """The flat gradient of one episode's REINFORCE loss (and the loss). The log
    probabilities are recomputed in one batch from the recorded states and actions:
    the same values, and gradients, as recording them step by step."""
    policy.zero_grad(set_to_none=True)
    logits = policy(torch.as_tensor(obs, dtype=torch.float32))
    log_probs = torch.log_softmax(logits, dim=-1).gather(1, torch.as_tensor(actions).long().view(-1, 1)).squeeze(1)
    loss = reinforce_loss(log_probs, normalised_returns(discounted_returns(rewards, gamma)))
    loss.backward()
    return networks.flat_gradients(policy), float(loss.detach())


def worker_generator(seed: int, worker: int) -> torch.Generator:
    """The action stream of worker ``worker`` (every topology gives a worker the same one)."""
    return networks.generator(seed * 1_000_003 + 17 * (worker + 1))


def worker_episode(policy: nn.Module, env: Any, generator: torch.Generator, seed: int, worker: int, index: int,
                   gamma: float, max_steps: int) -> tuple[torch.Tensor, float, int]:
    """Worker ``worker``'s episode ``index`` with ``policy``: (flat gradient, reward, steps)."""
    episodes = play_episodes(env, SampledPolicy(policy, generator), [episode_seed(seed, worker + 1, index)],
                             max_steps=max_steps)
    grad, _ = episode_gradient(policy, episodes.obs, episodes.action, episodes.reward, gamma)
    return grad, float(episodes.returns[0]), episodes.steps


@dataclass(eq=False)
class Reinforce:
    """REINFORCE as an on-policy agent (:class:`popplay.deep.agents.protocol.OnPolicyAgent`):
    what EXARL's workflows need to run it. Each trajectory a learner receives is one
    whole episode (the return needs its end); every step follows the mean of the episode
    gradients the learners hold that round (the parameter-server draft's server sums one per worker: the
    mean keeps the step the same however many learners share the work)."""

    config: ReinforceConfig
    obs_dim: int
    actions: int
    seed: int

    #: Learns from the episode it is given, once (no replay).
    on_policy = True

    def __post_init__(self) -> None:
        self.config.validate()
        self.policy = policy_network(self.seed, self.obs_dim, self.actions, self.config)
        self.optimizer = Adam(self.policy.parameters(), lr=self.config.lr)
        self.updates = 0
        self.received = 0  # env-steps learned from
        self.last_loss = float("nan")

    def networks(self) -> nn.Module:
        return self.policy

    def learn_shared(self, traj: Any, peers: Any) -> None:
        """One Adam step along the mean episode gradient of the learners holding one
        (``traj``: a ``(T, 1)`` trajectory of one episode, or None)."""
        if traj is not None:
            grad, self.last_loss = episode_gradient(self.policy, traj.obs[:, 0].numpy(), traj.action[:, 0].numpy(),
                                                    traj.reward[:, 0].numpy(), self.config.gamma)
        else:
            grad = torch.zeros(networks.parameter_count(self.policy))
        networks.set_flat_gradients(self.policy, peers.mean(grad, 1.0 if traj is not None else 0.0).float())
        self.optimizer.step()
        self.updates += 1

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {**networks.module_arrays(self.policy, "policy"), **self.optimizer.arrays("adam")}

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates, "received": self.received, "last_loss": self.last_loss}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        networks.load_module_arrays(self.policy, "policy", arrays)
        self.optimizer.load(arrays, "adam")
        self.updates = int(counters["updates"])
        self.received = int(counters["received"])
        self.last_loss = float(counters.get("last_loss", float("nan")))

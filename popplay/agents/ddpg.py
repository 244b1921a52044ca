"""DDPG (Lillicrap et al. 2016): a deterministic actor and a Q critic for continuous actions.

The critic regresses ``Q(s, a)`` on ``y = r + gamma (1 - terminated) Q'(s', mu'(s'))``
under slowly moving (Polyak-averaged) target networks ``Q'`` and ``mu'``; the
actor climbs ``Q(s, mu(s))``. With prioritised replay the squared TD errors are
weighted by the importance weights of the draw and the TD errors come back as the
items' new priorities (:mod:`popplay.agents.per`).

Batches are dicts of tensors: ``obs [B, obs_dim]``, ``action [B, act_dim]``,
``reward [B]``, ``next_obs [B, obs_dim]``, ``done [B]`` (1 where the episode
*terminated* at this step; a time-limit truncation is not an end and must be 0).
The building blocks here (actor, critic, soft update, noisy acting) are shared
with TD3.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import torch
from torch import nn

BATCH_FIELDS = ("obs", "action", "reward", "next_obs", "done")


def mlp(sizes: Sequence[int], out_activation: type[nn.Module] | None = None) -> nn.Sequential:
    """Linear layers with ReLU between them (and ``out_activation`` after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    if out_activation is not None:
        layers.append(out_activation())
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """``mu(s)``: a tanh MLP scaled onto the box ``[low, high]``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__()
        self.net = mlp([obs_dim, *hidden, act_dim], nn.Tanh)
        self.register_buffer("low", low.to(torch.float32).reshape(act_dim))
        self.register_buffer("high", high.to(torch.float32).reshape(act_dim))

    @property
    def scale(self) -> torch.Tensor:
        return (self.high - self.low) / 2

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.low + (self.net(obs) + 1) * self.scale


class Critic(nn.Module):
    """``Q(s, a)`` as an MLP over the concatenated observation and action; shape ``[B]``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.net = mlp([obs_dim + act_dim, *hidden, 1])

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, action], dim=-1)).squeeze(-1)


def copy_module(module: nn.Module) -> nn.Module:
    """A frozen copy for use as a target network (same class, same weights, no grads)."""
    import copy

    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging ``target <- tau source + (1 - tau) target``, parameter by parameter."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"soft_update: tau must lie in [0, 1], got {tau}")
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.mul_(1.0 - tau).add_(s, alpha=tau)


def check_batch(batch: dict[str, torch.Tensor], weights: torch.Tensor | None = None) -> int:
    missing = [f for f in BATCH_FIELDS if f not in batch]
    if missing:
        raise ValueError(f"batch lacks fields {missing}")
    n = batch["obs"].shape[0]
    for f in BATCH_FIELDS:
        if batch[f].shape[0] != n:
            raise ValueError(f"batch field {f} has {batch[f].shape[0]} rows, obs has {n}")
    if weights is not None and tuple(weights.shape) != (n,):
        raise ValueError(f"weights have shape {tuple(weights.shape)}, expected ({n},)")
    return n


@torch.no_grad()
def noisy_action(actor: Actor, obs: torch.Tensor, noise_std: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Exploration: ``mu(s)`` plus Gaussian noise of ``noise_std`` action half-ranges, kept in the box."""
    action = actor(obs)
    if noise_std > 0:
        noise = torch.randn(action.shape, generator=generator, dtype=action.dtype, device=action.device)
        action = action + noise * noise_std * actor.scale
    return torch.maximum(torch.minimum(action, actor.high), actor.low)


@dataclass(frozen=True)
class DDPGConfig:
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    hidden: tuple[int, ...] = (256, 256)
    exploration_noise: float = 0.1  # in action half-ranges


class DDPGAgent:
    """Networks, target networks and optimisers of one DDPG learner."""

    def __init__(self, actor: Actor, critic: Critic, config: DDPGConfig) -> None:
        self.config = config
        self.actor = actor
        self.critic = critic
        self.actor_target = copy_module(actor)
        self.critic_target = copy_module(critic)
        self.actor_opt = torch.optim.Adam(actor.parameters(), lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam(critic.parameters(), lr=config.critic_lr)
        self.updates = 0

    def act(self, obs: torch.Tensor, explore: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        return noisy_action(self.actor, obs, self.config.exploration_noise if explore else 0.0, generator)


def make_ddpg(obs_dim: int, low: Sequence[float], high: Sequence[float], config: DDPGConfig = DDPGConfig(), seed: int = 0) -> DDPGAgent:
    """A DDPG learner for a box of actions ``[low, high]``; weights drawn from ``seed``."""
    low_t = torch.as_tensor(low, dtype=torch.float32).reshape(-1)
    high_t = torch.as_tensor(high, dtype=torch.float32).reshape(-1)
    if low_t.shape != high_t.shape or not bool((high_t > low_t).all()):
        raise ValueError("make_ddpg: the action box needs low < high in every dimension")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        actor = Actor(obs_dim, low_t.numel(), config.hidden, low_t, high_t)
        critic = Critic(obs_dim, low_t.numel(), config.hidden)
    return DDPGAgent(actor, critic, config)


class DDPGStats(NamedTuple):
    critic_loss: float
    actor_loss: float
    td_errors: torch.Tensor  # [B], y - Q(s, a) before the step: new priorities under PER
    targets: torch.Tensor  # [B], y


def ddpg_target(agent: DDPGAgent, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``y = r + gamma (1 - done) Q'(s', mu'(s'))``, without gradient."""
    with torch.no_grad():
        next_q = agent.critic_target(batch["next_obs"], agent.actor_target(batch["next_obs"]))
        return batch["reward"] + agent.config.gamma * (1.0 - batch["done"].to(next_q.dtype)) * next_q


def ddpg_update(agent: DDPGAgent, batch: dict[str, torch.Tensor], weights: torch.Tensor | None = None) -> DDPGStats:
    """One critic step, one actor step and one soft target update.

    ``weights``: importance weights of a prioritised draw (``None``: uniform replay).
    """
    check_batch(batch, weights)
    y = ddpg_target(agent, batch)
    q = agent.critic(batch["obs"], batch["action"])
    td = y - q
    sq = td.pow(2)
    critic_loss = (sq * weights).mean() if weights is not None else sq.mean()
    agent.critic_opt.zero_grad(set_to_none=True)
    critic_loss.backward()
    agent.critic_opt.step()

    actor_loss = -agent.critic(batch["obs"], agent.actor(batch["obs"])).mean()
    agent.actor_opt.zero_grad(set_to_none=True)
    actor_loss.backward()
    # this backward also leaves gradients on the critic; the critic's next zero_grad drops them
    agent.actor_opt.step()

    soft_update(agent.critic_target, agent.critic, agent.config.tau)
    soft_update(agent.actor_target, agent.actor, agent.config.tau)
    agent.updates += 1
    return DDPGStats(float(critic_loss.detach()), float(actor_loss.detach()), td.detach(), y)


def per_update(agent: Any, replay: Any, batch_size: int, update: Any, generator: torch.Generator | None = None) -> Any:
    """Draw from a :class:`~popplay.agents.per.PrioritizedReplay`, update with its weights, re-prioritise.

    ``update(agent, batch, weights)`` is :func:`ddpg_update` or :func:`~popplay.agents.td3.td3_update`.
    """
    draw = replay.sample(batch_size, generator=generator)
    stats = update(agent, draw.data, draw.weights)
    replay.update_priorities(draw.indices, stats.td_errors)
    return stats

"""TD3 (Fujimoto et al. 2018): DDPG with three fixes for Q overestimation, each switchable.

- **Clipped double Q** (``clipped_double_q``): two critics; the target takes the
  smaller of the two target critics, ``y = r + gamma (1 - done) min(Q1', Q2')(s', a')``.
  Off: both critics still learn, towards ``Q1'`` alone.
- **Delayed policy updates** (``policy_delay``): the actor and all target networks
  move once every ``policy_delay`` critic steps (1: every step, as in DDPG).
- **Target policy smoothing** (``target_smoothing``): the target action is
  ``clip(mu'(s') + clip(N(0, sigma), -c, c), low, high)`` with ``sigma =
  target_noise`` and ``c = noise_clip`` action half-ranges. Off: ``a' = mu'(s')``.

Batches as in :mod:`popplay.agents.ddpg`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from popplay.agents.ddpg import Actor, Critic, check_batch, copy_module, noisy_action, soft_update


@dataclass(frozen=True)
class TD3Config:
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    hidden: tuple[int, ...] = (256, 256)
    exploration_noise: float = 0.1  # in action half-ranges
    clipped_double_q: bool = True
    policy_delay: int = 2
    target_smoothing: bool = True
    target_noise: float = 0.2  # in action half-ranges
    noise_clip: float = 0.5  # in action half-ranges

    def __post_init__(self) -> None:
        if self.policy_delay < 1:
            raise ValueError(f"TD3Config: policy_delay must be >= 1, got {self.policy_delay}")
        if self.target_noise < 0 or self.noise_clip < 0:
            raise ValueError("TD3Config: target_noise and noise_clip must be >= 0")


class TD3Agent:
    """Actor, twin critics, their targets and optimisers of one TD3 learner."""

    def __init__(self, actor: Actor, critic1: Critic, critic2: Critic, config: TD3Config) -> None:
        self.config = config
        self.actor = actor
        self.critic1 = critic1
        self.critic2 = critic2
        self.actor_target = copy_module(actor)
        self.critic1_target = copy_module(critic1)
        self.critic2_target = copy_module(critic2)
        self.actor_opt = torch.optim.Adam(actor.parameters(), lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam(
            [*critic1.parameters(), *critic2.parameters()], lr=config.critic_lr
        )
        self.updates = 0  # critic steps so far: the clock of the policy delay

    def act(self, obs: torch.Tensor, explore: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        return noisy_action(self.actor, obs, self.config.exploration_noise if explore else 0.0, generator)


def make_td3(obs_dim: int, low: Sequence[float], high: Sequence[float], config: TD3Config = TD3Config(), seed: int = 0) -> TD3Agent:
    """A TD3 learner for a box of actions ``[low, high]``; weights drawn from ``seed``."""
    low_t = torch.as_tensor(low, dtype=torch.float32).reshape(-1)
    high_t = torch.as_tensor(high, dtype=torch.float32).reshape(-1)
    if low_t.shape != high_t.shape or not bool((high_t > low_t).all()):
        raise ValueError("make_td3: the action box needs low < high in every dimension")
    act_dim = low_t.numel()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        actor = Actor(obs_dim, act_dim, config.hidden, low_t, high_t)
        critic1 = Critic(obs_dim, act_dim, config.hidden)
        critic2 = Critic(obs_dim, act_dim, config.hidden)
    return TD3Agent(actor, critic1, critic2, config)


def target_action(agent: TD3Agent, next_obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``a'``: the target actor's action, smoothed with clipped noise when switched on."""
    cfg = agent.config
    actor = agent.actor_target
    with torch.no_grad():
        action = actor(next_obs)
        if not cfg.target_smoothing:
            return action
        noise = torch.randn(action.shape, generator=generator, dtype=action.dtype, device=action.device)
        noise = torch.clamp(noise * cfg.target_noise, -cfg.noise_clip, cfg.noise_clip) * actor.scale
        return torch.maximum(torch.minimum(action + noise, actor.high), actor.low)


def td3_target(agent: TD3Agent, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None) -> torch.Tensor:
    """The critics' regression target ``y`` ([B], no gradient)."""
    with torch.no_grad():
        next_obs = batch["next_obs"]
        a = target_action(agent, next_obs, generator)
        q = agent.critic1_target(next_obs, a)
        if agent.config.clipped_double_q:
            q = torch.minimum(q, agent.critic2_target(next_obs, a))
        return batch["reward"] + agent.config.gamma * (1.0 - batch["done"].to(q.dtype)) * q


class TD3Stats(NamedTuple):
    critic_loss: float
    actor_loss: float | None  # None on steps where the policy update is delayed
    td_errors: torch.Tensor  # [B], y - Q1(s, a) before the step
    targets: torch.Tensor  # [B], y
    actor_updated: bool


def td3_update(
    agent: TD3Agent,
    batch: dict[str, torch.Tensor],
    weights: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> TD3Stats:
    """One critic step; every ``policy_delay``-th call also an actor step and soft target updates.

    ``weights``: importance weights of a prioritised draw (``None``: uniform).
    ``generator`` draws the target-smoothing noise.
    """
    check_batch(batch, weights)
    cfg = agent.config
    y = td3_target(agent, batch, generator)
    q1 = agent.critic1(batch["obs"], batch["action"])
    q2 = agent.critic2(batch["obs"], batch["action"])
    td1 = y - q1
    sq = td1.pow(2) + (y - q2).pow(2)
    critic_loss = (sq * weights).mean() if weights is not None else sq.mean()
    agent.critic_opt.zero_grad(set_to_none=True)
    critic_loss.backward()
    agent.critic_opt.step()
    agent.updates += 1

    actor_loss = None
    updated = agent.updates % cfg.policy_delay == 0
    if updated:
        loss = -agent.critic1(batch["obs"], agent.actor(batch["obs"])).mean()
        agent.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        # this backward also leaves gradients on critic1; the critics' next zero_grad drops them
        agent.actor_opt.step()
        actor_loss = float(loss.detach())
        soft_update(agent.critic1_target, agent.critic1, cfg.tau)
        soft_update(agent.critic2_target, agent.critic2, cfg.tau)
        soft_update(agent.actor_target, agent.actor, cfg.tau)
    return TD3Stats(float(critic_loss.detach()), actor_loss, td1.detach(), y, updated)

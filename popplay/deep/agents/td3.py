"""TD3 (Fujimoto et al. 2018): DDPG with three fixes for Q overestimation, each switchable.

- **Clipped double Q** (``clipped_double_q``): two critics; the target takes the
  smaller of the two target critics, ``y = r + gamma (1 - terminated) min(Q1', Q2')(s', a')``.
  Off: both critics still learn, towards ``Q1'`` alone.
- **Delayed policy updates** (``policy_delay``): the actor and all target networks
  move once every ``policy_delay`` critic steps (1: every step, as in DDPG).
- **Target policy smoothing** (``target_smoothing``): the target action is
  ``clip(mu'(s') + clip(N(0, sigma), -c, c), low, high)`` with ``sigma =
  target_noise`` and ``c = noise_clip`` in action half-ranges. Off: ``a' = mu'(s')``.

Batches, exploration, replay (uniform or prioritised) and run-file arrays as in
:mod:`popplay.deep.agents.ddpg`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from popplay.deep.agents import networks
from popplay.deep.agents.adam import Adam
from popplay.deep.agents.config import TD3Config
from popplay.deep.agents.ddpg import (
    Actor,
    ContinuousLearner,
    Critic,
    frozen_copy,
    soft_update,
    weighted_mse,
)
from popplay.deep.agents.replay import Batch


def target_actions(next_obs: torch.Tensor, actor_target: Actor, config: TD3Config,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """``a'``: the target actor's action, smoothed with clipped noise when switched on."""
    with torch.no_grad():
        action = actor_target(next_obs)
        if not config.target_smoothing:
            return action
        noise = torch.randn(action.shape, generator=generator, dtype=action.dtype)
        noise = torch.clamp(noise * config.target_noise, -config.noise_clip, config.noise_clip)
        return actor_target.clip(action + noise * actor_target.scale)


def td3_targets(batch: Batch, actor_target: Actor, critic1_target: Critic, critic2_target: Critic,
                config: TD3Config, generator: torch.Generator | None = None) -> torch.Tensor:
    """The critics' regression target ``y`` ((B,), no gradient)."""
    with torch.no_grad():
        a = target_actions(batch.next_obs, actor_target, config, generator)
        q = critic1_target(batch.next_obs, a)
        if config.clipped_double_q:
            q = torch.minimum(q, critic2_target(batch.next_obs, a))
        return batch.reward + config.gamma * (1.0 - batch.terminated) * q


@dataclass
class TD3Stats:
    critic_loss: float
    actor_loss: float | None  # None on steps where the policy update is delayed
    td_errors: torch.Tensor  # (B,), y - Q1(s, a) before the step
    targets: torch.Tensor  # (B,), y
    actor_updated: bool


@dataclass(eq=False)
class TD3(ContinuousLearner):
    """The learner's state: actor, twin critics, their targets, Adam, replay, and the
    generator of the target-smoothing noise."""

    config: TD3Config
    obs_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    seed: int
    actor: Actor = field(init=False)
    critic1: Critic = field(init=False)
    critic2: Critic = field(init=False)

    def __post_init__(self) -> None:
        self.config.validate()
        action_dim = len(self.action_low)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.actor = Actor(self.obs_dim, self.action_low, self.action_high, self.config.hidden)
            self.critic1 = Critic(self.obs_dim, action_dim, self.config.hidden)
            self.critic2 = Critic(self.obs_dim, action_dim, self.config.hidden)
        self.actor_target = frozen_copy(self.actor)
        self.critic1_target = frozen_copy(self.critic1)
        self.critic2_target = frozen_copy(self.critic2)
        self.actor_opt = Adam(self.actor.parameters(), lr=self.config.actor_lr)
        self.critic_opt = Adam([*self.critic1.parameters(), *self.critic2.parameters()], lr=self.config.critic_lr)
        self.smoothing = networks.generator(self.seed * 7919 + 2)
        self._init_replay()

    def modules(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic1": self.critic1, "critic2": self.critic2,
                "actor_target": self.actor_target, "critic1_target": self.critic1_target,
                "critic2_target": self.critic2_target}

    def optimizers(self) -> dict[str, Adam]:
        return {"adam_actor": self.actor_opt, "adam_critic": self.critic_opt}

    def generators(self) -> dict[str, torch.Generator]:
        return {"sampler": self.sampler, "smoothing": self.smoothing}

    def learn(self, batch: Batch, weights: torch.Tensor | None = None) -> TD3Stats:
        return td3_update(self, batch, weights)

    def critics(self) -> list[nn.Module]:
        return [self.critic1, self.critic2]

    def critic_loss(self, batch: Batch, weights: torch.Tensor | None,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = td3_targets(batch, self.actor_target, self.critic1_target, self.critic2_target, self.config,
                        self.smoothing if generator is None else generator)
        td1 = y - self.critic1(batch.obs, batch.action)
        td2 = y - self.critic2(batch.obs, batch.action)
        return weighted_mse(td1, weights) + weighted_mse(td2, weights), td1, y

    def actor_due(self, updates: int) -> bool:
        return updates % self.config.policy_delay == 0


def td3_update(agent: TD3, batch: Batch, weights: torch.Tensor | None = None) -> TD3Stats:
    """One critic step; every ``policy_delay``-th call also an actor step and soft
    updates of all three target networks.

    ``weights``: importance weights of a prioritised draw (``None``: uniform).
    """
    n = batch.obs.shape[0]
    if weights is not None and tuple(weights.shape) != (n,):
        raise ValueError(f"weights have shape {tuple(weights.shape)}, expected ({n},)")
    cfg = agent.config
    critic_loss, td1, y = agent.critic_loss(batch, weights)
    agent.critic_opt.zero_grad(set_to_none=True)
    critic_loss.backward()
    agent.critic_opt.step()
    agent.updates += 1

    actor_loss = None
    due = agent.actor_due(agent.updates)
    if due:
        loss = agent.actor_loss(batch.obs)
        agent.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        # this backward also leaves gradients on critic1; the critics' next zero_grad drops them
        agent.actor_opt.step()
        actor_loss = float(loss.detach())
        soft_update(agent.critic1_target, agent.critic1, cfg.tau)
        soft_update(agent.critic2_target, agent.critic2, cfg.tau)
        soft_update(agent.actor_target, agent.actor, cfg.tau)
    return TD3Stats(float(critic_loss.detach()), actor_loss, td1.detach(), y, due)

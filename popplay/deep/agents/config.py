"""The deep agents' hyper-parameter dataclasses (DQN, REINFORCE, A2C, DDPG, TD3) and what
they share: ``hidden`` widths stored as a list in run files, and the network checks every
learner makes.

They import no torch, so that a launcher checks a run's settings, starts its ranks and
waits for them without loading torch: a multi-process job's launcher took 2.0-2.3 s of CPU
when its settings check loaded torch, and takes 0.4-0.8 s without (this project's 2-core
machine). Each agent's module re-exports its config (``popplay.deep.agents.dqn.DQNConfig``...).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class HiddenConfig:
    """Mix-in for frozen config dataclasses with a ``hidden`` tuple of layer widths."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        d["hidden"] = list(self.hidden)  # type: ignore[attr-defined]
        return d


def check_at_least_one(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1 (got {value})")


def check_network(config: Any, positive: tuple[str, ...] = ("lr",)) -> None:
    """Positive layer widths, positive ``positive`` fields (learning rates...), γ in [0, 1]."""
    if not config.hidden or any(h < 1 for h in config.hidden):
        raise ValueError(f"hidden must list positive layer widths (got {config.hidden})")
    for name in positive:
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be positive (got {getattr(config, name)})")
    if not 0.0 <= config.gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1] (got {config.gamma})")


def check_replay_start(config: Any) -> None:
    """A replay agent's ``learning_starts``: non-negative, and within ``replay_capacity``
    (else the memory never holds that many transitions and the first update never comes)."""
    if config.learning_starts < 0:
        raise ValueError(f"learning_starts must be non-negative (got {config.learning_starts})")
    if config.learning_starts > config.replay_capacity:
        raise ValueError(f"learning_starts ({config.learning_starts}) exceeds the replay capacity "
                         f"({config.replay_capacity}): the memory never holds that many transitions, so "
                         "nothing would be learned")


@dataclass(frozen=True)
class DQNConfig(HiddenConfig):
    """Hyper-parameters of Double DQN (defaults tuned on CartPole-v1; see docs/deep.md)."""

    hidden: tuple[int, ...] = (128, 128)
    lr: float = 1e-3
    gamma: float = 0.99
    batch_size: int = 64
    replay_capacity: int = 50_000
    learning_starts: int = 1_000  # transitions in replay before the first update
    update_ratio: float = 0.25  # gradient updates per environment step received
    target_every: int = 250  # updates between target refreshes
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_updates: int = 5_000  # updates over which ε falls linearly
    max_grad_norm: float = 10.0
    lr_end: float = 0.0  # learning rate reached after ``lr_updates`` updates (linear)
    lr_updates: int = 0  # 0: the learning rate stays ``lr``

    def validate(self) -> None:
        check_network(self)
        if not (self.lr > 0 and self.lr_end >= 0):
            raise ValueError(f"lr must be positive and lr_end non-negative (got {self.lr}, {self.lr_end})")
        if self.lr_updates < 0:
            raise ValueError(f"lr_updates must be non-negative (got {self.lr_updates})")
        for name in ("batch_size", "replay_capacity", "target_every", "epsilon_updates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        check_replay_start(self)
        if not self.update_ratio > 0:
            raise ValueError(f"update_ratio must be positive (got {self.update_ratio})")
        if not (0.0 <= self.epsilon_end <= 1.0 and 0.0 <= self.epsilon_start <= 1.0):
            raise ValueError("epsilon_start and epsilon_end must be in [0, 1]")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive (got {self.max_grad_norm})")


@dataclass(frozen=True)
class ReinforceConfig(HiddenConfig):
    hidden: tuple[int, ...] = (128,)
    lr: float = 1e-2
    gamma: float = 0.99

    def validate(self) -> None:
        check_network(self)


@dataclass(frozen=True)
class A2CConfig(HiddenConfig):
    """Hyper-parameters of A2C (defaults for CartPole-scale tasks)."""

    hidden: tuple[int, ...] = (64, 64)
    lr: float = 1e-3
    gamma: float = 0.99
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    vtrace: bool = True
    rho_bar: float = 1.0
    c_bar: float = 1.0

    def validate(self) -> None:
        check_network(self, ("lr", "max_grad_norm", "rho_bar", "c_bar"))
        for name in ("value_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be non-negative (got {getattr(self, name)})")


@dataclass(frozen=True)
class DDPGConfig(HiddenConfig):
    """Hyper-parameters of DDPG (defaults: Fujimoto et al.'s "our DDPG" on Pendulum-scale tasks)."""

    hidden: tuple[int, ...] = (256, 256)
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    replay_capacity: int = 200_000
    learning_starts: int = 1_000  # transitions in replay before the first update
    update_ratio: float = 1.0  # gradient updates per environment step received
    exploration_noise: float = 0.1  # in action half-ranges
    per: bool = False
    per_alpha: float = 0.6
    per_beta0: float = 0.4
    per_beta_updates: int = 20_000  # updates over which beta rises to 1

    def validate(self) -> None:
        check_network(self, ("actor_lr", "critic_lr", "update_ratio"))
        if not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"tau must be in [0, 1] (got {self.tau})")
        for name in ("batch_size", "replay_capacity"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        check_replay_start(self)
        if self.exploration_noise < 0:
            raise ValueError(f"exploration_noise must be non-negative (got {self.exploration_noise})")
        if self.per_alpha < 0 or not 0.0 <= self.per_beta0 <= 1.0:
            raise ValueError("per_alpha must be non-negative and per_beta0 in [0, 1]")


@dataclass(frozen=True)
class TD3Config(DDPGConfig):
    """DDPG's hyper-parameters plus TD3's three switches (defaults: the TD3 paper)."""

    clipped_double_q: bool = True
    policy_delay: int = 2
    target_smoothing: bool = True
    target_noise: float = 0.2  # in action half-ranges
    noise_clip: float = 0.5  # in action half-ranges

    def validate(self) -> None:
        super().validate()
        if self.policy_delay < 1:
            raise ValueError(f"policy_delay must be at least 1 (got {self.policy_delay})")
        if self.target_noise < 0 or self.noise_clip < 0:
            raise ValueError("target_noise and noise_clip must be non-negative")

"""PPO with a clipped surrogate, GAE(λ), minibatch epochs over vectorised rollouts.

This module is PPO's plug-in: its hyper-parameters (each written once, with its help:
the command line's ``popplay train ppo`` options, the TOML ``--config`` keys and the run
file's config all come from these fields) and its registration. It imports neither
torch nor gymnasium, so listing commands stays fast; the agent is
:mod:`popplay.deep.agents.ppo`, the topology :mod:`popplay.deep.topologies.rollout`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from popplay.core.options import option, parse_widths
from popplay.core.registry import DEEP, DomainSpec, register
from popplay.deep.agents.config import check_at_least_one, check_network
from popplay.deep.topologies.deep_params import EnvChecked
from popplay.deep.topologies.population_params import PopulationLayout, rollout_population_bytes
from popplay.deep.topologies.workflow_params import WorkflowParams
from popplay.operators.hyper import Bounds

#: The hyper-parameters a PPO population may set per member (``--hp``), and their bounds.
HYPER_BOUNDS = {
    "lr": Bounds(0.0, low_open=True),
    "gamma": Bounds(0.0, 1.0),
    "gae_lambda": Bounds(0.0, 1.0),
    "clip_range": Bounds(0.0, low_open=True),
    "entropy_coef": Bounds(0.0),
    "value_coef": Bounds(0.0),
    "max_grad_norm": Bounds(0.0, low_open=True),
}


def _non_negative(params: Any, *names: str) -> None:
    for name in names:
        if getattr(params, name) < 0:
            raise ValueError(f"{name} must be non-negative (got {getattr(params, name)})")


@dataclass(frozen=True)
class PPOParams(EnvChecked, PopulationLayout, WorkflowParams):
    """Train PPO (clipped surrogate, GAE(λ), value loss, entropy bonus, minibatch epochs
    over rollouts of vectorised environments).

    Defaults are RL Baselines3 Zoo's tuned CartPole-v1 settings (8 copies x 32 steps,
    20 epochs of minibatches of 256, γ 0.98, λ 0.8, learning rate and clip range falling
    linearly to 0 over an --env-steps budget). The other --workflow choices run EXARL's
    multi-process workflows: data-parallel --learners fed whole episodes by --actors."""

    members_keep_replay: ClassVar[bool] = False  # they learn from their own rollouts or episodes
    domain: ClassVar[str] = "ppo"

    env: str = option("CartPole-v1", "A gymnasium id with discrete actions (CartPole-v1, Acrobot-v1, "
                                     "LunarLander-v3 with the box2d extra, popplay/CartPole-v1, ...).")
    copies: int = option(8, "Environment copies stepped together (each rollout has copies x n-steps rows).", min=1)
    n_steps: int = option(32, "Steps of each copy per rollout (one learning phase each).", min=1)
    env_steps: int = option(0, "Budget: environment steps over all copies (0: none; schedules anneal over it).",
                            min=0, budget=True)
    episodes: int = option(0, "Budget: finished episodes over all copies (0: none; with --env-steps, whichever "
                              "comes first).", min=0, budget=True)
    seed: int = option(0, "Seed of every random stream.")
    hidden: tuple[int, ...] = option((64, 64), "Hidden widths of the policy and value networks (tanh).")
    lr: float = option(1e-3, "Adam learning rate at the start.")
    lr_end: float = option(0.0, "Learning rate at the end of an --env-steps budget (linear in between).", min=0.0)
    gamma: float = option(0.98, "Discount γ.", min=0.0, max=1.0)
    gae_lambda: float = option(0.8, "GAE λ (0: one-step TD advantages, 1: Monte-Carlo).", min=0.0, max=1.0)
    clip_range: float = option(0.2, "Clip range ε of the probability ratio at the start.")
    clip_range_end: float = option(0.0, "Clip range at the end of an --env-steps budget (linear in between).",
                                   min=0.0)
    n_epochs: int = option(20, "Passes over each rollout.", min=1)
    batch_size: int = option(256, "Rows of each minibatch.", min=1)
    value_coef: float = option(0.5, "Weight of the value loss.", min=0.0)
    entropy_coef: float = option(0.0, "Weight of the entropy bonus.", min=0.0)
    max_grad_norm: float = option(0.5, "Gradient norm clip.")
    normalize_advantage: bool = option(True, "Normalise advantages within each minibatch.")
    adam_eps: float = option(1e-5, "Adam's ε.")
    eval_episodes: int = option(100, "Greedy episodes played at the end for `quality` (0: skip).", min=0)

    def __post_init__(self) -> None:
        hidden = parse_widths(self.hidden) if isinstance(self.hidden, str) else tuple(int(v) for v in self.hidden)
        object.__setattr__(self, "hidden", hidden)

    def validate(self) -> None:
        self._validate_layout()
        check_network(self, ("lr", "clip_range", "max_grad_norm", "adam_eps"))
        check_at_least_one(copies=self.copies, n_steps=self.n_steps, n_epochs=self.n_epochs,
                           batch_size=self.batch_size)
        _non_negative(self, "env_steps", "episodes", "lr_end", "clip_range_end", "value_coef", "entropy_coef",
                      "eval_episodes")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda must be in [0, 1] (got {self.gae_lambda})")
        self._check_population(HYPER_BOUNDS, self.workflow, "--workflow")

    def schedules_stretched_by(self, resumed: "PPOParams") -> list[str]:
        """What anneals over this run's --env-steps budget and would anneal over another
        in ``resumed`` (a resume with a new budget re-plans what is left of it)."""
        if not self.env_steps or resumed.env_steps == self.env_steps:
            return []
        varied = {spec.name for spec in self.hyper_specs(HYPER_BOUNDS)}  # per member: may differ from the end
        return ([f"the learning rate (to --lr-end {self.lr_end:g})"]
                if self.lr_end != self.lr or "lr" in varied else []) + \
            ([f"the clip range (to --clip-range-end {self.clip_range_end:g})"]
             if self.clip_range_end != self.clip_range or "clip_range" in varied else [])

    def schedule(self, progress_remaining: float) -> tuple[float, float]:
        """``(learning rate, clip range)`` at ``progress_remaining`` in [0, 1]: linear
        from the start values (1) to the end values (0), as SB3's ``lin_`` schedules."""
        if not 0.0 <= progress_remaining <= 1.0:
            raise ValueError(f"progress_remaining must be in [0, 1] (got {progress_remaining})")
        return (self.lr_end + (self.lr - self.lr_end) * progress_remaining,
                self.clip_range_end + (self.clip_range - self.clip_range_end) * progress_remaining)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["hidden"] = list(self.hidden)
        return out

    def agent_config(self) -> Any:
        """The agent's hyper-parameters: these parameters themselves."""
        return self

    def new_learner(self, info: Any) -> Any:
        """The agent of this run on ``info``'s spaces."""
        from popplay.deep.agents.ppo import PPO  # defers torch

        return PPO(self, info.obs_dim, int(info.actions), self.seed)


def memory_bytes(params: PPOParams, world: int = 1, local: int = 1) -> int:
    """A population's networks, rollouts and environments (0 for one agent)."""
    return rollout_population_bytes(params.agents, params.hidden, params.copies, params.n_steps)


register(DomainSpec(name="ppo", params=PPOParams, experiment="popplay.deep.topologies.rollout:RolloutExperiment",
                    kind=DEEP, steps_label="environment steps", lineage_parameters=tuple(HYPER_BOUNDS),
                    memory=memory_bytes,
                    summary="PPO: clipped surrogate, GAE(λ), minibatch epochs over vectorised rollouts."))

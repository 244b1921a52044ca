"""What the parameter dataclasses of deep runs share, importing neither torch nor the
agents: their help texts, the ``hidden`` widths, the environment check and the agent
config they turn into. A domain's parameter module imports this and stays light, so
``popplay train DOMAIN --help`` and a refused command line answer before torch loads;
its experiment module (heavy) imports the parameters from there."""
from __future__ import annotations

import dataclasses
from typing import Any

from popplay.core.options import parse_widths
from popplay.deep import envs
from popplay.deep.agents.config import HiddenConfig

ENV_HELP = "A gymnasium id (CartPole-v1, LunarLander-v3 with the box2d extra, popplay/CartPole-v1, ...)."
EPISODES_HELP = "Budget: episodes summed over all simulators (0: none; with --env-steps, whichever comes first)."
ENV_STEPS_HELP = "Budget: environment steps summed over all simulators (0: none)."
EVAL_HELP = "Greedy episodes played at the end for `quality` (0: skip)."
TIMEOUT_HELP = "Seconds any wait for another rank may take before the job ends with an error."
GAMMA_HELP = "Discount γ."
SEED_HELP = "Seed of every random stream."


def tuple_of_ints(value: Any) -> tuple[int, ...]:
    """``hidden`` from a dataclass field, a run file's list, or "128,128"."""
    if isinstance(value, str):
        return tuple(int(v) for v in value.replace(" ", "").split(",") if v)
    return tuple(int(v) for v in value)


class EnvChecked:
    """Mix-in for parameters with an ``env`` id."""

    def check_environment(self) -> None:
        """Refuse an ``env`` id that names no environment here (:class:`popplay.deep.envs.EnvError`,
        one line). Cheap (gymnasium's registry, no torch): the command line calls it first."""
        envs.check_env_id(self.env)  # type: ignore[attr-defined]


class DeepParams(EnvChecked, HiddenConfig):
    """Mix-in for the frozen parameter dataclasses of deep runs (``hidden`` field)."""

    def __post_init__(self) -> None:
        hidden = self.hidden  # type: ignore[attr-defined]
        object.__setattr__(self, "hidden", parse_widths(hidden) if isinstance(hidden, str) else tuple_of_ints(hidden))


def config_from(params: Any, config_type: type) -> Any:
    """``config_type`` built from the fields of ``params`` that it has."""
    names = {f.name for f in dataclasses.fields(config_type)}
    return config_type(**{k: v for k, v in dataclasses.asdict(params).items() if k in names})


def check_evaluation_and_timeout(eval_episodes: int, timeout: float | None = None) -> None:
    if eval_episodes < 0:
        raise ValueError(f"eval_episodes must be non-negative (got {eval_episodes})")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be positive (got {timeout})")

"""What the deep experiments share: budgets, episode curves, greedy evaluation."""
from __future__ import annotations

from typing import Any

import numpy as np

from popplay.deep import envs
from popplay.deep.envs.rollout import evaluate


def check_budget(episodes: int, env_steps: int) -> None:
    """Budgets are counts (0: none). That some budget is given, a step count or a
    time, is :func:`popplay.training.pipeline.train`'s check."""
    if episodes < 0 or env_steps < 0:
        raise ValueError("budgets must be non-negative")


def budget_reached(episodes_done: int, steps_done: int, episodes: int, env_steps: int) -> bool:
    """Whichever budget is given (both: whichever comes first)."""
    return bool((episodes and episodes_done >= episodes) or (env_steps and steps_done >= env_steps))


def estimated_budget_steps(episodes_done: int, steps_done: int, episodes: int, env_steps: int) -> int:
    """Environment steps at the end of the budget (for the console's bar and ETA)."""
    if env_steps:
        return env_steps
    if episodes_done == 0:
        return 0
    return steps_done + max(0, episodes - episodes_done) * max(1, steps_done // episodes_done)


def recent_mean(returns: list[float], window: int = 100) -> float:
    return float(np.mean(returns[-window:])) if returns else float("nan")


def greedy_quality(env_id: str, act: Any, episodes: int, seed: int) -> tuple[float, np.ndarray]:
    """Mean return of ``episodes`` greedy episodes (the ``quality`` every run reports)."""

    env = envs.make_vector(env_id, 1)
    try:
        returns = evaluate(env, act, episodes, seed)
    finally:
        env.close()
    return float(returns.mean()) if returns.size else float("nan"), returns

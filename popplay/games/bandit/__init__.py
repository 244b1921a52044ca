"""Bell §1: N-armed bandit populations with count-weighted sharing."""
from __future__ import annotations

from typing import Any

from popplay.core.registry import DomainSpec, register

_F8 = 8


def memory_bytes(p: Any, world: int = 1, local: int = 1) -> int:
    """What a bandit run holds: per trial its tables and arm means, per agent the
    per-phase buffers of the arms it touched (every rank holds its own trials or agents,
    counted as the whole run once per machine)."""
    trials, agents, arms = int(p.trials), int(p.agents), int(p.arms)
    per_trial = arms * _F8 * 6  # q, n, means, ranking order and rank, a copy when saving
    # the per-phase buffers of touched arms: trials x agents x min(arms, steps per phase), three int64 each
    touched = min(arms, int(p.share_every))
    per_agent = 3 * _F8 * touched + 6 * _F8  # plus epsilon, top-k and group per agent
    return trials * per_trial + trials * agents * per_agent


SPEC = register(DomainSpec(
    name="bandit", params="popplay.games.bandit.rules:BanditParams",
    experiment="popplay.games.bandit.experiment:BanditExperiment", sharded=True, splits_trials=True,
    memory=memory_bytes, budget_counter=("step", "steps_per_agent"),
    plot_units={"quality": "fraction of trials whose shared\nestimate picks the best arm"},
))

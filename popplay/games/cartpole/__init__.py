"""Bell §2: cart-pole populations learning tabular TD(λ) with weighted sharing and differentiation."""
from __future__ import annotations

from typing import Any

from popplay.core.backend import shard_layout
from popplay.core.registry import DomainSpec, register
from popplay.games.cartpole.rules import LINEAGE_PARAMETERS, STATE_ACTIONS

_F8 = 8


def memory_bytes(p: Any, world: int = 1, local: int = 1) -> int:
    """One machine's need: ``local`` of the job's ``world`` ranks run on it. A rank of
    the trial layout holds its trials' tables and the whole population's small
    bookkeeping (α, λ, ε, ids, fitness, the lineage's founders); a rank of the agent
    layout holds everything."""
    trials, agents = int(p.trials), int(p.agents)
    # q, trace, weight and three recycled buffers of the same size, plus positions and counters
    per_agent = 7 * STATE_ACTIONS * _F8 + 12 * _F8  # measured within 15% (100 x 1000 agents)
    whole = trials * agents * per_agent + trials * STATE_ACTIONS * _F8 * 2
    if shard_layout(trials, world) != "trials":
        return local * whole
    # ids, α, λ, ε, fitness, the lineage's founders and, on the writer, the save's
    # compact copies of every rank's trials: measured 553 B per agent-trial
    # (benchmarks/distributed.py --memory)
    bookkeeping = trials * agents * 75 * _F8 + trials * STATE_ACTIONS * _F8 * 2
    return local * ((trials // world) * agents * (7 * STATE_ACTIONS * _F8 + 7 * _F8) + bookkeeping)


SPEC = register(DomainSpec(
    name="cartpole", params="popplay.games.cartpole.rules:CartPolePopulationParams",
    experiment="popplay.games.cartpole.experiment:CartPoleExperiment", sharded=True, splits_trials=True,
    memory=memory_bytes, budget_counter=("step", "steps_per_agent"), lineage_parameters=LINEAGE_PARAMETERS,
    plot_units={"quality": "steps balanced by the shared policy\n(mean over trials, cap {test_steps})",
                "balanced": "fraction of tests balanced\nto the cap"},
))

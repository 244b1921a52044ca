"""N-armed bandit populations (Bell, section 1).

Each trial draws the means of ``arms`` arms from N(0, 1); pulling arm j pays a reward
drawn from N(mean_j, 1). Every agent is ε-greedy over sample averages; a trial's
agents learn independently for ``share_every`` steps and then merge their tables
with equations (1)–(4) (:func:`popplay.operators.sharing.share_counts`).

Representation. Right after a share every agent of a trial holds the same table
(Q_total, n_total / P), so the population state between phases is just the shared
tables, shaped (trials, arms); during a phase each agent adds its own pulls ``k`` and
reward sums ``R`` on top. Rewards are kept on a fixed-point grid of 2**-24, so the
sums of a share are exact integers: the shared tables are the same whatever order
agents are summed in, on any backend, thread count or (later) number of processes.

All rules below are written once for :mod:`popplay.xp` namespaces.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from popplay import rng as _rng
from popplay.core.options import option
from popplay.games.schedule import share_warning

DIFFERENTIATIONS = ("none", "partition", "bias", "explorers", "top2", "top4")
REWARD_SCALE = 2.0**-24  # fixed-point grid of rewards (see module docstring)
WORDS_PER_STEP = 2  # word 0: explore test + arm choice, word 1: reward noise


@dataclass(frozen=True)
class BanditParams:
    """Train bandit populations: ε-greedy sample averages with count-weighted sharing,
    equations (1)–(4). Quality = fraction of trials whose block estimate picks the best arm."""

    arms: int = option(100, "Arms per bandit.", min=2)
    agents: int = option(256, "Agents per trial (they share with each other).", min=1)
    trials: int = option(1024, "Independent trials (each with its own bandit).", min=1)
    steps_per_agent: int = option(512, "Agent-time steps per trial, split evenly over the agents (Bell's x-axis).",
                                  min=1, name="--agent-steps", per="agents", budget=True)
    share_every: int = option(16, "Steps per agent between sharing points.", min=1)
    epsilon: float = option(0.1, "Exploration probability.", min=0.0, max=1.0)
    differentiation: str = option(
        "none", "partition: each agent explores only its own arms; bias: a random per-agent bias on greedy "
                "values; explorers: some agents explore at --explorer-epsilon; top2/top4: some agents pick "
                "at random among their best 2 or 4 arms.", choices=DIFFERENTIATIONS)
    bias_scale: float = option(0.1, "Largest bias for --differentiation bias.", min=0.0)
    explorer_fraction: float = option(0.125, "Fraction of explorer agents.", min=0.0, max=1.0)
    explorer_epsilon: float = option(0.5, "Epsilon of explorer agents.", min=0.0, max=1.0)
    topk_fraction: float = option(0.5, "Fraction of top2/top4 agents.", min=0.0, max=1.0)
    seed: int = option(0, "Seed of every random stream.")

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks = [
            (self.arms >= 2, "arms", "must be at least 2"),
            (self.agents >= 1, "agents", "must be at least 1"),
            (self.trials >= 1, "trials", "must be at least 1"),
            (self.steps_per_agent >= 1, "steps_per_agent", "must be at least 1"),
            (self.share_every >= 1, "share_every", "must be at least 1"),
            (0.0 <= self.epsilon <= 1.0, "epsilon", "must lie in [0, 1]"),
            (self.differentiation in DIFFERENTIATIONS, "differentiation",
             f"must be one of {', '.join(DIFFERENTIATIONS)}"),
            (self.bias_scale >= 0.0, "bias_scale", "must be non-negative"),
            (0.0 <= self.explorer_fraction <= 1.0, "explorer_fraction", "must lie in [0, 1]"),
            (0.0 <= self.explorer_epsilon <= 1.0, "explorer_epsilon", "must lie in [0, 1]"),
            (0.0 <= self.topk_fraction <= 1.0, "topk_fraction", "must lie in [0, 1]"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name} {message} (got {getattr(self, name)!r})")

    def schedule_warnings(self) -> list[str]:
        """What a step budget will not do that the settings ask for."""
        return share_warning(self.steps_per_agent, self.share_every)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class BanditState(NamedTuple):
    """Changing state between phases: the shared tables of every trial.

    ``top_arm``/``top_value``/``second_value`` cache each trial's greedy choice on
    ``q`` (derived data, rebuilt by :func:`greedy_cache`, never stored in run files).
    """

    q: np.ndarray  # (trials, arms) float64: Q_total, the block estimate
    n: np.ndarray  # (trials, arms) float64: n_total, total pulls (integer valued)
    step: int  # steps per agent done so far
    shares: int  # sharing points passed
    top_arm: np.ndarray  # (trials,) int64: an arm holding the maximum of q
    top_value: np.ndarray  # (trials,) float64: that maximum
    second_value: np.ndarray  # (trials,) float64: >= the maximum over the other arms


def make_rules(xp: Any) -> SimpleNamespace:
    """The bandit's per-step and per-share rules for array namespace ``xp``."""
    rng = _rng.make_rng(xp)
    uniform53 = rng.uniform53

    @xp.fn
    def explore_arm(u, group, n_groups, arms):
        """Uniform choice among the arms an agent explores (``arm % n_groups == group``)."""
        count = (arms - 1 - group) // n_groups + 1
        return group + n_groups * xp.to_int(xp.floor(u * count))

    @xp.fn
    def reward_fixed(mean, noise):
        """A reward mean + noise on the fixed-point grid, as an integer."""
        return xp.to_int(xp.floor((mean + noise) / REWARD_SCALE + 0.5))

    @xp.fn
    def estimate(base_q, base_n, pulls, reward_sum):
        """An agent's sample average of an arm after ``pulls`` pulls since the share."""
        return (base_q * base_n + xp.to_float(reward_sum) * REWARD_SCALE) / (
            base_n + xp.to_float(pulls)
        )

    @xp.fn
    def shared_estimate(q_old, n_old, n_new, reward_total):
        """Q_total of equation (2) from the previous share and the new pulls' rewards."""
        merged = (q_old * n_old + xp.to_float(reward_total) * REWARD_SCALE) / xp.where(
            n_new > 0.0, n_new, 1.0
        )
        return xp.where(n_new > 0.0, merged, q_old)

    @xp.fn
    def update_greedy(arm, value, best_arm, best, second):
        """Keep the greedy cache after ``arm``'s value became ``value``.

        The cache is (an arm holding the maximum, the maximum, an upper bound on the
        maximum over the other arms); the greedy arm is ``best_arm`` whenever
        ``best > second``. Returns the new cache and whether a full rescan is needed
        (the leader fell below the bound).
        """
        leader = arm == best_arm
        overtakes = (value > best) & (arm != best_arm)
        new_best_arm = xp.where(overtakes, arm, best_arm)
        new_second = xp.where(leader, second, xp.where(overtakes, best, xp.where(value > second, value, second)))
        new_best = xp.where(leader | overtakes, value, best)
        return new_best_arm, new_best, new_second, leader & (value < second)

    @xp.fn
    def arm_bias(word, scale):
        """An agent's fixed bias on an arm's greedy value (differentiation 'bias')."""
        return scale * (2.0 * uniform53(word) - 1.0)

    return SimpleNamespace(
        explore_arm=explore_arm, reward_fixed=reward_fixed, estimate=estimate,
        shared_estimate=shared_estimate, update_greedy=update_greedy, arm_bias=arm_bias, rng=rng,
    )


# ---------------------------------------------------------------------------
# Per-trial environment and per-agent attributes (NumPy, computed once per run)


def environment_keys(seed: int, trials: np.ndarray) -> np.ndarray:
    """Key of each trial's environment stream."""
    return _rng.stream_keys(seed, _rng.TAG_ENVIRONMENT, trials)


def agent_keys(seed: int, trials: np.ndarray, agents: np.ndarray) -> np.ndarray:
    """Key of each (trial, agent) learning stream, shaped (len(trials), len(agents))."""
    return _rng.stream_keys(seed, _rng.TAG_AGENT, trials, agents)


def agent_static_keys(seed: int, trials: np.ndarray, agents: np.ndarray) -> np.ndarray:
    """Key of each (trial, agent) stream of fixed attributes (e.g. its arm biases)."""
    return _rng.stream_keys(seed, _rng.TAG_AGENT_STATIC, trials, agents)


def arm_means(seed: int, trials: int, arms: int) -> np.ndarray:
    """The true arm means of every trial, N(0, 1), shaped (trials, arms)."""
    r = _rng._numpy_rng()
    keys = environment_keys(seed, np.arange(trials))[:, None]
    counters = np.arange(arms, dtype=np.int64)[None, :]
    return r.normal(keys, counters, r.draw(keys, r.mix_counter(counters)))


def differentiated(agents: int, fraction: float) -> np.ndarray:
    """Which agents carry a differentiation: ``fraction`` of them, spread evenly."""
    index = np.arange(agents)
    return np.floor((index + 1) * fraction) > np.floor(index * fraction)


def agent_epsilons(params: BanditParams) -> np.ndarray:
    eps = np.full(params.agents, params.epsilon, dtype=np.float64)
    if params.differentiation == "explorers":
        eps[differentiated(params.agents, params.explorer_fraction)] = params.explorer_epsilon
    return eps


def agent_topk(params: BanditParams) -> np.ndarray:
    k = {"top2": 2, "top4": 4}.get(params.differentiation, 1)
    topk = np.ones(params.agents, dtype=np.int64)
    if k > 1:
        topk[differentiated(params.agents, params.topk_fraction)] = min(k, params.arms)
    return topk


def explore_groups(params: BanditParams) -> tuple[np.ndarray, int]:
    """Each agent's exploration group and the number of groups (1 unless 'partition')."""
    if params.differentiation != "partition":
        return np.zeros(params.agents, dtype=np.int64), 1
    n_groups = min(params.agents, params.arms)
    return np.arange(params.agents, dtype=np.int64) % n_groups, n_groups


def block_correctness(q: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Per trial: 1/c when the true best arm is among the c maxima of Q_total, else 0.

    That is the probability that the block estimate picks the best arm when its
    ties are broken at random.
    """
    best = np.argmax(means, axis=-1)
    top = q.max(axis=-1, keepdims=True)
    ties = (q == top).sum(axis=-1)
    hit = np.take_along_axis(q, best[:, None], axis=-1)[:, 0] == top[:, 0]
    return np.where(hit, 1.0 / ties, 0.0)


def greedy_cache(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(top arm, top value, runner-up value) of every row of ``q``; ties give equal values."""
    top_arm = np.argmax(q, axis=1)
    top_value = q[np.arange(len(q)), top_arm]
    others = q.copy()
    others[np.arange(len(q)), top_arm] = -np.inf
    return top_arm.astype(np.int64), top_value, others.max(axis=1)


def state_from_tables(q: np.ndarray, n: np.ndarray, step: int, shares: int) -> BanditState:
    q = np.ascontiguousarray(q, dtype=np.float64)
    n = np.ascontiguousarray(n, dtype=np.float64)
    return BanditState(q, n, step, shares, *greedy_cache(q))


def initial_state(params: BanditParams) -> BanditState:
    shape = (params.trials, params.arms)
    return state_from_tables(np.zeros(shape), np.zeros(shape), 0, 0)

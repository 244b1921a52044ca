"""Slow plain-Python reference of the bandit population (for tests only).

Written from the rules as stated, with Python lists and floats: ε-greedy over sample
averages with random tie-breaking, rewards on the 2**-24 grid, equations (1)–(4)
after each phase. It shares only the random streams (tested on their own) with the
package.
"""
from __future__ import annotations

import math

from popplay.games.bandit.rules import BanditParams
from popplay.rng import make_rng
from popplay.xp import py

RNG = make_rng(py)
SCALE = 2.0**-24


def run(params: BanditParams, means, keys, static_keys, epsilons, topk, groups, n_groups):
    """Return the shared tables (q, n) after every phase, as lists per trial."""
    history = []
    q = [[0.0] * params.arms for _ in range(params.trials)]
    n = [[0.0] * params.arms for _ in range(params.trials)]
    step = 0
    while step < params.steps_per_agent:
        length = min(params.share_every, params.steps_per_agent - step)
        for t in range(params.trials):
            q[t], n[t] = _trial_phase(params, t, q[t], n[t], means[t], keys[t], static_keys[t],
                                      epsilons, topk, groups, n_groups, step, length)
        step += length
        history.append(([row[:] for row in q], [row[:] for row in n]))
    return history


def _trial_phase(params, t, q, n, means, keys, static_keys, epsilons, topk, groups, n_groups, step, length):
    agents, arms = params.agents, params.arms
    pull_total = [0] * arms
    reward_total = [0] * arms
    for p in range(agents):
        key = int(keys[p])
        base_n = [n[a] / agents for a in range(arms)]
        values = list(q)
        pulls = [0] * arms
        rewards = [0] * arms
        if params.differentiation == "bias":
            bias = [params.bias_scale * (2.0 * RNG.uniform53(RNG.draw(int(static_keys[p]), RNG.mix_counter(a))) - 1.0)
                    for a in range(arms)]
        else:
            bias = [0.0] * arms
        for s in range(step, step + length):
            w0 = RNG.draw(key, RNG.mix_counter(2 * s))
            w1 = RNG.draw(key, RNG.mix_counter(2 * s + 1))
            u_explore = (w0 >> 32 & 0xFFFFFFFF) / 2.0**32
            u_choice = (w0 & 0xFFFFFFFF) / 2.0**32
            biased = [values[a] + bias[a] for a in range(arms)]
            if u_explore < epsilons[p]:
                mine = [a for a in range(arms) if a % n_groups == groups[p]]
                arm = mine[math.floor(u_choice * len(mine))]
            elif topk[p] > 1:
                ranked = sorted(range(arms), key=lambda a: (-biased[a], a))
                arm = ranked[math.floor(u_choice * topk[p])]
            else:
                best = max(biased)
                tied = [a for a in range(arms) if biased[a] == best]
                arm = tied[math.floor(u_choice * len(tied))]
            noise = RNG.normal(key, 2 * s + 1, w1)
            reward = math.floor((means[arm] + noise) / SCALE + 0.5)
            pulls[arm] += 1
            rewards[arm] += reward
            values[arm] = (q[arm] * base_n[arm] + rewards[arm] * SCALE) / (base_n[arm] + pulls[arm])
        for a in range(arms):
            pull_total[a] += pulls[a]
            reward_total[a] += rewards[a]
    new_q, new_n = [], []
    for a in range(arms):
        total = n[a] + pull_total[a]
        new_q.append((q[a] * n[a] + reward_total[a] * SCALE) / total if total > 0 else q[a])
        new_n.append(total)
    return new_q, new_n

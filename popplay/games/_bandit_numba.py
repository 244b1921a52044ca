"""Numba kernels of the bandit population (private; see :mod:`popplay.games.bandit`).

A learning phase runs every (trial, agent) pair for a block of steps in fused
parallel loops. Each thread keeps one scratch copy of the current trial's shared
table and restores only the arms an agent touched, so a phase costs O(steps), not
O(arms), per agent. The greedy arm is kept incrementally (best arm, its value and an
upper bound on the runner-up), so an argmax over all arms is needed only when the
leader falls below the runner-up or values tie. The share then sums the agents'
integer pull counts and fixed-point reward sums per trial.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from popplay.games.bandit import make_rules
from popplay.xp import nb

_rules = make_rules(nb)
_draw = _rules.rng.draw
_mix_counter = _rules.rng.mix_counter
_uniform_hi32 = _rules.rng.uniform_hi32
_uniform_lo32 = _rules.rng.uniform_lo32
_normal = _rules.rng.normal
_explore_arm = _rules.explore_arm
_reward_fixed = _rules.reward_fixed
_estimate = _rules.estimate
_shared_estimate = _rules.shared_estimate
_arm_bias = _rules.arm_bias


@numba.njit(cache=True)
def _mixed_counters(first_step, n_steps, words_per_step):
    out = np.empty(n_steps * words_per_step, dtype=np.int64)
    base = first_step * words_per_step
    for i in range(out.size):
        out[i] = _mix_counter(base + i)
    return out


@numba.njit(cache=True)
def _top2(values, bias, arms):
    """(best arm, best value, runner-up value) of values + bias; ties give equal values."""
    best_arm = 0
    best = values[0] + bias[0]
    second = -np.inf
    for a in range(1, arms):
        v = values[a] + bias[a]
        if v > best:
            second = best
            best = v
            best_arm = a
        elif v > second:
            second = v
    return best_arm, best, second


@numba.njit(cache=True)
def _random_argmax(values, bias, arms, u):
    """The floor(u * c)-th of the c arms holding the maximum of values + bias."""
    best = values[0] + bias[0]
    ties = 1
    for a in range(1, arms):
        v = values[a] + bias[a]
        if v > best:
            best = v
            ties = 1
        elif v == best:
            ties += 1
    pick = np.int64(np.floor(u * ties))
    for a in range(arms):
        if values[a] + bias[a] == best:
            if pick == 0:
                return a
            pick -= 1
    return arms - 1  # unreachable


@numba.njit(cache=True)
def _topk_arm(values, bias, arms, k, u):
    """The floor(u * k)-th best arm, ranking by value then lower index."""
    top_arm = np.empty(4, dtype=np.int64)
    top_val = np.empty(4, dtype=np.float64)
    filled = 0
    for a in range(arms):
        v = values[a] + bias[a]
        if filled < k or v > top_val[filled - 1]:
            pos = filled if filled < k else k - 1
            while pos > 0 and v > top_val[pos - 1]:
                if pos < k:
                    top_val[pos] = top_val[pos - 1]
                    top_arm[pos] = top_arm[pos - 1]
                pos -= 1
            top_val[pos] = v
            top_arm[pos] = a
            if filled < k:
                filled += 1
    return top_arm[np.int64(np.floor(u * k))]


@numba.njit(cache=True, parallel=True)
def _learn_phase(
    q_shared, base_n, top_arm, top_val, second_val, means, keys, static_keys,
    epsilons, topk, groups, n_groups, bias_scale, use_bias, first_counter, mixed_counters, n_steps,
    n_chunks,
    out_arm, out_pulls, out_rewards, out_used,
):
    """One learning phase of every agent; writes each agent's touched arms."""
    trials, arms = q_shared.shape
    agents = keys.shape[1]
    total = trials * agents
    capacity = out_arm.shape[2]
    for chunk in prange(n_chunks):
        lo = chunk * total // n_chunks
        hi = (chunk + 1) * total // n_chunks
        q = np.empty(arms)
        pulls = np.zeros(arms, dtype=np.int64)
        rewards = np.zeros(arms, dtype=np.int64)
        bias = np.zeros(arms)
        touched = np.empty(capacity, dtype=np.int64)
        current_trial = -1
        for index in range(lo, hi):
            t = index // agents
            p = index - t * agents
            if t != current_trial:
                q[:] = q_shared[t]
                current_trial = t
            key = keys[t, p]
            eps = epsilons[p]
            k_top = topk[p]
            group = groups[p]
            if use_bias:
                for a in range(arms):
                    bias[a] = _arm_bias(_draw(static_keys[t, p], _mix_counter(a)), bias_scale)
                best_arm, best, second = _top2(q, bias, arms)
            else:
                best_arm = top_arm[t]
                best = top_val[t]
                second = second_val[t]
            used = 0
            for s in range(n_steps):
                w0 = _draw(key, mixed_counters[2 * s])
                w1 = _draw(key, mixed_counters[2 * s + 1])
                u_choice = _uniform_lo32(w0)
                if _uniform_hi32(w0) < eps:
                    arm = _explore_arm(u_choice, group, n_groups, arms)
                elif k_top > 1:
                    arm = _topk_arm(q, bias, arms, k_top, u_choice)
                elif best > second:
                    arm = best_arm
                else:
                    arm = _random_argmax(q, bias, arms, u_choice)
                reward = _reward_fixed(means[t, arm], _normal(key, first_counter + 2 * s + 1, w1))
                if pulls[arm] == 0:
                    touched[used] = arm
                    used += 1
                pulls[arm] += 1
                rewards[arm] += reward
                q[arm] = _estimate(q_shared[t, arm], base_n[t, arm], pulls[arm], rewards[arm])
                v = q[arm] + bias[arm]
                if arm == best_arm:
                    best = v
                    if v < second:
                        best_arm, best, second = _top2(q, bias, arms)
                elif v > best:
                    second = best
                    best = v
                    best_arm = arm
                elif v > second:
                    second = v
            for i in range(used):
                a = touched[i]
                out_arm[t, p, i] = a
                out_pulls[t, p, i] = pulls[a]
                out_rewards[t, p, i] = rewards[a]
                q[a] = q_shared[t, a]
                pulls[a] = 0
                rewards[a] = 0
            out_used[t, p] = used


@numba.njit(cache=True, parallel=True)
def _top2_rows(q, top_arm, top_val, second_val):
    """The greedy cache of every trial's shared table (agents start phases from it)."""
    trials, arms = q.shape
    no_bias = np.zeros(arms)
    for t in prange(trials):
        top_arm[t], top_val[t], second_val[t] = _top2(q[t], no_bias, arms)


@numba.njit(cache=True, parallel=True)
def _share(q_shared, n_shared, out_arm, out_pulls, out_rewards, out_used):
    """Equations (1)-(4) from the agents' touched arms, in place, per trial."""
    trials, arms = q_shared.shape
    agents = out_used.shape[1]
    for t in prange(trials):
        pull_total = np.zeros(arms, dtype=np.int64)
        reward_total = np.zeros(arms, dtype=np.int64)
        for p in range(agents):
            for i in range(out_used[t, p]):
                a = out_arm[t, p, i]
                pull_total[a] += out_pulls[t, p, i]
                reward_total[a] += out_rewards[t, p, i]
        for a in range(arms):
            n_new = n_shared[t, a] + pull_total[a]
            q_shared[t, a] = _shared_estimate(q_shared[t, a], n_shared[t, a], n_new, reward_total[a])
            n_shared[t, a] = n_new

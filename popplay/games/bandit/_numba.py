"""Numba kernels of the bandit population (private; see :mod:`popplay.games.bandit.rules`).

A learning phase runs every (trial, agent) pair for a block of steps in fused
parallel loops. Each thread keeps one scratch copy of the current trial's shared
table and restores only the arms an agent touched, so a phase costs O(steps), not
O(arms), per agent. The greedy arm is kept incrementally (best arm, its value and an
upper bound on the runner-up), so a new argmax is needed only when the leader falls
below the runner-up or values tie. Where phases are long enough to pay for it, each
trial's arms are ranked by shared value before the phase, and an agent finds its new
greedy arm from that ranking in O(arms it pulled) instead of scanning every arm: on
tables still full of ties that is most steps. The share then sums the agents'
integer pull counts and fixed-point reward sums per trial.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from popplay.games.bandit.rules import make_rules
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
_update_greedy = _rules.update_greedy


@numba.njit(cache=True)
def _mixed_counters(first_step, n_steps, words_per_step):
    out = np.empty(n_steps * words_per_step, dtype=np.int64)
    base = first_step * words_per_step
    for i in range(out.size):
        out[i] = _mix_counter(base + i)
    return out


@numba.njit(cache=True)
def _value(a, shared_row, own, pulls, bias):
    """An agent's greedy value of arm a: its own estimate once it pulled a, else the share."""
    return (own[a] if pulls[a] > 0 else shared_row[a]) + bias[a]


@numba.njit(cache=True)
def _top2(shared_row, own, pulls, bias, arms):
    """(best arm, best value, runner-up value); ties give equal values."""
    best_arm = 0
    best = _value(0, shared_row, own, pulls, bias)
    second = -np.inf
    for a in range(1, arms):
        v = _value(a, shared_row, own, pulls, bias)
        if v > best:
            second = best
            best = v
            best_arm = a
        elif v > second:
            second = v
    return best_arm, best, second


@numba.njit(cache=True)
def _random_argmax(shared_row, own, pulls, bias, arms, u, tied):
    """The floor(u * c)-th (in index order) of the c arms holding the maximum value.

    One pass: the arms tied at the running maximum are collected in ``tied`` (a
    scratch buffer of ``arms`` entries), since a second pass over every arm costs as
    much as the first and ties are common while tables are still empty."""
    best = _value(0, shared_row, own, pulls, bias)
    tied[0] = 0
    ties = 1
    for a in range(1, arms):
        v = _value(a, shared_row, own, pulls, bias)
        if v > best:
            best = v
            tied[0] = a
            ties = 1
        elif v == best:
            tied[ties] = a
            ties += 1
    return tied[np.int64(np.floor(u * ties))]


@numba.njit(cache=True, parallel=True)
def _rank_arms(q_shared, order, rank, tie_top, n_chunks):
    """Per trial: the arms by descending shared value (equal values by index), each
    arm's position in that order, and how many arms hold the top value."""
    trials, arms = q_shared.shape
    for chunk in prange(n_chunks):
        for t in range(chunk * trials // n_chunks, (chunk + 1) * trials // n_chunks):
            row = q_shared[t]
            sorted_arms = np.argsort(-row, kind="mergesort")
            top = row[sorted_arms[0]]
            tied = 0
            for i in range(arms):
                a = sorted_arms[i]
                order[t, i] = a
                rank[t, a] = i
                if row[a] == top:
                    tied += 1
            tie_top[t] = tied


@numba.njit(cache=True)
def _two_untouched(order_row, pulls, arms):
    """The first two arms of the trial's order that the agent has not pulled (-1: none)."""
    first = -1
    for i in range(arms):
        a = order_row[i]
        if pulls[a] == 0:
            if first >= 0:
                return first, a
            first = a
    return first, -1


@numba.njit(cache=True)
def _top2_ranked(order_row, shared_row, own, pulls, touched, used, arms):
    """:func:`_top2` of an agent without bias, in O(arms it pulled): its values are the
    shared ones except on those arms, and the trial's order gives the best two others."""
    u1, u2 = _two_untouched(order_row, pulls, arms)
    best_arm = arms
    best = -np.inf
    if u1 >= 0:
        best_arm = u1
        best = shared_row[u1]
    for i in range(used):
        a = touched[i]
        v = own[a]
        if v > best or (v == best and a < best_arm):
            best = v
            best_arm = a
    second = -np.inf
    if u1 >= 0 and u1 != best_arm:
        second = shared_row[u1]
    elif u2 >= 0:
        second = shared_row[u2]
    for i in range(used):
        a = touched[i]
        if a != best_arm and own[a] > second:
            second = own[a]
    return best_arm, best, second


@numba.njit(cache=True)
def _random_argmax_ranked(order_row, rank_row, tie_top, shared_row, own, pulls, touched, used, arms, u,
                          skipped):
    """:func:`_random_argmax` of an agent without bias in O(arms it pulled), or -1
    where that shortcut does not apply (the caller then scans every arm).

    Applies when the maximum is held only by arms the agent has not pulled and is the
    shared top value: the tied arms are then the first ``tie_top`` of the trial's
    order (in index order) less the pulled ones, and the k-th of them is found by
    stepping over the pulled arms' positions."""
    u1, _ = _two_untouched(order_row, pulls, arms)
    if u1 < 0 or shared_row[u1] != shared_row[order_row[0]]:
        return -1
    top = shared_row[u1]
    n_skipped = 0
    for i in range(used):
        a = touched[i]
        if own[a] >= top:
            return -1
        r = rank_row[a]
        if r < tie_top:
            if n_skipped == skipped.size:
                return -1
            j = n_skipped  # insertion sort: few arms are pulled between shares
            while j > 0 and skipped[j - 1] > r:
                skipped[j] = skipped[j - 1]
                j -= 1
            skipped[j] = r
            n_skipped += 1
    position = np.int64(np.floor(u * (tie_top - n_skipped)))
    for j in range(n_skipped):
        if skipped[j] <= position:
            position += 1
        else:
            break
    return order_row[position]


@numba.njit(cache=True, inline="always")
def _topk_insert(top_arm, top_val, filled, k, a, v):
    """Insert arm ``a`` of value ``v`` into the sorted best-``filled`` list (value, then
    lower index) if it belongs among the best ``k``; returns the new fill."""
    if filled == k and not (v > top_val[k - 1] or (v == top_val[k - 1] and a < top_arm[k - 1])):
        return filled
    pos = filled if filled < k else k - 1
    while pos > 0 and (v > top_val[pos - 1] or (v == top_val[pos - 1] and a < top_arm[pos - 1])):
        top_val[pos] = top_val[pos - 1]
        top_arm[pos] = top_arm[pos - 1]
        pos -= 1
    top_val[pos] = v
    top_arm[pos] = a
    return filled + 1 if filled < k else filled


@numba.njit(cache=True)
def _topk_arm(shared_row, own, pulls, bias, arms, k, u):
    """The floor(u * k)-th best arm, ranking by value then lower index."""
    top_arm = np.empty(4, dtype=np.int64)
    top_val = np.empty(4, dtype=np.float64)
    filled = 0
    for a in range(arms):
        # arms come in index order, so the index tie-break of _topk_insert never fires
        filled = _topk_insert(top_arm, top_val, filled, k, a, _value(a, shared_row, own, pulls, bias))
    return top_arm[np.int64(np.floor(u * k))]


@numba.njit(cache=True)
def _topk_ranked(order_row, shared_row, own, pulls, touched, used, arms, k, u, top_arm, top_val):
    """:func:`_topk_arm` of an agent without bias in O(k + arms it pulled): the best k
    arms it has not pulled are the first k of them in the trial's order (value, then
    index, as ``_topk_arm`` ranks), and only its pulled arms can displace them.
    ``top_arm``/``top_val`` are scratch buffers of at least k entries."""
    filled = 0
    i = 0
    while filled < k and i < arms:
        a = order_row[i]
        if pulls[a] == 0:
            top_arm[filled] = a
            top_val[filled] = shared_row[a]
            filled += 1
        i += 1
    for j in range(used):
        a = touched[j]
        filled = _topk_insert(top_arm, top_val, filled, k, a, own[a])
    return top_arm[np.int64(np.floor(u * k))]


@numba.njit(cache=True, inline="always")
def _bias_of(a, bias, known, agent, static_key, scale):
    """Arm a's bias of this agent, drawn the first time the agent needs it (``known``
    stamps the arms drawn for ``agent``, so nothing is cleared between agents)."""
    if known[a] != agent:
        bias[a] = _arm_bias(_draw(static_key, _mix_counter(a)), scale)
        known[a] = agent
    return bias[a]


@numba.njit(cache=True, inline="always")
def _best_two(best_arm, best, second, a, v):
    """The best arm (value, then lower index), its value and the runner-up's value
    after seeing arm ``a`` of value ``v``."""
    if v > best or (v == best and a < best_arm):
        return a, v, max(second, best)
    if v > second:
        return best_arm, best, v
    return best_arm, best, second


@numba.njit(cache=True)
def _top2_biased(order_row, shared_row, own, pulls, touched, used, arms, bias, known, agent, static_key, scale):
    """:func:`_top2` of an agent with a bias in [-scale, scale] on every arm, walking
    the trial's order only while an arm could still reach the runner-up: an arm of
    shared value s is worth at most s + scale (float addition is monotone), and the
    rest of the order is worth no more. The same best arm (lowest index among the
    maximum), maximum and runner-up as the full scan; the biases of the arms never
    reached are never drawn."""
    best_arm = arms
    best = -np.inf
    second = -np.inf
    for i in range(used):
        a = touched[i]
        v = own[a] + _bias_of(a, bias, known, agent, static_key, scale)
        best_arm, best, second = _best_two(best_arm, best, second, a, v)
    for i in range(arms):
        a = order_row[i]
        if pulls[a] > 0:
            continue
        value = shared_row[a]
        if value + scale < second:
            break
        v = value + _bias_of(a, bias, known, agent, static_key, scale)
        best_arm, best, second = _best_two(best_arm, best, second, a, v)
    return best_arm, best, second


@numba.njit(cache=True, parallel=True)
def _learn_phase(
    q_shared, n_shared, top_arm, top_val, second_val, means, keys, static_keys,
    epsilons, topk, groups, n_groups, bias_scale, use_bias, first_counter, mixed_counters, n_steps,
    n_chunks, out_arm, out_pulls, out_rewards, out_used, ranked, order, rank, tie_top, total_agents,
):
    """One learning phase of every agent; writes each agent's touched arms.

    Agents read the shared table directly and keep their own estimates only for the
    arms they pull, so a phase costs O(steps) per agent whatever the number of arms.
    ``keys`` may hold only this rank's agents; ``total_agents`` is the whole trial's.
    """
    trials, arms = q_shared.shape
    agents = keys.shape[1]
    total = trials * agents
    for chunk in prange(n_chunks):
        lo = chunk * total // n_chunks
        hi = (chunk + 1) * total // n_chunks
        own = np.zeros(arms)
        pulls = np.zeros(arms, dtype=np.int64)
        rewards = np.zeros(arms, dtype=np.int64)
        bias = np.zeros(arms)
        known = np.full(arms, -1, dtype=np.int64)
        touched = np.empty(out_arm.shape[2], dtype=np.int64)
        tied = np.empty(arms, dtype=np.int64)
        skipped = np.empty(32, dtype=np.int64)
        top_arms = np.empty(4, dtype=np.int64)
        top_vals = np.empty(4)
        for index in range(lo, hi):
            t = index // agents
            p = index - t * agents
            shared_row = q_shared[t]
            key = keys[t, p]
            eps = epsilons[p]
            k_top = topk[p]
            group = groups[p]
            static_key = static_keys[t, p]
            if use_bias and ranked:
                # Drawing and scanning every arm's bias per agent and phase made 'bias'
                # ~3.5x slower than none; the walk reads few arms once values spread.
                best_arm, best, second = _top2_biased(order[t], shared_row, own, pulls, touched, 0, arms, bias,
                                                      known, index, static_key, bias_scale)
            elif use_bias:
                for a in range(arms):
                    _bias_of(a, bias, known, index, static_key, bias_scale)
                best_arm, best, second = _top2(shared_row, own, pulls, bias, arms)
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
                    # Scanning every arm on each greedy step made top-k agents ~8x slower.
                    if ranked:
                        arm = _topk_ranked(order[t], shared_row, own, pulls, touched, used, arms, k_top, u_choice,
                                           top_arms, top_vals)
                    else:
                        arm = _topk_arm(shared_row, own, pulls, bias, arms, k_top, u_choice)
                elif best > second:
                    arm = best_arm
                else:
                    arm = -1
                    if use_bias:  # the full scan reads every arm's bias
                        for a in range(arms):
                            _bias_of(a, bias, known, index, static_key, bias_scale)
                    elif ranked:
                        arm = _random_argmax_ranked(order[t], rank[t], tie_top[t], shared_row, own, pulls,
                                                    touched, used, arms, u_choice, skipped)
                    if arm < 0:
                        arm = _random_argmax(shared_row, own, pulls, bias, arms, u_choice, tied)
                reward = _reward_fixed(means[t, arm], _normal(key, first_counter + 2 * s + 1, w1))
                if pulls[arm] == 0:
                    touched[used] = arm
                    used += 1
                pulls[arm] += 1
                rewards[arm] += reward
                own[arm] = _estimate(shared_row[arm], n_shared[t, arm] / total_agents, pulls[arm], rewards[arm])
                if use_bias:
                    _bias_of(arm, bias, known, index, static_key, bias_scale)
                best_arm, best, second, rescan = _update_greedy(arm, own[arm] + bias[arm], best_arm, best, second)
                if rescan:
                    if ranked and use_bias:
                        best_arm, best, second = _top2_biased(order[t], shared_row, own, pulls, touched, used, arms,
                                                              bias, known, index, static_key, bias_scale)
                    elif ranked:
                        best_arm, best, second = _top2_ranked(order[t], shared_row, own, pulls, touched, used, arms)
                    else:
                        best_arm, best, second = _top2(shared_row, own, pulls, bias, arms)
            for i in range(used):
                a = touched[i]
                out_arm[t, p, i] = a
                out_pulls[t, p, i] = pulls[a]
                out_rewards[t, p, i] = rewards[a]
                pulls[a] = 0
                rewards[a] = 0
            out_used[t, p] = used


@numba.njit(cache=True, parallel=True)
def _share(q_shared, n_shared, top_arm, top_val, second_val, n_chunks,
           out_arm, out_pulls, out_rewards, out_used):
    """Equations (1)-(4) in place, from the agents' touched arms only, per trial; keeps
    each trial's greedy cache up to date."""
    trials, arms = q_shared.shape
    agents = out_used.shape[1]
    for chunk in prange(n_chunks):
        pull_total = np.zeros(arms, dtype=np.int64)
        reward_total = np.zeros(arms, dtype=np.int64)
        changed = np.empty(arms, dtype=np.int64)
        no_pulls = np.zeros(arms, dtype=np.int64)
        no_bias = np.zeros(arms)
        for t in range(chunk * trials // n_chunks, (chunk + 1) * trials // n_chunks):
            n_changed = 0
            for p in range(agents):
                for i in range(out_used[t, p]):
                    a = out_arm[t, p, i]
                    if pull_total[a] == 0:
                        changed[n_changed] = a
                        n_changed += 1
                    pull_total[a] += out_pulls[t, p, i]
                    reward_total[a] += out_rewards[t, p, i]
            best_arm = top_arm[t]
            best = top_val[t]
            second = second_val[t]
            rescan = False
            for i in range(n_changed):
                a = changed[i]
                n_new = n_shared[t, a] + pull_total[a]
                v = _shared_estimate(q_shared[t, a], n_shared[t, a], n_new, reward_total[a])
                q_shared[t, a] = v
                n_shared[t, a] = n_new
                pull_total[a] = 0
                reward_total[a] = 0
                best_arm, best, second, lost_lead = _update_greedy(a, v, best_arm, best, second)
                rescan = rescan or lost_lead
            if rescan:
                best_arm, best, second = _top2(q_shared[t], no_bias, no_pulls, no_bias, arms)
            top_arm[t] = best_arm
            top_val[t] = best
            second_val[t] = second

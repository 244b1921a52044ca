"""Numba kernels of the cart-pole population (private; see :mod:`popplay.games.cartpole.rules`).

A learning phase runs every (trial, agent) pair for a block of steps in one fused
parallel loop; an agent's 72 Q values, traces and weights live in thread-local
scratch while it runs. With clock-scaled traces and deferred updates
(:mod:`popplay.games.cartpole.rules`, "Traces") a step touches O(1) state-actions; the
live traces are listed only to find the ones that die (exactly 0 below the cutoff:
a rule, so the torch engine and the reference do the same).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from popplay.games.cartpole.rules import RENORMALIZE_BELOW, WORDS_PER_STEP, make_rules
from popplay.xp import nb

_rules = make_rules(nb)
_draw = _rules.rng.draw
_mix_counter = _rules.rng.mix_counter
_dynamics = _rules.dynamics
_box = _rules.box
_choose = _rules.choose
_greedy = _rules.greedy
_coin = _rules.coin
_start_state = _rules.start_state
_target = _rules.target
_td_error = _rules.td_error
_bump = _rules.bump
_effective = _rules.effective
_advance = _rules.advance
_flush = _rules.flush
# The dynamics are too long for LLVM to inline on its own; inlined, a group's steps
# vectorise (AVX) and the kernel runs about 2.5x faster. Same function, same bits.
_dynamics_inline = numba.njit(cache=True, inline="always")(_rules.dynamics.py_func)
_GROUP = 8  # agents a thread advances in lock step (their tables stay in L1)


@numba.njit(cache=True)
def _mixed_counters(first_step, n_steps, words_per_step):
    """mix_counter of every word of steps first_step .. first_step + n_steps - 1."""
    out = np.empty(n_steps * words_per_step, dtype=np.int64)
    base = first_step * words_per_step
    for i in range(out.size):
        out[i] = _mix_counter(base + i)
    return out


@numba.njit(cache=True, inline="always")
def _fold(q, w, e_hat, c_start, d_start, b, j, alpha, clock_sum, d_sum):
    """End a stretch of constant ê for state-action j of group member b."""
    q[b, j] = _effective(q[b, j], e_hat[b, j], d_sum, d_start[b, j])
    w[b, j] = _flush(w[b, j], alpha, e_hat[b, j], clock_sum, c_start[b, j])


@numba.njit(cache=True, parallel=True)
def _learn_phase(
    q_in, e_in, w_in, cart_in, action_in, keys, mixed, phys, bounds,
    alpha_in, gamma, gamma_lambda_in, epsilon_in, failure_reward, cutoff, start_range, accumulate, watkins,
    n_steps, n_chunks,
    q_out, e_out, w_out, cart_out, action_out, failures_out,
):
    """``n_steps`` TD(λ) steps of every agent, from the ``*_in`` arrays into ``*_out``.

    ``alpha_in``, ``gamma_lambda_in`` (γ·λ, multiplied by the caller as the other
    engines do) and ``epsilon_in`` are per agent, shaped (trials, agents).

    ``mixed`` holds the mixed counters of the words of steps ``first_step + 1`` to
    ``first_step + n_steps`` (the words that choose the next action or restart).
    A thread advances a group of ``_GROUP`` agents in lock step: their dynamics form
    one vectorisable loop and their learning updates interleave, instead of one
    agent's long chain of dependent floating-point operations. Q and w updates are
    deferred per stretch of constant scaled trace (module docstring of
    :mod:`popplay.games.cartpole.rules`), so a step costs O(1); the live traces are listed
    only to find those that die, and ``smallest`` (a lower bound of their ê) says
    when to look.
    """
    trials, agents, items = q_in.shape
    total = trials * agents
    for chunk in prange(n_chunks):
        lo = chunk * total // n_chunks
        hi = (chunk + 1) * total // n_chunks
        q = np.empty((_GROUP, items))
        w = np.empty((_GROUP, items))
        e_hat = np.empty((_GROUP, items))
        c_start = np.zeros((_GROUP, items))
        d_start = np.zeros((_GROUP, items))
        live = np.empty((_GROUP, items), dtype=np.uint16)  # unsigned: no negative-index fix-ups
        n_live = np.empty(_GROUP, dtype=np.int64)
        smallest = np.empty(_GROUP)
        clock = np.empty(_GROUP)
        clock_sum = np.empty(_GROUP)
        d_sum = np.empty(_GROUP)
        x = np.empty(_GROUP)
        x_dot = np.empty(_GROUP)
        theta = np.empty(_GROUP)
        theta_dot = np.empty(_GROUP)
        failed = np.empty(_GROUP, dtype=np.bool_)
        a = np.empty(_GROUP, dtype=np.int64)
        s = np.empty(_GROUP, dtype=np.int64)
        key = np.empty(_GROUP, dtype=np.int64)
        failures = np.empty(_GROUP, dtype=np.int64)
        alphas = np.empty(_GROUP)
        decays = np.empty(_GROUP)
        epsilons = np.empty(_GROUP)
        for first in range(lo, hi, _GROUP):
            size = min(_GROUP, hi - first)
            for b in range(size):
                t = (first + b) // agents
                p = first + b - t * agents
                n = 0
                low = np.inf
                for j in range(items):
                    q[b, j] = q_in[t, p, j]
                    w[b, j] = w_in[t, p, j]
                    e_hat[b, j] = e_in[t, p, j]
                    if e_hat[b, j] != 0.0:  # only live stretches read their starts
                        c_start[b, j] = 0.0
                        d_start[b, j] = 0.0
                        live[b, n] = j
                        n += 1
                        low = min(low, e_hat[b, j])
                n_live[b] = n
                smallest[b] = low
                clock[b] = 1.0
                clock_sum[b] = 0.0
                d_sum[b] = 0.0
                x[b] = cart_in[t, p, 0]
                x_dot[b] = cart_in[t, p, 1]
                theta[b] = cart_in[t, p, 2]
                theta_dot[b] = cart_in[t, p, 3]
                a[b] = action_in[t, p]
                key[b] = keys[t, p]
                alphas[b] = alpha_in[t, p]
                decays[b] = gamma_lambda_in[t, p]
                epsilons[b] = epsilon_in[t, p]
                s[b] = _box(x[b], x_dot[b], theta[b], theta_dot[b], bounds)
                failures[b] = 0
            for k in range(n_steps):
                # In place, so that the next loop's scalar reads and this loop's vector
                # reads never wait on stores of the other width.
                for b in range(size):
                    x[b], x_dot[b], theta[b], theta_dot[b], failed[b] = _dynamics_inline(
                        x[b], x_dot[b], theta[b], theta_dot[b], a[b], phys)
                for b in range(size):
                    alpha = alphas[b]
                    epsilon = epsilons[b]
                    c = clock[b]
                    total_c = clock_sum[b]
                    total_d = d_sum[b]
                    sa = 2 * s[b] + a[b]
                    q_sa = _effective(q[b, sa], e_hat[b, sa], total_d, d_start[b, sa])
                    word = _draw(key[b], mixed[WORDS_PER_STEP * k])
                    s2 = 0
                    a2 = 0
                    keep_traces = not failed[b]
                    if failed[b]:
                        delta = _td_error(True, failure_reward, gamma, 0.0, q_sa)
                    else:
                        s2 = _box(x[b], x_dot[b], theta[b], theta_dot[b], bounds)
                        q_left = _effective(q[b, 2 * s2], e_hat[b, 2 * s2], total_d, d_start[b, 2 * s2])
                        q_right = _effective(q[b, 2 * s2 + 1], e_hat[b, 2 * s2 + 1], total_d,
                                             d_start[b, 2 * s2 + 1])
                        a2 = _choose(word, q_left, q_right, epsilon)
                        q_next = _target(q_left, q_right, a2, watkins)
                        delta = _td_error(False, failure_reward, gamma, q_next, q_sa)
                        if watkins:
                            # Watkins cuts the traces after an exploratory (non-greedy) action.
                            keep_traces = (q_right if a2 == 1 else q_left) == q_next
                    n = n_live[b]
                    if e_hat[b, sa] == 0.0:
                        live[b, n] = sa
                        n += 1
                    else:
                        _fold(q, w, e_hat, c_start, d_start, b, sa, alpha, total_c, total_d)
                    e_hat[b, sa] = _bump(e_hat[b, sa], 1.0 / c, accumulate)
                    c_start[b, sa] = total_c
                    d_start[b, sa] = total_d
                    smallest[b] = min(smallest[b], e_hat[b, sa])
                    total_c = total_c + c
                    total_d = _advance(total_d, alpha * delta, c)
                    if keep_traces:
                        c = c * decays[b]
                        threshold = cutoff / c
                        if smallest[b] < threshold:
                            low = np.inf
                            i = 0
                            while i < n:
                                j = live[b, i]
                                if e_hat[b, j] < threshold:
                                    _fold(q, w, e_hat, c_start, d_start, b, j, alpha, total_c, total_d)
                                    e_hat[b, j] = 0.0
                                    n -= 1
                                    live[b, i] = live[b, n]
                                else:
                                    low = min(low, e_hat[b, j])
                                    i += 1
                            smallest[b] = low
                        if c < RENORMALIZE_BELOW:
                            m = 0
                            low = np.inf
                            for i in range(n):
                                j = live[b, i]
                                _fold(q, w, e_hat, c_start, d_start, b, j, alpha, total_c, total_d)
                                e_hat[b, j] = e_hat[b, j] * c
                                c_start[b, j] = 0.0
                                d_start[b, j] = 0.0
                                if e_hat[b, j] != 0.0:
                                    live[b, m] = j
                                    m += 1
                                    low = min(low, e_hat[b, j])
                            n = m
                            smallest[b] = low
                            c = 1.0
                            total_c = 0.0
                            total_d = 0.0
                    else:
                        for i in range(n):
                            j = live[b, i]
                            _fold(q, w, e_hat, c_start, d_start, b, j, alpha, total_c, total_d)
                            e_hat[b, j] = 0.0
                        n = 0
                        smallest[b] = np.inf
                        c = 1.0
                        total_c = 0.0
                        total_d = 0.0
                    n_live[b] = n
                    clock[b] = c
                    clock_sum[b] = total_c
                    d_sum[b] = total_d
                    if failed[b]:
                        failures[b] += 1
                        x[b], x_dot[b], theta[b], theta_dot[b] = _start_state(
                            _draw(key[b], mixed[WORDS_PER_STEP * k + 1]),
                            _draw(key[b], mixed[WORDS_PER_STEP * k + 2]), start_range)
                        s2 = _box(x[b], x_dot[b], theta[b], theta_dot[b], bounds)
                        a2 = _choose(word, q[b, 2 * s2], q[b, 2 * s2 + 1], epsilon)  # no live traces now
                    s[b] = s2
                    a[b] = a2
            for b in range(size):
                t = (first + b) // agents
                p = first + b - t * agents
                for i in range(n_live[b]):
                    _fold(q, w, e_hat, c_start, d_start, b, live[b, i], alphas[b], clock_sum[b], d_sum[b])
                for j in range(items):
                    q_out[t, p, j] = q[b, j]
                    w_out[t, p, j] = w[b, j]
                    e_out[t, p, j] = e_hat[b, j] * clock[b]
                cart_out[t, p, 0] = x[b]
                cart_out[t, p, 1] = x_dot[b]
                cart_out[t, p, 2] = theta[b]
                cart_out[t, p, 3] = theta_dot[b]
                action_out[t, p] = a[b]
                failures_out[t, p] = failures[b]


@numba.njit(cache=True, parallel=True)
def _greedy_test(shared, keys, phys, bounds, test_steps, start_range, out):
    """Steps balanced by each trial's greedy policy from each random start (§2.5).

    ``out[t, k]`` is the number of steps before the first failure, ``test_steps``
    when it never fails. Ties between the two actions take the coin of the step's word.
    """
    trials, starts = keys.shape
    for index in prange(trials * starts):
        t = index // starts
        k = index - t * starts
        key = keys[t, k]
        x, x_dot, theta, theta_dot = _start_state(_draw(key, _mix_counter(1)), _draw(key, _mix_counter(2)),
                                                  start_range)
        balanced = test_steps
        for n in range(test_steps):
            s = _box(x, x_dot, theta, theta_dot, bounds)
            q_left = shared[t, 2 * s]
            q_right = shared[t, 2 * s + 1]
            tie = 0
            if q_left == q_right:
                tie = _coin(_draw(key, _mix_counter(WORDS_PER_STEP * n)))
            a = _greedy(q_left, q_right, tie)
            x, x_dot, theta, theta_dot, failed = _dynamics(x, x_dot, theta, theta_dot, a, phys)
            if failed:
                balanced = n
                break
        out[t, k] = balanced


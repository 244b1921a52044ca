"""Slow plain-Python reference of PPO's GAE and loss (for tests only).

Written from SB3's ``RolloutBuffer.compute_returns_and_advantage`` and ``PPO.train``
with Python floats (float64) and loops, one row at a time: nothing is shared with
:mod:`popplay.deep.agents.ppo` but the conventions (time-major ``[t][b]`` lists,
``episode_start`` marking the first row of an episode).
"""
from __future__ import annotations

import math


def gae(reward, value, episode_start, last_value, last_episode_start, gamma, lam):
    """(advantages, returns) as ``[t][b]`` lists of floats."""
    T, B = len(reward), len(reward[0])
    advantages = [[0.0] * B for _ in range(T)]
    returns = [[0.0] * B for _ in range(T)]
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if t == T - 1:
                next_non_terminal = 1.0 - float(last_episode_start[b])
                next_value = float(last_value[b])
            else:
                next_non_terminal = 1.0 - float(episode_start[t + 1][b])
                next_value = float(value[t + 1][b])
            delta = float(reward[t][b]) + gamma * next_value * next_non_terminal - float(value[t][b])
            running = delta + gamma * lam * next_non_terminal * running
            advantages[t][b] = running
            returns[t][b] = running + float(value[t][b])
    return advantages, returns


def _mean(xs):
    return sum(xs) / len(xs)


def ppo_loss(log_prob, old_log_prob, advantages, returns, values, entropies, clip_range, value_coef,
             entropy_coef, normalize_advantage=True):
    """The PPO loss of one minibatch (lists over its rows) and what SB3 logs about it.

    ``log_prob``: log pi(a|s) under the current policy; ``entropies``: H(pi(.|s)) per row.
    """
    n = len(log_prob)
    adv = [float(a) for a in advantages]
    if normalize_advantage and n > 1:
        mean = _mean(adv)
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (n - 1))  # unbiased, as torch's std
        adv = [(a - mean) / (std + 1e-8) for a in adv]
    surrogate, clipped, kl = [], 0, []
    for i in range(n):
        log_ratio = float(log_prob[i]) - float(old_log_prob[i])
        ratio = math.exp(log_ratio)
        bounded = min(max(ratio, 1.0 - clip_range), 1.0 + clip_range)
        surrogate.append(min(adv[i] * ratio, adv[i] * bounded))
        clipped += abs(ratio - 1.0) > clip_range
        kl.append((ratio - 1.0) - log_ratio)
    policy_loss = -_mean(surrogate)
    value_loss = _mean([(float(r) - float(v)) ** 2 for r, v in zip(returns, values)])
    entropy = _mean([float(h) for h in entropies])
    return {"loss": policy_loss + value_coef * value_loss - entropy_coef * entropy, "policy_loss": policy_loss,
            "value_loss": value_loss, "entropy": entropy, "clip_fraction": clipped / n, "approx_kl": _mean(kl)}


def log_softmax(logits):
    """log pi(.|s) of one row of logits."""
    top = max(logits)
    log_z = top + math.log(sum(math.exp(x - top) for x in logits))
    return [x - log_z for x in logits]


def entropy(logits):
    return -sum(math.exp(lp) * lp for lp in log_softmax(logits))

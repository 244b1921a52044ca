"""V-trace off-policy targets (Espeholt et al. 2018, IMPALA, section 4.1).

Actors act with a behaviour policy ``mu`` that lags the learner's target policy
``pi``; V-trace corrects the n-step value targets and the policy-gradient
advantages with truncated importance ratios ``rho_t = min(rho_bar, pi/mu)`` and
``c_t = min(c_bar, pi/mu)``:

    v_s = V(x_s) + sum_{t>=s} (prod_{s<=i<t} discount_i c_i) rho_t delta_t
    delta_t = r_t + discount_t V(x_{t+1}) - V(x_t)
    A_s = rho^pg_s (r_s + discount_s v_{s+1} - V(x_s))

computed backwards as ``v_s - V(x_s) = rho_s delta_s + discount_s c_s (v_{s+1} -
V(x_{s+1}))``. ``discount_t`` is ``gamma`` times "the episode goes on after step
t", so an episode end inside the trajectory cuts both the bootstrap and the trace.
With every ratio 1 and both truncation levels >= 1 the targets are the n-step
bootstrapped returns. ``rho_bar`` controls the value function V-trace converges to
(that of a policy between ``mu`` and ``pi``), ``c_bar`` only the speed of
contraction.

Arrays are time-major: ``[T, ...]`` for per-step quantities, ``[...]`` for the
bootstrap value ``V(x_T)``. Targets carry no gradient.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch


class VTraceReturns(NamedTuple):
    """V-trace value targets ``vs`` and policy-gradient advantages, both ``[T, ...]``."""

    vs: Any
    pg_advantages: Any
    rhos: Any  # the untruncated importance ratios pi/mu, for diagnostics


def _check(name: str, x: Any, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"vtrace: {name} has shape {tuple(x.shape)}, expected {shape}")


def vtrace(
    behaviour_log_probs: Any,
    target_log_probs: Any,
    rewards: Any,
    values: Any,
    bootstrap_value: Any,
    discounts: Any,
    *,
    rho_bar: float | None = 1.0,
    c_bar: float | None = 1.0,
    pg_rho_bar: float | None = None,
) -> VTraceReturns:
    """V-trace targets for a batch of trajectories.

    ``behaviour_log_probs``, ``target_log_probs``: log mu(a_t|x_t) and log pi(a_t|x_t)
    of the actions taken, ``[T, ...]``. ``rewards``, ``values`` (V(x_t) under the
    learner's critic), ``discounts`` (gamma, or 0 where the episode ended at step t):
    ``[T, ...]``. ``bootstrap_value``: V(x_T), ``[...]``. ``rho_bar``/``c_bar``
    truncate the ratios in the targets and the traces (``None``: no truncation);
    ``pg_rho_bar`` truncates those of the advantages and defaults to ``rho_bar``.
    All tensors are float torch tensors on one device; the result is detached.
    """

    shape = tuple(rewards.shape)
    if len(shape) < 1 or shape[0] < 1:
        raise ValueError("vtrace: rewards need a leading time axis of length >= 1")
    for name, x in (
        ("behaviour_log_probs", behaviour_log_probs),
        ("target_log_probs", target_log_probs),
        ("values", values),
        ("discounts", discounts),
    ):
        _check(name, x, shape)
    _check("bootstrap_value", bootstrap_value, shape[1:])
    for name, level in (("rho_bar", rho_bar), ("c_bar", c_bar), ("pg_rho_bar", pg_rho_bar)):
        if level is not None and not level > 0:
            raise ValueError(f"vtrace: {name} must be positive, got {level}")
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar

    with torch.no_grad():
        rhos = torch.exp(target_log_probs - behaviour_log_probs)
        clipped_rhos = rhos if rho_bar is None else torch.clamp(rhos, max=rho_bar)
        cs = rhos if c_bar is None else torch.clamp(rhos, max=c_bar)
        pg_rhos = rhos if pg_rho_bar is None else torch.clamp(rhos, max=pg_rho_bar)

        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = clipped_rhos * (rewards + discounts * next_values - values)

        # T is a trajectory length (tens of steps): a Python loop over time is cheap
        # beside the network passes that produce its inputs.
        corrections = torch.empty_like(values)
        acc = torch.zeros_like(bootstrap_value)
        for t in range(shape[0] - 1, -1, -1):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            corrections[t] = acc
        vs = values + corrections

        next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, rhos=rhos)


def nstep_returns(rewards: Any, bootstrap_value: Any, discounts: Any) -> Any:
    """Bootstrapped returns ``G_t = r_t + discount_t G_{t+1}``, ``G_T = V(x_T)``, ``[T, ...]``.

    The targets of on-policy A2C; V-trace reduces to them when every ratio is 1.
    """

    shape = tuple(rewards.shape)
    _check("discounts", discounts, shape)
    _check("bootstrap_value", bootstrap_value, shape[1:])
    with torch.no_grad():
        out = torch.empty_like(rewards)
        acc = bootstrap_value
        for t in range(shape[0] - 1, -1, -1):
            acc = rewards[t] + discounts[t] * acc
            out[t] = acc
    return out

"""Numba kernel of popplay's cart-pole as a gymnasium environment (private; see
:mod:`popplay.deep.envs.cartpole`). The dynamics are :func:`popplay.games.cartpole.rules.make_rules`'s,
so the environment follows the population engines' trajectories bit for bit."""
from __future__ import annotations

import numba
import numpy as np

from popplay.deep.envs._numpy_streams import seeded_uniforms
from popplay.games.cartpole.rules import make_rules
from popplay.xp import nb

_dynamics = numba.njit(cache=True, inline="always")(make_rules(nb).dynamics.py_func)


@numba.njit(cache=True, inline="always")
def _advance(states, i, action, phys):
    """Row ``i`` of ``states`` one Euler step on, in place; whether it failed."""
    x, xd, th, thd, failed = _dynamics(states[i, 0], states[i, 1], states[i, 2], states[i, 3], np.int64(action), phys)
    states[i, 0] = x
    states[i, 1] = xd
    states[i, 2] = th
    states[i, 3] = thd
    return failed


@numba.njit(cache=True)
def step_many(states, actions, phys, failed):
    """Advance every row of ``states`` (n, 4) in place by one Euler step; ``failed[i]``
    is set when row i left the track or passed the angle limit."""
    for i in range(states.shape[0]):
        failed[i] = _advance(states, i, actions[i], phys)


@numba.njit(cache=True)
def step_all(states, actions, phys, steps, limit, successors, failed, truncated):
    """:func:`step_many` over every row, with what a batch of environments returns
    written into the outputs in the same loop: the float32 ``successors``, ``failed``,
    and ``truncated`` (``steps`` reached ``limit``, -1 for none, without failing);
    ``steps`` counts on. Returns False, stepping nothing, when an action is not 0 or 1."""
    for i in range(states.shape[0]):
        if actions[i] != 0 and actions[i] != 1:
            return False
    for i in range(states.shape[0]):
        f = _advance(states, i, actions[i], phys)
        for j in range(4):
            successors[i, j] = np.float32(states[i, j])
        failed[i] = f
        steps[i] += 1
        truncated[i] = limit >= 0 and steps[i] >= limit and not f
    return True


@numba.njit(cache=True)
def reset_rows(states, steps, rows, seeds, low, high, starts):
    """Restart rows ``rows`` of ``states`` from :func:`seeded_uniforms` draws of
    ``seeds`` in [low, high), their ``steps`` at 0, the starts also into ``starts``
    (float32). Returns False, resetting nothing, when a row is outside ``states`` or a
    seed outside [0, 2^32)."""
    for i in range(rows.shape[0]):
        if rows[i] < 0 or rows[i] >= states.shape[0] or seeds[i] < 0 or seeds[i] > 0xFFFFFFFF:
            return False
    draws = np.empty((rows.shape[0], states.shape[1]))
    seeded_uniforms(seeds, low, high, draws)
    for i in range(rows.shape[0]):
        for j in range(states.shape[1]):
            states[rows[i], j] = draws[i, j]
            starts[i, j] = np.float32(draws[i, j])
        steps[rows[i]] = 0
    return True

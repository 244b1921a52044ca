"""Numba kernel of popplay's cart-pole as a gymnasium environment (private; see
:mod:`popplay.deep.envs.cartpole`). The dynamics are :func:`popplay.games.cartpole.rules.make_rules`'s,
so the environment follows the population engines' trajectories bit for bit."""
from __future__ import annotations

import numba
import numpy as np

from popplay.games.cartpole.rules import make_rules
from popplay.xp import nb

_dynamics = numba.njit(cache=True, inline="always")(make_rules(nb).dynamics.py_func)


@numba.njit(cache=True)
def step_many(states, actions, phys, failed):
    """Advance every row of ``states`` (n, 4) in place by one Euler step; ``failed[i]``
    is set when row i left the track or passed the angle limit."""
    for i in range(states.shape[0]):
        x, xd, th, thd, f = _dynamics(states[i, 0], states[i, 1], states[i, 2], states[i, 3],
                                      np.int64(actions[i]), phys)
        states[i, 0] = x
        states[i, 1] = xd
        states[i, 2] = th
        states[i, 3] = thd
        failed[i] = f

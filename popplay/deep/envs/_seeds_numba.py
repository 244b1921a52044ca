"""Numba kernel of a deep population's episode seeds (private; see
:func:`popplay.deep.envs.members.episode_seeds`): :func:`popplay.rng.key_extend`'s
hash, from :func:`popplay.rng.make_rng` over numba scalars, so the same bits."""
from __future__ import annotations

import numba
import numpy as np

from popplay import rng
from popplay.xp import nb

_combine = rng.make_rng(nb).combine


@numba.njit(cache=True)
def episode_seeds_into(keys, episodes, out):
    """``out[i]``: the low 32 bits of key ``keys[i]`` extended by ``episodes[i]``."""
    for i in range(keys.shape[0]):
        out[i] = _combine(keys[i], episodes[i]) & np.int64(0xFFFFFFFF)

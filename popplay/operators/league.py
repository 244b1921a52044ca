"""A league of past generations: who among frozen snapshots an agent's game meets.

Pure functions over batched arrays: the uniforms come from the caller's streams, so a
run draws the same opponents whatever the process layout, and a resumed run the same
as an uninterrupted one.
"""
from __future__ import annotations

import numpy as np

#: The priority exponent of prioritised fictitious self-play (AlphaStar's f_hard).
PFSP_POWER = 2.0
#: How fast the population's score against a snapshot forgets (per episode it is met).
SCORE_MEMORY = 0.9


def pfsp_weights(scores: np.ndarray, power: float = PFSP_POWER) -> np.ndarray:
    """Sampling weights of league members the population scores ``scores`` against
    (in [0, 1]): (1 − score)^power, normalised; uniform when every member is beaten
    outright (all weights 0)."""
    scores = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    weights = (1.0 - scores) ** power
    total = weights.sum()
    if not total > 0.0:
        return np.full(scores.shape, 1.0 / max(scores.size, 1))
    return weights / total


def league_opponents(join: np.ndarray, member: np.ndarray, agent: np.ndarray, weights: np.ndarray,
                     fraction: float, agents: int) -> np.ndarray:
    """Per game slot: the league member it meets, or −1 for a game within the population.

    Args:
        join, member, agent: uniforms in [0, 1), one per game slot (any shape, the same).
        weights: (members,) sampling weights of the league's snapshots (sum 1).
        fraction: the chance that a slot meets the league.
        agents: agents per snapshot.

    Returns:
        int64 of the slots' shape: ``s · agents + a`` (agent ``a`` of league snapshot
        ``s``) where ``join < fraction``, else −1.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.size == 0:
        return np.full(np.shape(join), -1, dtype=np.int64)
    edges = np.cumsum(weights)
    edges[-1] = 1.0  # rounding must not leave a uniform past the last edge
    snapshot = np.minimum(np.searchsorted(edges, member, side="right"), weights.size - 1)
    within = np.minimum(np.floor(np.asarray(agent) * agents).astype(np.int64), agents - 1)
    return np.where(np.asarray(join) < fraction, snapshot * agents + within, -1).astype(np.int64)


def updated_scores(scores: np.ndarray, met: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The population's running score against each member after an episode: for every
    member met (``met``: the member of each game, −1 none; ``points``: the home agent's
    points in it), an exponential average with the episode's mean."""
    scores = np.array(scores, dtype=np.float64)
    met = np.asarray(met).reshape(-1)
    points = np.asarray(points, dtype=np.float64).reshape(-1)
    for member in np.unique(met[met >= 0]):
        scores[member] = SCORE_MEMORY * scores[member] + (1.0 - SCORE_MEMORY) * points[met == member].mean()
    return scores

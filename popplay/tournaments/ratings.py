"""Ratings from tournament results (win/draw matrices).

Convention: Elo scale, base 10, 400 points per factor of ten in odds::

    P(i scores against j) = 1 / (1 + 10 ** ((R_j - R_i) / 400))

fitted by maximum likelihood to the game scores (Bradley–Terry with a draw counting
half a win for each side). Ratings are relative: the mean rating is 0 unless an
``anchor`` player is given, whose rating is then fixed (e.g. a benchmark opponent at 0).

A player who wins (or loses) every game has no finite maximum-likelihood rating;
``prior_draws`` virtual draws against a player of the anchor's/mean rating keep every
rating finite (as BayesElo does with its default of two). With ``prior_draws=0`` the
plain maximum-likelihood estimate is returned when it exists.
"""
from __future__ import annotations

import numpy as np

ELO_SCALE = 400.0 / np.log(10.0)  # rating points per unit of natural-log strength


def score_matrix(wins: np.ndarray, draws: np.ndarray, games: np.ndarray) -> np.ndarray:
    """s_ij = (wins_ij + draws_ij / 2) / games_ij (NaN where i and j did not meet)."""
    wins, draws, games = (np.asarray(a, dtype=np.float64) for a in (wins, draws, games))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(games > 0, (wins + draws / 2.0) / games, np.nan)


def elo_ratings(wins: np.ndarray, draws: np.ndarray, games: np.ndarray | None = None, *,
                anchor: int | None = None, prior_draws: float = 2.0, tolerance: float = 1e-10,
                max_iterations: int = 10_000) -> np.ndarray:
    """Maximum-likelihood Elo ratings from square result matrices.

    Args:
        wins: wins[i, j] = games i won against j.
        draws: draws[i, j] = drawn games between i and j (symmetric).
        games: games[i, j] played between i and j (default wins + wins.T + draws).
        anchor: index of the player whose rating is fixed at 0; None → mean rating 0.
        prior_draws: virtual draws of each player against a player rated like the anchor
            (or the mean); keeps ratings finite when someone wins or loses everything.

    Returns:
        Ratings, shape (players,).
    """
    wins = np.asarray(wins, dtype=np.float64)
    draws = np.asarray(draws, dtype=np.float64)
    if wins.ndim != 2 or wins.shape[0] != wins.shape[1] or draws.shape != wins.shape:
        raise ValueError("wins and draws must be square matrices of the same shape")
    if (wins < 0).any() or (draws < 0).any():
        raise ValueError("result counts must be non-negative")
    if not np.allclose(draws, draws.T):
        raise ValueError("draws must be symmetric")
    games = wins + wins.T + draws if games is None else np.asarray(games, dtype=np.float64)
    if not np.allclose(games, wins + wins.T + draws):
        raise ValueError("games must equal wins + wins.T + draws")
    n = wins.shape[0]
    if anchor is not None and not 0 <= anchor < n:
        raise ValueError(f"anchor {anchor} is not a player index")
    if prior_draws <= 0 and not _strongly_connected((wins + draws) > 0):
        raise ValueError("no finite maximum-likelihood ratings: some group of players scored nothing "
                         "against the rest; use prior_draws > 0")
    score = (wins + draws / 2.0).sum(axis=1) + prior_draws / 2.0
    pair_games = games.copy()
    np.fill_diagonal(pair_games, 0.0)
    # Minorize-maximize iterations (Hunter 2004) on strengths gamma = exp(R / ELO_SCALE).
    # The prior is a virtual opponent whose strength follows the reference (1 after
    # normalisation).
    gamma = np.ones(n)
    for _ in range(max_iterations):
        reference = gamma[anchor] if anchor is not None else np.exp(np.log(gamma).mean())
        denominator = (pair_games / (gamma[:, None] + gamma[None, :])).sum(axis=1)
        denominator += prior_draws / (gamma + reference)
        with np.errstate(divide="ignore"):
            updated = np.where(denominator > 0, score / np.where(denominator > 0, denominator, 1.0), gamma)
        if (updated <= 0).any() or not np.isfinite(updated).all():
            raise ValueError("no finite ratings: some player lost (or won) every game; use prior_draws > 0")
        updated /= updated[anchor] if anchor is not None else np.exp(np.log(updated).mean())
        change = np.abs(np.log(updated) - np.log(gamma)).max()
        gamma = updated
        if change < tolerance:
            break
    return ELO_SCALE * np.log(gamma)


def elo_standard_errors(ratings: np.ndarray, wins: np.ndarray, draws: np.ndarray, *, anchor: int | None = None,
                        prior_draws: float = 2.0) -> np.ndarray:
    """Standard errors of :func:`elo_ratings` (same ``anchor`` and ``prior_draws``) from
    the Fisher information of the maximum-likelihood fit.

    In natural strengths θ = R / ELO_SCALE, a pair that played g games contributes
    g p (1 − p) (p = P(i scores against j) at the fit) to I_ii and I_jj and minus that
    to I_ij; the prior's virtual draws add theirs to I_ii (their opponent held at the
    reference). Ratings are identified only up to a common shift, so the covariance is
    taken under the same constraint as the ratings: the anchor's rating fixed (its
    error 0) or the mean rating 0 (the pseudo-inverse on the sum-zero subspace).
    Errors are of ratings relative to that reference, in Elo points; rating
    differences between two players have errors up to the two combined.
    """
    r = np.asarray(ratings, dtype=np.float64)
    wins = np.asarray(wins, dtype=np.float64)
    draws = np.asarray(draws, dtype=np.float64)
    n = r.size
    if wins.shape != (n, n) or draws.shape != (n, n):
        raise ValueError("wins and draws must be square matrices with one row per rating")
    games = wins + wins.T + draws
    np.fill_diagonal(games, 0.0)
    theta = r / ELO_SCALE
    p = 1.0 / (1.0 + np.exp(theta[None, :] - theta[:, None]))
    weight = games * p * (1.0 - p)
    information = -weight
    np.fill_diagonal(information, weight.sum(axis=1))
    reference = theta[anchor] if anchor is not None else theta.mean()
    p_prior = 1.0 / (1.0 + np.exp(reference - theta))
    information[np.diag_indices(n)] += prior_draws * p_prior * (1.0 - p_prior)
    if anchor is not None:
        keep = np.arange(n) != anchor
        covariance = np.zeros((n, n))
        covariance[np.ix_(keep, keep)] = np.linalg.pinv(information[np.ix_(keep, keep)])
    else:
        centre = np.eye(n) - 1.0 / n
        covariance = centre @ np.linalg.pinv(centre @ information @ centre) @ centre
    return ELO_SCALE * np.sqrt(np.clip(np.diag(covariance), 0.0, None))


def _strongly_connected(edges: np.ndarray) -> bool:
    """Whether every player reaches every other along 'scored against' edges."""

    def reach(adjacency: np.ndarray) -> np.ndarray:
        seen = np.zeros(len(adjacency), dtype=bool)
        seen[0] = True
        frontier = seen.copy()
        while frontier.any():
            frontier = adjacency[frontier].any(axis=0) & ~seen
            seen |= frontier
        return seen

    return bool(reach(edges).all() and reach(edges.T).all())


def expected_score(rating_a: float | np.ndarray, rating_b: float | np.ndarray) -> float | np.ndarray:
    """The model's expected score of a against b."""
    return 1.0 / (1.0 + 10.0 ** ((np.asarray(rating_b) - np.asarray(rating_a)) / 400.0))

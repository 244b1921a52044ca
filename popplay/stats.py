"""Uncertainty of the numbers popplay reports: intervals for rates, errors of means.

Every interval is a two-sided 95 % interval (``Z95``) unless a ``z`` is given.
"""
from __future__ import annotations

from statistics import NormalDist

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def z_value(confidence: float) -> float:
    """The z of a two-sided normal interval at ``confidence`` (0.95 gives :data:`Z95`)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1) (got {confidence!r})")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson_interval(successes: float | np.ndarray, trials: float | np.ndarray, z: float = Z95
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of a rate ``successes / trials``.

    Unlike the normal interval p ± z·√(p(1-p)/n) it stays inside [0, 1] and does not
    collapse to a point at 0 or 1 successes (the usual case for a strong agent against
    a weak opponent). A draw counts as half a success (scores of games), which keeps
    the interval conservative: a draw varies the score less than a win or loss does.

    Args:
        successes: number of successes (may be fractional), 0 <= successes <= trials.
        trials: number of trials (> 0; where 0 the interval is [0, 1]).
        z: normal quantile of the interval (default 95 %).

    Returns:
        ``(low, high)`` arrays (0-d for scalar input).
    """
    s = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if (n < 0).any() or (s < 0).any() or (s > n).any():
        raise ValueError("successes must lie in [0, trials] and trials must be non-negative")
    safe = np.where(n > 0, n, 1.0)
    p = s / safe
    z2 = z * z
    centre = (p + z2 / (2 * safe)) / (1 + z2 / safe)
    half = z * np.sqrt(p * (1 - p) / safe + z2 / (4 * safe * safe)) / (1 + z2 / safe)
    # At 0 or n successes the bound is exactly 0 or 1 (rounding would miss it).
    low = np.where((n > 0) & (s > 0), np.clip(centre - half, 0.0, 1.0), 0.0)
    high = np.where((n > 0) & (s < n), np.clip(centre + half, 0.0, 1.0), 1.0)
    return low, high


def wilson_score_interval(wins: float | np.ndarray, draws: float | np.ndarray, losses: float | np.ndarray,
                          z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """:func:`wilson_interval` of a score (wins + draws/2)/games, a draw half a success."""
    w, d = np.asarray(wins, dtype=np.float64), np.asarray(draws, dtype=np.float64)
    return wilson_interval(w + 0.5 * d, w + d + np.asarray(losses, dtype=np.float64), z)


def score_interval(wins: float | np.ndarray, draws: float | np.ndarray, losses: float | np.ndarray,
                   z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """An interval of a score (wins + draws/2)/games that counts the spread draws do not
    add: the normal interval of the mean per-game score (1, ½, 0) with the per-game
    variance estimated from the games, after adding one win and one loss (so that a
    run of draws alone, or of wins alone, still gets a width; in the spirit of
    Agresti and Coull's added successes and failures, here one of each). Where most games are
    drawn it is much narrower than :func:`wilson_interval`, which prices every draw as
    a coin flip; with no draws the two nearly agree. Clipped to [0, 1].

    Returns:
        ``(low, high)`` arrays (0-d for scalar input).
    """
    w, d, l_ = (np.asarray(x, dtype=np.float64) for x in (wins, draws, losses))
    if (w < 0).any() or (d < 0).any() or (l_ < 0).any():
        raise ValueError("wins, draws and losses must be non-negative")
    n = w + d + l_ + 2.0
    mean = (w + 1.0 + 0.5 * d) / n
    variance = np.maximum((w + 1.0 + 0.25 * d) / n - mean * mean, 0.0)
    half = z * np.sqrt(variance / n)
    return np.clip(mean - half, 0.0, 1.0), np.clip(mean + half, 0.0, 1.0)


def mean_and_error(values: np.ndarray, axis: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Mean and its standard error s/√n (sample standard deviation, n − 1); the error
    is NaN for a single value, where it cannot be estimated."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size if axis is None else x.shape[axis]
    mean = x.mean(axis=axis)
    if n < 2:
        return mean, np.full(np.shape(mean), np.nan)[()]
    return mean, x.std(axis=axis, ddof=1) / np.sqrt(n)


def normal_interval(mean: float | np.ndarray, error: float | np.ndarray, z: float = Z95
                    ) -> tuple[np.ndarray, np.ndarray]:
    """mean ± z · error."""
    m, e = np.asarray(mean, dtype=np.float64), np.asarray(error, dtype=np.float64)
    return m - z * e, m + z * e


def error_metric(name: str, values: np.ndarray) -> dict[str, float]:
    """``{name + "_se": standard error of the mean of values}``, or nothing for fewer
    than two values (no error can be estimated; JSON has no NaN)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size < 2:
        return {}
    return {f"{name}_se": float(mean_and_error(values)[1])}

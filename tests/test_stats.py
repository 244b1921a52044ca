"""Intervals and standard errors (popplay.stats)."""
import numpy as np
import pytest

from popplay.stats import Z95, mean_and_error, normal_interval, score_interval, wilson_interval


def test_wilson_interval_known_values_and_edges():
    low, high = wilson_interval(5, 10)
    assert (float(low), float(high)) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson_interval(0, 10)  # no collapse to a point at 0 successes
    assert float(low) == 0.0 and float(high) == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(np.array([10, 3.5]), np.array([10, 7]))
    assert high[0] == 1.0 and low[0] < 1.0 and low[1] < 0.5 < high[1]
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_mean_and_error():
    mean, error = mean_and_error(np.array([1.0, 2.0, 3.0, 4.0]))
    assert mean == 2.5 and error == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)
    assert np.isnan(mean_and_error(np.array([3.0]))[1])
    low, high = normal_interval(2.5, 0.5)
    assert (float(low), float(high)) == pytest.approx((2.5 - 0.98, 2.5 + 0.98), abs=1e-3)


def _score_interval_by_hand(wins, draws, losses):
    """The per-game scores written out, one added win and one added loss."""
    games = np.array([1.0] * (wins + 1) + [0.5] * draws + [0.0] * (losses + 1))
    half = Z95 * games.std() / np.sqrt(games.size)  # the plain (n) variance of the games
    return max(0.0, games.mean() - half), min(1.0, games.mean() + half)


@pytest.mark.parametrize("wins, draws, losses", [(161, 3835, 4), (117, 3882, 1), (30, 40, 30), (0, 20, 0),
                                                 (50, 0, 0), (3, 0, 7)])
def test_score_interval_is_the_normal_interval_of_the_game_scores_with_a_win_and_a_loss_added(wins, draws, losses):
    low, high = score_interval(wins, draws, losses)
    assert (float(low), float(high)) == pytest.approx(_score_interval_by_hand(wins, draws, losses), abs=1e-12)
    assert high > low  # all draws, or all wins, still leave a width


def test_score_interval_is_narrow_where_draws_carry_no_spread_and_wilson_like_without_draws():
    low, high = score_interval(161, 3835, 4)  # a held-out check of session 14: almost all draws
    w_low, w_high = wilson_interval(161 + 0.5 * 3835, 4000)
    assert high - low < 0.25 * (w_high - w_low) and low > 0.5
    low, high = score_interval(np.array([600, 40]), np.array([0, 0]), np.array([400, 60]))
    w_low, w_high = wilson_interval(np.array([600, 40]), np.array([1000, 100]))
    np.testing.assert_allclose(low, w_low, atol=0.01)
    np.testing.assert_allclose(high, w_high, atol=0.01)
    with pytest.raises(ValueError):
        score_interval(-1, 2, 3)

"""Elo ratings by maximum likelihood on small cases with known answers."""
import numpy as np
import pytest

from popplay.tournaments.ratings import elo_ratings, expected_score, score_matrix


def test_two_players_three_to_one():
    wins = np.array([[0, 3], [1, 0]])
    ratings = elo_ratings(wins, np.zeros((2, 2)), prior_draws=0)
    assert ratings[0] - ratings[1] == pytest.approx(400 * np.log10(3), abs=1e-6)
    assert ratings.mean() == pytest.approx(0, abs=1e-9)


def test_results_that_match_the_model_exactly_recover_the_ratings():
    true = np.array([0.0, 100.0, 300.0, -250.0])
    n = 1000.0
    p = expected_score(true[:, None], true[None, :])
    wins = p * n
    np.fill_diagonal(wins, 0)
    ratings = elo_ratings(wins, np.zeros((4, 4)), prior_draws=0, anchor=0)
    np.testing.assert_allclose(ratings, true, atol=1e-6)


def test_draws_count_half_and_even_results_give_equal_ratings():
    draws = np.full((3, 3), 4.0)
    np.fill_diagonal(draws, 0)
    np.testing.assert_allclose(elo_ratings(np.zeros((3, 3)), draws, prior_draws=0), 0, atol=1e-9)
    # one win and two draws against each other: 2-1 in score terms, like wins 2:1
    with_draws = elo_ratings(np.array([[0, 1], [0, 0]]), np.array([[0, 2], [2, 0]]), prior_draws=0)
    assert with_draws[0] - with_draws[1] == pytest.approx(400 * np.log10(2), abs=1e-6)


def test_balanced_round_robin_orders_ratings_like_scores():
    rng = np.random.default_rng(5)
    wins = rng.integers(0, 9, size=(6, 6)).astype(float)
    np.fill_diagonal(wins, 0)
    wins = np.minimum(wins, 8 - wins.T)  # at most 8 decisive games per pair
    draws = 8 - wins - wins.T
    np.fill_diagonal(draws, 0)
    ratings = elo_ratings(wins, draws)
    totals = (wins + draws / 2).sum(axis=1)
    assert np.array_equal(np.argsort(ratings), np.argsort(totals))


def test_anchor_fixes_one_rating_and_perfect_scores_need_the_prior():
    wins = np.array([[0, 4, 4], [0, 0, 2], [0, 2, 0]])
    with pytest.raises(ValueError, match="prior_draws"):
        elo_ratings(wins, np.zeros((3, 3)), prior_draws=0)
    ratings = elo_ratings(wins, np.zeros((3, 3)), anchor=2)
    assert ratings[2] == 0 and np.isfinite(ratings).all() and ratings[0] > ratings[1]


def test_score_matrix_is_complementary():
    wins = np.array([[0, 3, 1], [1, 0, 2], [2, 1, 0]])
    draws = np.array([[0, 0, 1], [0, 0, 1], [1, 1, 0]])
    s = score_matrix(wins, draws, wins + wins.T + draws)
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose((s + s.T)[off], 1.0)
    assert np.isnan(np.diag(s)).all()


def test_bad_matrices_are_refused():
    with pytest.raises(ValueError):
        elo_ratings(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError):
        elo_ratings(np.array([[0, -1], [0, 0]]), np.zeros((2, 2)))
    with pytest.raises(ValueError):
        elo_ratings(np.zeros((2, 2)), np.array([[0, 1], [2, 0]]))


def test_rating_errors_are_the_inverse_fisher_information():
    from popplay.tournaments.ratings import ELO_SCALE, elo_standard_errors

    wins = np.array([[0, 30], [10, 0]])
    draws = np.zeros((2, 2))
    anchored = elo_ratings(wins, draws, anchor=0, prior_draws=0)
    errors = elo_standard_errors(anchored, wins, draws, anchor=0, prior_draws=0)
    # Two players, 40 games, p = 1/4: var(θ1) = 1 / (40 p (1 − p)).
    assert errors[0] == 0.0
    assert errors[1] == pytest.approx(ELO_SCALE / np.sqrt(40 * 0.25 * 0.75), rel=1e-6)
    centred = elo_ratings(wins, draws, prior_draws=0)
    halves = elo_standard_errors(centred, wins, draws, prior_draws=0)
    assert halves == pytest.approx([errors[1] / 2] * 2, rel=1e-6)  # each holds half the difference
    # Four times the games: half the error.
    quarter = elo_standard_errors(anchored, 4 * wins, draws, anchor=0, prior_draws=0)
    assert quarter[1] == pytest.approx(errors[1] / 2, rel=1e-6)


def test_rating_errors_cover_the_truth_about_95_percent_of_the_time():
    from popplay.tournaments.ratings import elo_standard_errors

    rng = np.random.default_rng(0)
    truth = np.array([0.0, 100.0, -150.0, 250.0])
    truth -= truth.mean()
    covered, runs = 0, 200
    for _ in range(runs):
        wins = np.zeros((4, 4))
        for i in range(4):
            for j in range(i + 1, 4):
                w = rng.binomial(60, 1 / (1 + 10 ** ((truth[j] - truth[i]) / 400)))
                wins[i, j], wins[j, i] = w, 60 - w
        ratings = elo_ratings(wins, np.zeros((4, 4)), prior_draws=0)
        errors = elo_standard_errors(ratings, wins, np.zeros((4, 4)), prior_draws=0)
        covered += int(abs(ratings[3] - truth[3]) <= 1.96 * errors[3])
    assert 0.88 <= covered / runs <= 0.99

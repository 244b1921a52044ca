"""Round-robin tournaments: batched, consistent, reproducible; ratings that follow the scores."""
import numpy as np
import pytest

from popplay.games.knights import rules as game
from popplay.games.knights import engine
from popplay.games.knights.rules import KnightsParams, Networks
from popplay.tournaments import roundrobin
from popplay.tournaments.roundrobin import pad_hidden, round_robin, stack_networks

PARAMS = KnightsParams(rows=4, cols=5, pieces=3, max_turns=40)


def _nets(count=4, hidden=3, seed=5):
    nets = game.init_networks(seed, np.arange(count), PARAMS.inputs, hidden, 1.0)
    return Networks(**{name: np.ascontiguousarray(a) for name, a in nets.arrays().items()})


def test_results_are_consistent_and_complementary():
    nets = _nets()
    players = [0, 1, 2, 3, -1, -2]
    result = round_robin(nets, players, 6, params=PARAMS, seed=1)
    n = len(players)
    off = ~np.eye(n, dtype=bool)
    assert np.array_equal(result.losses, result.wins.T) and np.array_equal(result.draws, result.draws.T)
    assert (np.diag(result.games) == 0).all() and (result.games[off] == 6).all()
    s = result.score
    np.testing.assert_allclose((s + s.T)[off], 1.0)
    assert np.isnan(np.diag(s)).all()
    expected_total = np.nansum(s, axis=1) / (n - 1)  # every pair played the same number of games
    np.testing.assert_allclose(result.total, expected_total)
    assert result.turns > 0


def test_ratings_follow_total_scores_and_greedy_outranks_random():
    nets = _nets(5)
    players = [0, 1, 2, 3, 4, -1, -2]
    result = round_robin(nets, players, 10, params=PARAMS, seed=2)
    ratings = result.ratings()
    assert ratings.mean() == pytest.approx(0.0, abs=1e-6)
    # a balanced round robin: the maximum-likelihood ratings are ordered like the totals
    totals = result.total
    for i in range(len(players)):
        for j in range(len(players)):
            if totals[i] > totals[j] + 1e-12:
                assert ratings[i] > ratings[j]
    assert result.wins[6, 5] == 10  # greedy beats random in every game
    assert ratings[6] > ratings[5]
    anchored = result.ratings(anchor=5)  # random at 0: the scale moves, the order stays
    assert anchored[5] == 0.0 and np.array_equal(np.argsort(anchored, kind="stable"),
                                                 np.argsort(ratings, kind="stable"))


def test_reproducible_for_a_seed_and_independent_of_batching(monkeypatch):
    nets = _nets()
    players = [0, 1, 2, 3, -2]
    a = round_robin(nets, players, 5, params=PARAMS, seed=3)
    b = round_robin(nets, players, 5, params=PARAMS, seed=3)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    c = round_robin(nets, players, 5, params=PARAMS, seed=4)
    assert not np.array_equal(a.wins, c.wins) or not np.array_equal(a.draws, c.draws)
    monkeypatch.setattr(roundrobin, "MAX_BATCH", 7)  # one or two pairs per engine call
    d = round_robin(nets, players, 5, params=PARAMS, seed=3)
    assert np.array_equal(a.wins, d.wins) and np.array_equal(a.draws, d.draws)


def test_each_pair_plays_the_match_it_would_play_alone():
    nets = _nets()
    players = np.array([0, 1, 2, -1])
    games = 3  # odd: pairs alternate who gets the extra first move
    result = round_robin(nets, players, games, params=PARAMS, seed=9)
    first, second = np.triu_indices(4, k=1)
    for k, (i, j) in enumerate(zip(first, second)):
        a, b = (j, i) if k % 2 else (i, j)
        alone = engine.play_pairs(nets, [[players[a], players[b]]], games, params=PARAMS, seed=9,
                                tag=roundrobin.TAG_TOURNAMENT, streams=[0])
        assert (result.wins[a, b], result.draws[a, b], result.losses[a, b]) == \
            (alone.wins[0], alone.draws[0], alone.losses[0])


def test_padded_networks_play_exactly_the_same_games():
    small = _nets(3, hidden=2)
    result = round_robin(small, [0, 1, 2, -2], 8, params=PARAMS, seed=1)
    padded = pad_hidden(small, 6)
    assert padded.w1.shape == (3, PARAMS.inputs, 6)
    again = round_robin(padded, [0, 1, 2, -2], 8, params=PARAMS, seed=1)
    assert np.array_equal(result.wins, again.wins) and np.array_equal(result.draws, again.draws)
    mixed = stack_networks([small, _nets(2, hidden=4, seed=8)])
    assert mixed.w1.shape == (5, PARAMS.inputs, 4) and np.array_equal(mixed.w1[:3, :, :2], small.w1)


def test_bad_arguments():
    nets = _nets()
    with pytest.raises(ValueError, match="games"):
        round_robin(nets, [0, 1], 0, params=PARAMS)
    with pytest.raises(ValueError, match="two players"):
        round_robin(nets, [0], 2, params=PARAMS)
    with pytest.raises(ValueError, match="shrink"):
        pad_hidden(nets, 1)

"""A league of past generations: who is drawn (uniform, prioritised fictitious
self-play), members frozen and never learning, exact resume, one-line refusals."""
from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest

from popplay.core.backend import Backend
from popplay.distributed.group import Dist
from popplay.games.knights.experiment import KnightsExperiment
from popplay.games.knights.rules import KnightsParams
from popplay.operators import league

PARAMS = KnightsParams(rows=4, cols=5, pieces=2, max_turns=30, agents=3, games_per_agent=8, episodes=8,
                       snapshot_every=2, league=2, league_fraction=0.5, eval_every=4, eval_games=2, seed=4)


def test_pfsp_weights_favour_members_not_yet_beaten() -> None:
    weights = league.pfsp_weights(np.array([1.0, 0.5, 0.0]))
    np.testing.assert_allclose(weights, np.array([0.0, 0.25, 1.0]) / 1.25)
    np.testing.assert_allclose(league.pfsp_weights(np.ones(4)), np.full(4, 0.25))  # all beaten: uniform


def test_league_opponents_map_uniforms_to_members_and_agents() -> None:
    join = np.array([0.1, 0.9, 0.2, 0.3])
    member = np.array([0.2, 0.2, 0.7, 0.99])
    agent = np.array([0.0, 0.5, 0.5, 0.99])
    drawn = league.league_opponents(join, member, agent, np.array([0.5, 0.5]), 0.5, agents=3)
    assert drawn.tolist() == [0, -1, 3 + 1, 3 + 2]  # slot 1 stays in the population (0.9 >= 0.5)
    assert (league.league_opponents(join, member, agent, np.zeros(0), 1.0, 3) == -1).all()  # no league yet
    rng = np.random.default_rng(0)
    many = league.league_opponents(rng.random(20000), rng.random(20000), rng.random(20000),
                                   np.array([0.1, 0.9]), 0.25, agents=2)
    assert abs((many >= 0).mean() - 0.25) < 0.02
    assert abs((many[many >= 0] >= 2).mean() - 0.9) < 0.02  # the second member drawn 9 times in 10


def test_updated_scores_average_the_games_against_each_member() -> None:
    scores = league.updated_scores(np.array([0.5, 0.5, 0.5]), np.array([0, 0, 2, -1]), np.array([1.0, 0.0, 1.0, 1.0]))
    np.testing.assert_allclose(scores, [0.5, 0.5, 0.9 * 0.5 + 0.1])


def _run(params: KnightsParams, episodes: int, state=None):
    experiment = KnightsExperiment(params, Backend("numba", "cpu"), dist=Dist())
    state = experiment.initial_state() if state is None else state
    history = []
    for _ in range(episodes):
        history.append(state)
        state = experiment.phase(state, time_left=None)
    return experiment, state, history


def test_league_members_are_the_last_snapshots_frozen_and_never_learn() -> None:
    experiment, state, history = _run(PARAMS, 8)
    assert len(state.snapshots) == 5 and len(experiment.league_members(state)) == 2
    at_four = history[4].snapshots[2]  # the snapshot taken after episode 4, as it was then
    later = state.snapshots[2]
    for name in ("w1", "b1", "w2", "b2", "epsilon"):
        assert np.array_equal(getattr(at_four, name), getattr(later, name)), name  # frozen
    drawn = experiment.league_opponents(history[6])
    assert (drawn >= 0).any() and (drawn < 0).any()
    assert drawn.max() < 2 * PARAMS.agents  # only the last two snapshots' agents
    batch = experiment.episode_batch(history[6], drawn)
    league_side = batch.net >= PARAMS.agents
    assert league_side.any() and not (batch.learn & league_side).any()  # members never learn
    assert not np.array_equal(state.league_score, np.full(5, 0.5))  # the population's scores were kept


def test_no_league_plays_as_before() -> None:
    plain = dataclasses.replace(PARAMS, league=0)
    with_zero = dataclasses.replace(PARAMS, league=2, league_fraction=0.0)
    _, a, _ = _run(plain, 4)
    _, b, _ = _run(with_zero, 4)
    assert np.array_equal(a.w1, b.w1)  # the league's streams never touch the population's


def test_resume_with_a_league_is_exact(tmp_path, cli) -> None:
    args = ["train", "knights", "--rows", "4", "--cols", "5", "--pieces", "2", "--max-turns", "30", "--agents", "3",
            "--games-per-agent", "8", "--snapshot-every", "2", "--league", "2", "--league-sampling", "pfsp",
            "--eval-every", "4", "--eval-games", "2", "--seed", "4"]
    whole, half = tmp_path / "whole.h5", tmp_path / "half.h5"
    assert cli([*args, "--episodes", "8", "--out", str(whole)])[0] == 0
    assert cli([*args, "--episodes", "4", "--out", str(half)])[0] == 0
    code, _, err = cli(["train", "knights", "--resume", str(half), "--episodes", "8"])
    assert code == 0, err
    with h5py.File(whole) as a, h5py.File(half) as b:
        for name in ("w1", "b2", "league_score", "snapshot_w1"):
            assert np.array_equal(a[f"state/{name}"][()], b[f"state/{name}"][()]), name


@pytest.mark.parametrize("extra, fragment", [
    (["--league", "2", "--snapshot-every", "0"], "--league"),
    (["--league-sampling", "best"], "--league-sampling"),
])
def test_bad_league_options_are_one_line(tmp_path, cli, extra, fragment) -> None:
    code, out, err = cli(["train", "knights", "--agents", "2", "--episodes", "1", "--out", str(tmp_path / "x.h5"),
                          *extra])
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.h5").exists()


# --- selection by ratings with uncertainty ---------------------------------------------

def test_significant_replacement_never_crosses_overlapping_intervals() -> None:
    from popplay.operators import evolution as evo

    ratings = np.array([300.0, 100.0, 0.0, -250.0])
    errors = np.array([50.0, 80.0, 20.0, 50.0])
    parents, children = evo.select_replacements(ratings, 0.5)
    assert parents.tolist() == [0, 1] and children.tolist() == [3, 2]
    mask = evo.significant(parents, children, ratings, errors, 0.95)
    # 300 - 1.96*50 = 202 > -250 + 98 = -152: replace; 100 - 156.8 < 0 + 39.2: intervals overlap, keep
    assert mask.tolist() == [True, False]
    assert evo.significant(parents, children, ratings, errors * 0.1, 0.95).tolist() == [True, True]
    assert not evo.significant(parents, children, ratings, np.full(4, np.inf), 0.95).any()
    looser = evo.significant(parents, children, ratings, errors, 0.5)  # z = 0.674: 100-54 > 0+13.5
    assert looser.tolist() == [True, True]
    with pytest.raises(ValueError, match="confidence"):
        evo.significant(parents, children, ratings, errors, 1.0)


def test_significant_replication_replaces_no_more_than_always() -> None:
    base = dataclasses.replace(PARAMS, league=0, replicate_every=2, tournament_games=2, mutate_weights=0.0)
    _, always, _ = _run(base, 4)
    experiment, strict, _ = _run(dataclasses.replace(base, replicate_when="significant"), 4)
    assert strict.lineage.next_id < always.lineage.next_id  # every copy hands out a new id: here 0 against 2
    assert np.isfinite(experiment.fitness_errors).all()  # the ranking's errors were computed


def test_significant_without_a_tournament_is_refused_in_one_line(tmp_path, cli) -> None:
    code, _, err = cli(["train", "knights", "--agents", "2", "--episodes", "1", "--replicate-every", "1",
                        "--replicate-when", "significant", "--tournament-games", "0", "--out", str(tmp_path / "x.h5")])
    assert code == 2 and "--tournament-games" in err and len(err.strip().splitlines()) == 1


def test_adaptive_pairing_spends_its_games_on_undecided_pairs() -> None:
    from popplay.games.knights import rules as game
    from popplay.games.knights.rules import OPPONENTS
    from popplay.tournaments.roundrobin import adaptive_round_robin, round_robin

    params = dataclasses.replace(PARAMS, rows=5, cols=7, pieces=3)
    nets = game.init_networks(0, np.arange(1), params.inputs, 2, 0.5)
    # random is clearly weaker than the rest; greedy and search1 play the very same moves
    players = [OPPONENTS[name] for name in ("random", "greedy", "search1", "search2")]
    adaptive = adaptive_round_robin(nets, players, 12, params=params, seed=1)
    uniform = round_robin(nets, players, 12, params=params, seed=1)
    assert adaptive.games.sum() <= uniform.games.sum()  # never more than the uniform budget
    games = adaptive.games
    assert games[1, 2] > games[0, 3]  # the undecided twins got more games than a settled pair
    assert games[1, 2] > 12 and games[0, 1] == 6  # beyond the even share; a settled pair stopped at half
    np.testing.assert_array_equal(adaptive.wins + adaptive.wins.T + adaptive.draws, games)


def test_the_step_size_schedule_halves_alpha_every_half_life() -> None:
    scheduled = dataclasses.replace(PARAMS, league=0, alpha_half_life=4)
    experiment, _, history = _run(scheduled, 7)
    state = history[6]  # after 6 episodes: alpha · 2^(-6/4)
    np.testing.assert_array_equal(experiment.step_sizes(state), state.alpha * 2.0 ** (-6 / 4))
    # one episode on the schedule is one episode of a constant run whose alpha is the scheduled one
    on_schedule = experiment.phase(state, time_left=None)
    constant = KnightsExperiment(dataclasses.replace(scheduled, alpha_half_life=0), Backend("numba", "cpu"),
                                 dist=Dist())
    by_hand = constant.phase(state._replace(alpha=state.alpha * 2.0 ** (-6 / 4)), time_left=None)
    assert np.array_equal(on_schedule.w1, by_hand.w1)
    assert not np.array_equal(on_schedule.w1, constant.phase(state, time_left=None).w1)


def test_each_agent_keeps_its_own_half_life_and_copies_vary_it_with_a_fourth_factor() -> None:
    from popplay.operators import evolution as evo

    scheduled = dataclasses.replace(PARAMS, league=0, alpha_half_life=4, agents=4, replicate_every=3,
                                    replicate_fraction=0.25, mutate_params=2.0, mutate_weights=0.0,
                                    tournament_games=0)
    experiment, after, history = _run(scheduled, 3)
    before = history[2]  # the third episode ends with a replication
    np.testing.assert_array_equal(before.half_life, [4.0] * 4)
    copies = after.lineage.records["event"] == evo.EVENTS["mutation"]
    child = int(after.lineage.records["slot"][copies][0])
    child_id = after.agent_id[child]
    factors = evo.vary_factors(scheduled.seed, 3, np.array([child_id]), ("alpha", "lam", "epsilon", "half_life"), 2.0)
    three = evo.vary_factors(scheduled.seed, 3, np.array([child_id]), ("alpha", "lam", "epsilon"), 2.0)
    assert factors["alpha"] == three["alpha"] and factors["lam"] == three["lam"]  # older runs' draws unchanged
    assert after.half_life[child] == 4.0 * factors["half_life"][0] != 4.0
    assert after.lineage.records["half_life"][copies][0] == after.half_life[child]
    others = np.setdiff1d(np.arange(4), [child])
    np.testing.assert_array_equal(after.half_life[others], [4.0] * 3)
    # step sizes follow each agent's own half-life; 0 is a constant step size
    mixed = after._replace(half_life=np.array([4.0, 0.0, 8.0, 2.0]))
    np.testing.assert_array_equal(experiment.step_sizes(mixed),
                                  mixed.alpha * np.array([2.0 ** (-3 / 4), 1.0, 2.0 ** (-3 / 8), 2.0 ** (-3 / 2)]))
    # a run file written before half-lives were per agent loads with the run's for all
    arrays = {k: v for k, v in experiment.state_arrays(after).items() if k not in ("half_life", "lineage_half_life")}
    restored = experiment.restore(arrays, experiment.state_counters(after))
    np.testing.assert_array_equal(restored.half_life, [4.0] * 4)
    bad = {**experiment.state_arrays(after), "half_life": np.array([4.0, -1.0, 4.0, 4.0])}
    with pytest.raises(ValueError, match="half_life"):
        experiment.restore(bad, experiment.state_counters(after))

"""The knights population experiment: episodes, learning, state that round-trips exactly."""
import numpy as np
import pytest

from popplay.games.knights import rules as game
from popplay.games.knights import engine
from popplay.games.knights.rules import KnightsParams
from popplay.core.backend import Backend
from popplay.games.knights.experiment import KnightsExperiment
from popplay.training.loop import run

NUMBA, TORCH = Backend("numba", "cpu"), Backend("torch", "cpu")
SMALL = KnightsParams(agents=4, games_per_agent=6, episodes=6, eval_every=3, eval_games=10, snapshot_every=2,
                      max_turns=60, seed=3)


def _episodes(params, backend, n, state=None):
    experiment = KnightsExperiment(params, backend)
    state = experiment.initial_state() if state is None else state
    for _ in range(n):
        state = experiment.phase(state, time_left=None)
        experiment.measure(state)
    return experiment, state


def test_an_episode_adds_alpha_times_each_agents_summed_change():
    params = SMALL
    experiment = KnightsExperiment(params, NUMBA)
    state = experiment.initial_state()
    batch = experiment.episode_batch(state)
    assert batch.learn.sum() == params.agents * params.games_per_agent  # one learning side per game
    home = np.where(batch.learn[:, 0], batch.net[:, 0], batch.net[:, 1])
    away = np.where(batch.learn[:, 0], batch.net[:, 1], batch.net[:, 0])
    assert np.array_equal(home, np.repeat(np.arange(4), 6)) and (home != away).all()
    assert batch.learn[::2, 0].all() and batch.learn[1::2, 1].all()  # even game slots: the agent is X
    played = engine.run_batch(state.networks, state.lam, batch, params=params, base=0)
    after = experiment.phase(state, time_left=None)
    expected = game.pack(state.networks) + state.alpha[:, None] * played.delta
    np.testing.assert_array_equal(game.pack(after.networks), expected)
    assert after.episode == 1 and after.turns == played.plies.sum()
    assert ((after.score >= 0) & (after.score <= 1)).all()


def test_opponents_are_drawn_uniformly_from_the_others():
    params = KnightsParams(agents=5, games_per_agent=400)
    experiment = KnightsExperiment(params, NUMBA)
    drawn = experiment.opponents(7)
    assert drawn.shape == (5, 400) and (drawn != np.arange(5)[:, None]).all()
    counts = np.bincount(drawn[0], minlength=5)
    assert counts[0] == 0 and counts[1:].min() > 70
    assert not np.array_equal(drawn, experiment.opponents(8))
    alone = KnightsExperiment(KnightsParams(agents=1, games_per_agent=4), NUMBA)
    assert (alone.opponents(0) == 0).all()


def test_population_learns_to_beat_random_and_greedy_play():
    # a 4x5 board with 3 knights a side learns in about a second
    params = KnightsParams(rows=4, cols=5, pieces=3, max_turns=60, agents=4, games_per_agent=64, episodes=150,
                           alpha=0.1, eval_every=150, eval_games=100, seed=1)
    experiment = KnightsExperiment(params, NUMBA)
    start = experiment.evaluate(experiment.initial_state(), 100)
    result = run(experiment)
    end = experiment.evaluate(result.state, 100)
    assert start["random"].score.mean() < 0.7 and end["random"].score.mean() > 0.85
    assert end["greedy"].score.mean() > start["greedy"].score.mean() + 0.2
    assert result.curve.metrics["random_mean"][-1] == pytest.approx(end["random"].score.mean())
    # Quality is the population's mean agent's (the best agent's is optimistic), with its error.
    assert result.curve.metrics["quality"][-1] == pytest.approx(end["greedy"].score.mean())
    assert result.curve.metrics["quality_se"][-1] == pytest.approx(np.std(end["greedy"].score, ddof=1) / 2)


def test_resume_from_stored_arrays_is_bit_identical():
    experiment, straight = _episodes(SMALL, NUMBA, 6)
    first, half = _episodes(SMALL, NUMBA, 3)
    arrays = {k: np.array(v) for k, v in first.state_arrays(half).items()}
    restored = first.restore(arrays, first.state_counters(half))
    second, resumed = _episodes(SMALL, NUMBA, 3, state=restored)
    for name, value in experiment.state_arrays(straight).items():
        assert np.array_equal(value, second.state_arrays(resumed)[name], equal_nan=True), name
    assert experiment.measure(straight) == second.measure(resumed)
    assert [s.episode for s in resumed.snapshots] == [0, 2, 4, 6]
    assert np.array_equal(resumed.snapshots[1].w1, _episodes(SMALL, NUMBA, 2)[1].w1)


def test_restore_checks_shapes():
    experiment, state = _episodes(SMALL, NUMBA, 1)
    arrays = experiment.state_arrays(state)
    with pytest.raises(ValueError, match="w1"):
        experiment.restore({**arrays, "w1": arrays["w1"][:, :3]}, experiment.state_counters(state))
    with pytest.raises(ValueError, match="alpha"):
        experiment.restore({k: v for k, v in arrays.items() if k != "alpha"}, experiment.state_counters(state))
    with pytest.raises(ValueError, match="snapshot_b1"):
        experiment.restore({**arrays, "snapshot_b1": arrays["snapshot_b1"][:, :2]}, experiment.state_counters(state))


def test_evaluations_follow_the_schedule_and_are_kept_in_the_state():
    experiment = KnightsExperiment(SMALL, NUMBA)
    state = experiment.initial_state()
    seen = []
    for _ in range(5):
        state = experiment.phase(state, time_left=None)
        seen.append(experiment.measure(state)["eval_episode"])
    assert seen == [1, 1, 3, 3, 3]
    assert state.eval_record.shape == (2, 4, 3) and (state.eval_record.sum(axis=2) == 10).all()
    results = experiment.results(state)  # final per-agent evaluation, fresh
    assert set(results) >= {"quality_random", "quality_greedy", "wins_greedy", "score"}
    assert state.eval_episode[0] == 3  # results do not change what later measurements show


def test_non_finite_agents_are_reset():
    experiment, state = _episodes(SMALL, NUMBA, 1)
    state.w1[2, 5, 1] = np.nan
    state.alpha[3] = np.inf
    events = experiment.check_finite(state, phase=1)
    assert len(events) == 2 and "agent 2" in events[0] and "agent 3" in events[1]
    fresh = game.init_networks(SMALL.seed, np.arange(4), SMALL.inputs, SMALL.hidden, SMALL.init_scale)
    assert np.array_equal(state.w1[2], fresh.w1[2]) and state.alpha[3] == SMALL.alpha
    assert np.isfinite(game.pack(state.networks)).all()
    assert experiment.check_finite(state, phase=2) == []


def test_torch_backend_runs_the_same_episodes():
    _, a = _episodes(SMALL, NUMBA, 3)
    _, b = _episodes(SMALL, TORCH, 3)
    assert a.turns == b.turns and np.array_equal(a.score, b.score)
    np.testing.assert_allclose(b.w1, a.w1, rtol=1e-9, atol=1e-12)


def test_per_agent_learning_parameters_are_used():
    experiment = KnightsExperiment(SMALL, NUMBA)
    state = experiment.initial_state()
    state = state._replace(alpha=np.array([0.0, 0.05, 0.05, 0.05]), epsilon=np.array([0.0, 0.0, 1.0, 0.0]))
    after = experiment.phase(state, time_left=None)
    assert np.array_equal(after.w1[0], state.w1[0])  # α = 0: agent 0 does not learn
    assert not np.array_equal(after.w1[1], state.w1[1])
    assert np.array_equal(experiment.episode_batch(state).epsilon,
                          state.epsilon[experiment.episode_batch(state).net])


def test_eval_every_seconds_adds_evaluations_by_learning_time_and_changes_no_learning():
    """With --eval-every-seconds an evaluation is due once that much learning time
    passed since the last, whatever the episode: here (a nanosecond) after every
    episode, where --eval-every 1000 alone evaluates only at the first measurement;
    the weights learned are the same."""
    import dataclasses

    by_episodes = dataclasses.replace(SMALL, eval_every=1000, episodes=4)
    by_time = dataclasses.replace(by_episodes, eval_every_seconds=1e-9)
    plain = run(KnightsExperiment(by_episodes, NUMBA))
    timed_experiment = KnightsExperiment(by_time, NUMBA)
    timed = run(timed_experiment)
    assert plain.curve.metrics["eval_episode"] == [1.0, 1.0, 1.0, 1.0]  # the first measurement's, repeated
    assert timed.curve.metrics["eval_episode"] == [1.0, 2.0, 3.0, 4.0]
    assert timed_experiment.learned_seconds > 0
    for name in ("w1", "b1", "w2", "b2", "alpha", "score"):
        assert np.array_equal(getattr(plain.state, name), getattr(timed.state, name)), name
    assert not np.array_equal(plain.state.eval_record, timed.state.eval_record)


def test_eval_every_seconds_over_ranks_is_refused_in_one_line(cli, tmp_path):
    code, _, err = cli(["train", "knights", "--agents", "4", "--episodes", "2", "--eval-every-seconds", "5",
                        "--nproc", "2", "--out", str(tmp_path / "x.h5")])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--eval-every-seconds" in lines[0], err
    assert not (tmp_path / "x.h5").exists()

"""Deep populations in a two-player game: knights as a gymnasium environment
(``popplay/Knights-v0``), the members' round robin against its one-game-at-a-time
reference, and PBT ranking by tournament Elo (``--rank-by tournament``)."""
from __future__ import annotations

import dataclasses
import json

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from popplay.deep.envs import POPPLAY_KNIGHTS, register
from popplay.deep.envs.knights import KnightsEnv, round_robin_reference
from popplay.deep.topologies.dqn import DQNParams, DQNPopulation
from popplay.games.knights import rules as game
from popplay.tournaments.ratings import elo_ratings
from tests._population_helpers import assert_same_state, run_phases

SMALL_BOARD = dict(rows=4, cols=5, pieces=3, max_turns=30)


def _env(**kwargs) -> KnightsEnv:
    return KnightsEnv(**{**SMALL_BOARD, **kwargs})


def test_the_environment_passes_gymnasiums_checker_and_repeats_its_episodes() -> None:
    register()
    check_env(gymnasium.make(POPPLAY_KNIGHTS).unwrapped, skip_render_check=True)

    def episode(seed: int) -> list:
        env = _env(opponent="greedy")
        obs, info = env.reset(seed=seed)
        seen = [obs.tolist(), info["side"]]
        for step in range(100):
            obs, reward, terminated, truncated, info = env.step((7 * step) % env.action_space.n)
            seen.append((obs.tolist(), reward, terminated, truncated, info["illegal"]))
            if terminated or truncated:
                return seen
        return seen

    assert episode(3) == episode(3) and episode(3) != episode(4)
    sides = {_env().reset(seed=s)[1]["side"] for s in range(20)}
    assert sides == {"X", "O"}
    assert gymnasium.make("popplay/KnightsSearch2-v0").unwrapped.opponent == "search2"
    with pytest.raises(ValueError, match="opponent must be one of"):
        KnightsEnv(opponent="mcts100")


def test_a_legal_action_plays_its_move_and_taking_the_last_piece_wins() -> None:
    env = _env()
    env.reset(seed=0)
    board = np.zeros((4, 5), dtype=np.int8)
    board[0, 0], board[2, 1], board[3, 4] = 1, -1, 1  # X on a1 can take O's last piece on b3
    env.board, env.me, env.plies = board, 1, 0
    jump = int(np.flatnonzero(env.table[0] == 2 * 5 + 1)[0])
    obs, reward, terminated, truncated, info = env.step(0 * env.table.shape[1] + jump)
    assert (reward, terminated, truncated, info["illegal"]) == (1.0, True, False, False)
    assert obs.reshape(2, 4, 5)[1].sum() == 0 and env.board[2, 1] == 1


def test_an_illegal_action_plays_a_random_legal_move_and_says_so() -> None:
    env = _env()
    env.reset(seed=1)
    board = np.zeros((4, 5), dtype=np.int8)
    board[0, 0], board[3, 4] = 1, -1
    env.board, env.me, env.plies = board, 1, 0
    legal = game.legal_moves(board, 1)
    move, illegal = env.resolve(board, 1, env.pass_action, 0.99)  # a pass while moves exist
    assert illegal and move == legal[-1]
    assert env.resolve(board, 1, env.pass_action - 1, 0.0) == (legal[0], True)  # a jump off the board
    with pytest.raises(ValueError, match="action must lie"):
        env.resolve(board, 1, env.pass_action + 1, 0.0)
    _, _, _, _, info = env.step(env.pass_action)
    assert info["illegal"] and int((env.board == 1).sum()) == 1 and env.board[0, 0] == 0


def _capturer(env: KnightsEnv, members: int, strong: int):
    """Greedy policies for the round robin: member ``strong`` takes a piece whenever it
    can (reading the board from its observation); the others always pass (so, illegal
    while they can move, they play at random)."""
    squares = env.params.rows * env.params.cols

    def act(obs: np.ndarray) -> np.ndarray:
        actions = np.full(members, env.pass_action, dtype=np.int64)
        mine, theirs = obs[strong, :squares] > 0, obs[strong, squares:] > 0
        for start in np.flatnonzero(mine):
            for jump, target in enumerate(env.table[start]):
                if target >= 0 and theirs[target]:
                    actions[strong] = start * env.table.shape[1] + jump
                    return actions
        return actions

    return act


def test_the_round_robin_equals_its_one_game_at_a_time_reference_and_ranks_the_stronger_first() -> None:
    env = _env()
    act = _capturer(env, 4, strong=2)
    wins, draws = env.round_robin(act, 4, 4, seed=7, generation=3)
    reference = round_robin_reference(env, act, 4, 4, seed=7, generation=3)
    np.testing.assert_array_equal(wins, reference[0])
    np.testing.assert_array_equal(draws, reference[1])
    games = wins + wins.T + draws
    assert (games[~np.eye(4, dtype=bool)] == 4).all() and np.array_equal(draws, draws.T)
    ratings = elo_ratings(wins, draws)
    assert int(np.argmax(ratings)) == 2 and wins[2].sum() > wins[:, 2].sum()
    again = env.round_robin(act, 4, 4, seed=7, generation=4)  # another generation: other games
    assert not (np.array_equal(again[0], wins) and np.array_equal(again[1], draws))


KNIGHTS = dict(agents=4, env=POPPLAY_KNIGHTS, hidden=(16,), batch_size=8, replay_capacity=200, learning_starts=20,
               phase_steps=20, eval_episodes=1, seed=3, replicate_every=40, replicate_fraction=0.25,
               rank_by="tournament", resample=0.0, hp="lr=loguniform:1e-4:1e-2")


def test_pbt_ranks_by_the_tournament_and_copies_its_winner_over_its_loser(monkeypatch) -> None:
    params = DQNParams(**KNIGHTS)
    experiment = DQNPopulation(params, None)
    state = run_phases(experiment, 1)
    wins = np.zeros((4, 4))
    wins[3, :3] = 2  # member 3 beats everyone, member 1 loses to everyone
    wins[0, 1] = wins[2, 1] = 2
    wins[0, 2] = 1
    wins[2, 0] = 1
    played = []

    def arena(act, members, games, seed, generation, rows=None, gather=None):
        assert rows is None and gather is None  # one process
        actions = act(np.zeros((members, experiment.info.obs_dim), dtype=np.float32))
        played.append((members, games, seed, generation, actions.shape))
        return wins, np.zeros((4, 4))

    monkeypatch.setattr(experiment, "arena", arena)
    before = state.learner.online.matrix.clone()
    parents, children = experiment.replicate(state)
    assert played == [(4, 2, 3, state.member_env_steps, (4,))]
    assert parents.tolist() == [3] and children.tolist() == [1]
    assert torch.equal(state.learner.online.matrix[1], before[3])
    assert torch.equal(state.learner.online.matrix[[0, 2, 3]], before[[0, 2, 3]])


def test_significant_tournament_pbt_needs_ratings_apart_beyond_their_errors(monkeypatch) -> None:
    params = DQNParams(**{**KNIGHTS, "replicate_when": "significant"})
    experiment = DQNPopulation(params, None)
    state = run_phases(experiment, 1)
    close = np.full((4, 4), 1.0) - np.eye(4)  # everyone 1-1 with everyone: no evidence
    monkeypatch.setattr(experiment, "arena", lambda *a, **k: (close, np.zeros((4, 4))))
    assert experiment.replicate(state)[1].size == 0
    clear = np.zeros((4, 4))
    clear[3, :3], clear[0, 1], clear[2, 1] = 60, 60, 60  # 60 games to none: far apart
    monkeypatch.setattr(experiment, "arena", lambda *a, **k: (clear, np.zeros((4, 4))))
    parents, children = experiment.replicate(state)
    assert parents.tolist() == [3] and children.tolist() == [1]


FLAGS = [
    "--agents", "4", "--env", POPPLAY_KNIGHTS, "--hidden", "16", "--batch-size", "8", "--replay", "200",
    "--learning-starts", "20", "--phase-steps", "20", "--eval-episodes", "1", "--replicate-every", "40",
    "--rank-by", "tournament", "--hp", "lr=loguniform:1e-4:1e-2", "--seed", "2"]


def test_a_tournament_ranked_population_resumes_exactly(tmp_path, cli) -> None:
    straight, split = tmp_path / "straight.h5", tmp_path / "split.h5"
    assert cli(["train", "dqn", *FLAGS, "--env-steps", "480", "--out", str(straight)])[0] == 0
    assert cli(["train", "dqn", *FLAGS, "--env-steps", "240", "--out", str(split)])[0] == 0
    code, out, err = cli(["train", "dqn", "--resume", str(split), "--env-steps", "480", "--json"])
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["replications"] == 3
    assert "lineage_event" in assert_same_state(straight, split)


@pytest.mark.parametrize("args, message", [
    (["--env", "CartPole-v1", "--replicate-every", "40", "--rank-by", "tournament"], "not a two-player game"),
    (["--env", POPPLAY_KNIGHTS, "--rank-by", "tournament"], "give --replicate-every too"),
    (["--env", POPPLAY_KNIGHTS, "--replicate-every", "40", "--rank-by", "elo"], "rank-by"),
])
def test_tournament_ranking_that_cannot_work_is_refused_in_one_line(cli, args: list[str], message: str) -> None:
    code, out, err = cli(["train", "dqn", "--agents", "4", "--env-steps", "400", *args])
    assert code == 2, err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_params_refuse_tournament_ranking_for_one_agent() -> None:
    with pytest.raises(ValueError, match="rank_by acts on a population"):
        dataclasses.replace(DQNParams(**KNIGHTS), agents=1, replicate_every=0, hp="").validate()

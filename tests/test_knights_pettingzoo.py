"""Knights as a PettingZoo AEC environment: PettingZoo's own API test, the rules'
moves and results, and a popplay agent as an opponent policy."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")  # an optional extra (in the dev install, so the suite runs this)

from pettingzoo.test import api_test  # noqa: E402

from popplay.games.knights import rules as game  # noqa: E402
from popplay.games.knights.pettingzoo import agent_policy, env, raw_env  # noqa: E402


def test_pettingzoo_api_test_passes() -> None:
    api_test(env(rows=4, cols=5, pieces=2, max_turns=40), num_cycles=200)
    api_test(env(), num_cycles=100)


def test_moves_masks_and_results_follow_the_rules() -> None:
    game_env = raw_env(rows=4, cols=5, pieces=2, max_turns=60)
    game_env.reset(seed=3)
    rng = np.random.default_rng(0)
    finished = None
    for _ in range(60):
        agent = game_env.agent_selection
        if game_env.terminations[agent] or game_env.truncations[agent]:
            finished = dict(game_env.rewards)
            break
        player = 1 if agent == "player_0" else -1
        mask = game_env.observe(agent)["action_mask"]
        legal = game.legal_moves(game_env.board, player)
        assert int(mask[:-1].sum()) == len(legal) and bool(mask[-1]) == (not legal)
        before = game_env.board.copy()
        action = int(rng.choice(np.flatnonzero(mask)))
        game_env.step(action)
        if legal:
            start, jump = divmod(action, game_env.n_jumps)
            assert np.array_equal(game_env.board, game.apply_move(before, (start, game_env.table[start, jump])))
    if finished is not None and any(finished.values()):
        assert sorted(finished.values()) == [-1.0, 1.0]
    game_env.reset(seed=3)
    first = game_env.board.copy()
    game_env.reset(seed=3)
    assert np.array_equal(first, game_env.board)  # reset(seed) repeats the start


def test_a_popplay_agent_plays_through_the_environment() -> None:
    nets = game.init_networks(5, np.arange(1), 2 * 20, 4, 0.5)
    policy = agent_policy(nets.agent(0), cols=5)
    game_env = env(rows=4, cols=5, pieces=2, max_turns=40)
    game_env.reset(seed=1)
    moves = 0
    for agent in game_env.agent_iter():
        observation, reward, termination, truncation, _ = game_env.last()
        if termination or truncation:
            game_env.step(None)
            continue
        if agent == "player_0":
            action = policy(observation)
            assert observation["action_mask"][action] == 1  # always a legal action
            planes = observation["observation"]
            board = (planes[0].astype(np.int8) - planes[1].astype(np.int8))
            expected = game.best_move(nets.agent(0), board, 1)
            if expected is not None:
                assert divmod(action, game_env.unwrapped.n_jumps)[0] == expected[0]
            moves += 1
        else:
            action = int(np.flatnonzero(observation["action_mask"])[0])
        game_env.step(action)
    assert moves > 0

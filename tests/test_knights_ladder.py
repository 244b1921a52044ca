"""The knights ladder: alpha-beta search players against plain minimax and hand-written
positions, noisy bots, the rungs' ratings and their cache, agents' ladder Elo, and
`evaluate --ladder` / `--eval-opponents ladder` for users."""
from __future__ import annotations

import json

import numpy as np
import pytest

from popplay.games.knights import _numba, engine
from popplay.games.knights import rules as game
from popplay.games.knights.opponents import bot_move
from popplay.games.knights.rules import OPPONENTS, KnightsParams
from popplay.tournaments import ladder as ladder_module
from popplay.tournaments.ladder import Ladder, ladder_elo
from tests.reference import knights as reference

TINY = KnightsParams(rows=4, cols=5, pieces=2, max_turns=30)
TABLE = game.geometry(5, 7, "knight").table


def _random_positions(count: int, seed: int, rows: int = 4, cols: int = 5, per_side: int = 3):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        board = np.zeros(rows * cols, dtype=np.int64)
        squares = rng.permutation(rows * cols)[:2 * per_side]
        board[squares[:per_side]] = 1
        board[squares[per_side:]] = -1
        yield board.reshape(rows, cols)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_alpha_beta_picks_the_moves_plain_minimax_rates_best(depth: int) -> None:
    table = game.geometry(4, 5, "knight").table
    compared = 0
    for board in _random_positions(40, seed=depth):
        if not game.legal_moves(board, 1):
            continue
        scores = _numba.depth_search_scores(board.reshape(-1).astype(np.int64), 0, table, depth)
        best = [i for i, s in enumerate(scores) if s == scores.max()]
        assert best == reference.minimax_best_moves(board.tolist(), 1, depth)
        compared += 1
    assert compared > 20


# X to move: O at (1,0), (1,6), (3,0); X at (1,5), (2,3). After X's knight 12 -> 3, every
# O move lands on a square X attacks: O must give up a piece (zugzwang), a capture two
# moves away that only a three-ply search sees.
ZUGZWANG = [[0, 0, 0, 0, 0, 0, 0],
            [-1, 0, 0, 0, 0, 1, -1],
            [0, 0, 0, 1, 0, 0, 0],
            [-1, 0, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0, 0]]
# X to move, no capture anywhere: of X's four moves only 0 -> 15 lands where O cannot take.
ONE_SAFE_SQUARE = [[1, 0, 0, 0, -1, 0, 0],
                   [0, 0, 0, 0, 0, 0, 0],
                   [0, 0, -1, 0, 0, 0, 0],
                   [0, 0, 0, 0, 0, 0, 0],
                   [0, 0, 0, 0, 0, 0, 1]]


def _moves_played(name: str, board) -> set[tuple[int, int]]:
    return {bot_move(name, np.array(board), 1, u) for u in np.linspace(0.0, 0.999, 40)}


def test_three_plies_find_the_forced_capture_that_one_and_two_miss() -> None:
    assert _moves_played("search3", ZUGZWANG) == {(12, 3)}
    # (four plies also see O take back, so search4 rates the quiet moves as equal)
    assert len(_moves_played("search2", ZUGZWANG)) > 1 and len(_moves_played("search1", ZUGZWANG)) > 1
    assert reference.minimax_value(reference.apply_move(ZUGZWANG, (12, 3)), -1, 2) == 0.0  # the piece comes back
    assert reference.minimax_value(ZUGZWANG, 1, 2) == -1.0  # two plies see no gain


def test_two_plies_never_hang_a_piece_that_one_ply_may() -> None:
    assert _moves_played("search2", ONE_SAFE_SQUARE) == {(0, 15)}
    assert _moves_played("search", ONE_SAFE_SQUARE) == {(0, 15)}
    assert _moves_played("search1", ONE_SAFE_SQUARE) == set(game.legal_moves(np.array(ONE_SAFE_SQUARE), 1))


def test_search1_is_greedy_and_search2_is_search_in_the_engine() -> None:
    nets = game.init_networks(1, np.arange(1), TINY.inputs, 2, 0.5)

    def results(a: str, b: str):
        played = engine.play_pairs(nets, [[OPPONENTS[a], OPPONENTS[b]]], 60, params=TINY, seed=3)
        return played.wins[0], played.draws[0], played.losses[0], played.turns

    assert results("search1", "random") == results("greedy", "random")
    assert results("search2", "greedy") == results("search", "greedy")
    assert results("noisy50", "random") != results("greedy", "random")  # the noise is real


def test_search_games_asked_of_the_torch_backend_are_played_by_numba() -> None:
    from popplay.core.backend import Backend

    nets = game.init_networks(1, np.arange(1), TINY.inputs, 2, 0.5)
    pairs = [[0, OPPONENTS["search3"]]]
    on_torch = engine.play_pairs(nets, pairs, 6, params=TINY, backend=Backend("torch", "cpu"))
    assert on_torch == engine.play_pairs(nets, pairs, 6, params=TINY)


# --- ratings ----------------------------------------------------------------------------

RUNGS = Ladder(("random", "greedy"), np.array([0.0, 800.0]), np.array([0.0, 30.0]), 400)


def test_ladder_elo_of_hand_made_results() -> None:
    n = np.array
    even = ladder_elo({"greedy": (n([50, 90, 0]), n([0, 0, 0]), n([50, 10, 100]))}, RUNGS)
    assert abs(even.elo[0] - 800.0) < 1.0  # half the points against an 800 rung: 800
    assert even.elo[1] > even.elo[0] > even.elo[2]
    assert (even.low < even.elo).all() and (even.elo < even.high).all()
    wide = ladder_elo({"greedy": (n([5]), n([0]), n([5]))}, RUNGS)
    assert wide.high[0] - wide.low[0] > even.high[0] - even.low[0]  # fewer games, wider interval
    assert np.isfinite(even.elo).all()  # all wins or all losses: finite, through the virtual draw
    with pytest.raises(ValueError, match="no ladder rung"):
        ladder_elo({"search": (n([1]), n([0]), n([1]))}, RUNGS)


def test_rungs_are_rated_once_and_cached(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(ladder_module, "_MEMORY", {})
    first = ladder_module.ladder(TINY, games=20)
    assert first.names == game.LADDER_RUNGS and first.ratings[0] == 0.0
    assert first.ratings[game.LADDER_RUNGS.index("greedy")] > first.ratings[game.LADDER_RUNGS.index("noisy75")] > 0
    (cached,) = (tmp_path / "popplay").glob("ladder-*.json")
    monkeypatch.setattr(ladder_module, "_MEMORY", {})
    monkeypatch.setattr(ladder_module, "rate_rungs", lambda *a, **k: pytest.fail("rated again"))
    again = ladder_module.ladder(TINY, games=20)
    np.testing.assert_array_equal(again.ratings, first.ratings)
    cached.write_text("{not json")  # a damaged cache is rated again, not trusted
    monkeypatch.setattr(ladder_module, "_MEMORY", {})
    monkeypatch.setattr(ladder_module, "rate_rungs", lambda *a, **k: first._replace(games=-1))
    assert ladder_module.ladder(TINY, games=20).games == -1
    assert json.loads(cached.read_text())["games"] == 20  # and written back whole


# --- for users ----------------------------------------------------------------------------

def test_evaluate_ladder_and_ladder_curves(tmp_path, monkeypatch, cli) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(ladder_module, "RUNG_GAMES", 10)
    monkeypatch.setattr(ladder_module.ladder, "__defaults__", (None, 10, 0, ladder_module.RUNGS))
    run = tmp_path / "run.h5"
    code, out, err = cli(["train", "knights", "--rows", "4", "--cols", "5", "--pieces", "2", "--max-turns", "30",
                          "--agents", "2", "--games-per-agent", "4", "--episodes", "2", "--eval-every", "2",
                          "--eval-games", "4", "--eval-opponents", "ladder", "--out", str(run), "--json"])
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ladder_elo_best"] >= summary["ladder_elo_mean"] >= summary["ladder_elo_worst"]
    code, out, err = cli(["evaluate", str(run), "--ladder", "--games", "6", "--json"])
    assert code == 0, err
    payload = json.loads(out.strip().splitlines()[-1])
    assert [r["name"] for r in payload["ladder"]["rungs"]] == list(game.LADDER_RUNGS)
    assert len(payload["per_agent"]) == 2
    for row in payload["per_agent"]:
        low, high = row["elo_ci95"]
        assert low < row["elo"] < high and set(row["scores"]) == set(game.LADDER_RUNGS)
    assert payload["elo_best"] >= payload["elo_mean"] >= payload["elo_worst"]
    code, out, err = cli(["evaluate", str(run), "--ladder", "--opponent", "greedy"])
    assert code == 2 and "--ladder" in err and "Traceback" not in err
    # a ladder of the user's rungs, a tree search among them: rated on its own scale, random = 0
    code, out, err = cli(["evaluate", str(run), "--ladder", "--rungs", "random,greedy,mcts100", "--games", "4",
                          "--json"])
    assert code == 0, err
    payload = json.loads(out.strip().splitlines()[-1])
    rated = {r["name"]: r["elo"] for r in payload["ladder"]["rungs"]}
    assert list(rated) == ["random", "greedy", "mcts100"] and rated["random"] == 0.0
    assert rated["mcts100"] > rated["random"] and set(payload["per_agent"][0]["scores"]) == set(rated)
    for extra, fragment in ((["--ladder", "--rungs", "random,chess"], "unknown rung 'chess'"),
                            (["--ladder", "--rungs", "greedy,search2"], "random among them"),
                            (["--rungs", "random,greedy"], "add --ladder")):
        code, out, err = cli(["evaluate", str(run), *extra])
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and fragment in lines[0], err


def test_every_benchmark_player_has_a_place_in_the_strength_order() -> None:
    """What training evaluates as its strongest opponent is defined for every player."""
    from popplay.games.knights import opponents

    assert sorted(opponents._STRENGTH) == sorted(game.OPPONENTS)
    assert opponents.strongest(["greedy", "mcts6400", "search2"]) == "mcts6400"

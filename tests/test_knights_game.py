"""The knights game as users meet it: legal moves, moves, winners, encoding, parameters."""
import numpy as np
import pytest

from popplay.games.knights import rules as game
from popplay.games.knights.rules import KnightsParams
from popplay.core import registry
from tests.reference import knights as reference
from popplay.checkpoints.validation import params_from_config

SQUARE = [(1, 0), (-1, 0), (0, 1), (0, -1)]
PATTERNS = [("knight", reference.KNIGHT), ("1,0;-1,0;0,1;0,-1", SQUARE), ("2,2;-1,3;0,-2", [(2, 2), (-1, 3), (0, -2)])]


def _random_board(rng, rows, cols, x, o):
    flat = np.zeros(rows * cols, dtype=np.int8)
    squares = rng.permutation(rows * cols)
    flat[squares[:x]] = 1
    flat[squares[x:x + o]] = -1
    return flat.reshape(rows, cols)


@pytest.mark.parametrize("spec, offsets", PATTERNS)
def test_legal_moves_match_coordinate_arithmetic_on_random_boards(spec, offsets):
    rng = np.random.default_rng(1)
    for _ in range(150):
        rows, cols = rng.integers(1, 8, size=2)
        squares = rows * cols
        x = rng.integers(0, squares + 1)
        o = rng.integers(0, squares - x + 1)
        board = _random_board(rng, rows, cols, x, o)
        for player in (1, -1):
            expected = reference.legal_moves(board.tolist(), player, offsets)
            assert game.legal_moves(board, player, spec) == expected


def test_hand_written_position_moves_captures_and_win():
    board = np.zeros((5, 7), dtype=np.int8)
    board[0, 0] = 1  # a1: a knight in the corner reaches c2 and b3 only
    board[1, 2] = -1  # c2
    board[4, 5] = -1  # f5
    assert game.legal_moves(board, 1) == [(0, 9), (0, 15)]
    assert [game.square_name(s, 7) for s in (0, 9, 15)] == ["a1", "c2", "b3"]
    assert game.legal_moves(board, -1) == [(9, 0), (9, 4), (9, 14), (9, 18), (9, 22), (9, 24),
                                           (33, 18), (33, 20), (33, 24)]
    after = game.apply_move(board, (0, 9))
    assert after[1, 2] == 1 and after[0, 0] == 0 and (after == -1).sum() == 1
    assert board[0, 0] == 1  # the input board is not modified
    assert game.winner(after) == 0
    captured = game.apply_move(game.apply_move(after, (33, 18)), (9, 18))  # O f5-e3, X c2xe3
    assert game.winner(captured) == 1
    assert game.outcome(captured, 3) == 1


@pytest.mark.parametrize("move", [(0, 1), (0, 9 + 35), (5, 9), (9, 0), ("a", 1), (0,)])
def test_illegal_moves_are_refused(move):
    board = np.zeros((5, 7), dtype=np.int8)
    board[0, 0] = 1
    board[1, 2] = 1  # an own piece on c2 blocks a1-c2
    board[4, 4] = -1
    with pytest.raises(ValueError):
        game.apply_move(board, move)


def test_bad_boards_and_players_are_refused():
    with pytest.raises(ValueError, match="2-D"):
        game.legal_moves(np.zeros(35, dtype=np.int8), 1)
    with pytest.raises(ValueError, match="only -1"):
        game.legal_moves(np.full((5, 7), 2), 1)
    with pytest.raises(ValueError, match="player"):
        game.legal_moves(np.zeros((5, 7), dtype=np.int8), 0)


def test_winner_draw_limit_and_pass():
    board = np.zeros((5, 7), dtype=np.int8)
    board[2, 3] = -1
    assert game.winner(board) == -1 and game.outcome(board, 1) == -1
    board[0, 0] = 1
    assert game.winner(board) == 0
    assert game.outcome(board, game.DEFAULT_MAX_TURNS - 1) is None
    assert game.outcome(board, game.DEFAULT_MAX_TURNS) == 0
    assert game.outcome(board, 10, max_turns=10) == 0
    # boxed in by its own pieces: X in the corner of a 2x3 board has no knight move
    tiny = np.array([[1, 1, 0], [0, 0, 1]], dtype=np.int8)
    assert game.legal_moves(tiny, 1) == [] and game.legal_moves(tiny, -1) == []


def test_encode_is_the_movers_plane_then_the_opponents():
    board = np.zeros((5, 7), dtype=np.int8)
    board[0, 1], board[4, 6] = 1, -1
    x = game.encode(board, 1)
    assert x.shape == (70,) and x.sum() == 2 and x[1] == 1 and x[35 + 34] == 1
    o = game.encode(board, -1)
    assert o[34] == 1 and o[35 + 1] == 1
    assert np.array_equal(x, reference.inputs(board.tolist(), 1))


def test_starting_positions_are_random_distinct_squares_like_the_reference():
    keys = game._rng.stream_keys(3, game.TAG_MATCH, np.arange(40))
    seen = set()
    for key in keys:
        board = game.start_position(int(key), 5, 7, 5)
        assert (board == 1).sum() == 5 and (board == -1).sum() == 5
        assert board.tolist() == reference.start_board(int(key), 5, 7, 5)
        seen.add(board.tobytes())
    assert len(seen) == 40
    assert np.array_equal(game.random_board(seed=2, game=1), game.random_board(seed=2, game=1))
    with pytest.raises(ValueError):
        game.random_board(2, 2, 3)


def test_random_play_keeps_the_rules():
    """Contract: moves stay on the board, captures remove exactly one opposing piece,
    counts never grow, players alternate, a side with no pieces has lost."""
    rng = np.random.default_rng(7)
    for g in range(25):
        board = game.random_board(seed=11, game=g)
        player = 1
        for ply in range(game.DEFAULT_MAX_TURNS):
            moves = game.legal_moves(board, player)
            assert all(0 <= a < 35 and 0 <= b < 35 and board.flat[a] == player and board.flat[b] != player
                       for a, b in moves)
            if moves:
                before_own, before_other = (board == player).sum(), (board == -player).sum()
                move = moves[rng.integers(len(moves))]
                captured = board.flat[move[1]] == -player
                board = game.apply_move(board, move)
                assert (board == player).sum() == before_own
                assert (board == -player).sum() == before_other - captured
            if game.winner(board):
                assert game.winner(board) == player
                break
            player = -player


def test_network_value_and_best_move_agree_with_the_reference():
    nets = game.init_networks(5, np.arange(2), 70, 4, 0.8)
    net = nets.agent(1)
    ref = (net.w1.tolist(), net.b1.tolist(), net.w2.tolist(), float(net.b2))
    board = game.random_board(seed=1, game=4)
    for move, v in game.move_values(net, board, -1):
        _, _, expected = reference.forward(ref, reference.inputs(game.apply_move(board, move).tolist(), -1))
        assert v == pytest.approx(expected, rel=1e-12)
    values = [v for _, v in game.move_values(net, board, -1)]
    assert game.best_move(net, board, -1) == game.legal_moves(board, -1)[int(np.argmax(values))]


def test_squares_parse_by_name_or_number():
    assert game.parse_square("a1", 5, 7) == 0 and game.parse_square("g5", 5, 7) == 34
    assert game.parse_square(" 12 ", 5, 7) == 12 and game.parse_square("C2", 5, 7) == 9
    for bad in ("h1", "a6", "35", "", "1a", "aa"):
        with pytest.raises(ValueError):
            game.parse_square(bad, 5, 7)


def test_jump_specs_and_parameters_are_validated():
    assert game.parse_jumps("knight") == game.KNIGHT
    assert game.parse_jumps("1,0; 0,1") == ((1, 0), (0, 1))
    for bad in ("", "1,2,3", "x", "0,0", "1,0;1,0"):
        with pytest.raises(ValueError, match="jumps"):
            game.parse_jumps(bad)
    for field, value in [("pieces", 18), ("rows", 0), ("cols", 27), ("max_turns", 0), ("agents", 0),
                         ("games_per_agent", 0), ("hidden", 0), ("alpha", 0.0), ("lam", 1.5),
                         ("epsilon", -0.1), ("eval_games", 1), ("eval_opponents", "chess"),
                         ("jumps", "nonsense"), ("eval_every", 0)]:
        with pytest.raises(ValueError, match=field):
            KnightsParams(**{field: value}).validate()


def test_params_round_trip_through_a_run_file_config():
    params = KnightsParams(rows=4, cols=6, pieces=3, jumps="1,0;0,1", alpha=0.01, opponents_learn=True,
                           eval_opponents="greedy,search")
    assert params_from_config("knights", {**params.to_dict(), "backend": "numba"}, run_options=False) == params
    assert registry.get("knights").params_type() is KnightsParams

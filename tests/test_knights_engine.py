"""The batched knights engines against the plain-Python reference: games, bots and the
TD(λ) update; determinism and independence from threads and batch layout."""
import dataclasses

import numba
import numpy as np
import pytest

from popplay import rng
from popplay.core.backend import Backend, cuda_available
from popplay.games.knights import _numba as kernels
from popplay.games.knights import engine
from popplay.games.knights import rules as game
from popplay.games.knights.rules import GameBatch, KnightsParams
from tests.reference import knights as reference

NUMBA, TORCH = Backend("numba", "cpu"), Backend("torch", "cpu")
GEOMETRIES = [
    dict(rows=5, cols=7, pieces=5, jumps="knight", offsets=reference.KNIGHT, max_turns=50),
    dict(rows=4, cols=6, pieces=3, jumps="1,0;-1,0;0,1;0,-1;1,1", offsets=[(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1)],
         max_turns=40),
]


def _mixed_batch(n, nets_count, seed, learn_nets=True):
    """Every pairing of network (ε 0.25), random, greedy and search players."""
    g = np.arange(n)
    kind = np.stack([g % 4, (g // 4) % 4], axis=1).astype(np.int64)
    net = np.stack([g % nets_count, (g + 1) % nets_count], axis=1).astype(np.int64)
    learn = (kind == game.KIND_NET) & learn_nets
    keys = rng.stream_keys(seed, 99, g)
    return GameBatch(kind, net, np.full((n, 2), 0.25), learn, keys)


def _net(nets, q):
    net = nets.w1[q].tolist(), nets.b1[q].tolist(), nets.w2[q].tolist(), float(nets.b2[q])
    return net if nets.wm is None else net + (nets.wm[q].tolist(), nets.bm[q].tolist())


# (geometry, units of a second hidden layer): both boards with Bell's one layer, one with two
LAYOUTS = [pytest.param(GEOMETRIES[0], 0, id="knight-5x7"), pytest.param(GEOMETRIES[1], 0, id="custom-4x6"),
           pytest.param(GEOMETRIES[0], 3, id="knight-5x7-two-layers")]


@pytest.mark.parametrize("geo, hidden2", LAYOUTS)
def test_numba_engine_plays_and_learns_like_the_reference(geo, hidden2):
    params = KnightsParams(rows=geo["rows"], cols=geo["cols"], pieces=geo["pieces"], jumps=geo["jumps"],
                           max_turns=geo["max_turns"], hidden2=hidden2)
    inputs = params.inputs
    nets = game.init_networks(3, np.arange(3), inputs, 4, 0.7, hidden2)
    lam = np.array([0.0, 0.6, 1.0])
    batch = _mixed_batch(48, 3, seed=4)
    result, plies, delta = kernels.run_games(nets, lam, batch.kind, batch.net, batch.epsilon, batch.learn, batch.keys,
                                             base=21, jumps=params.geometry.table, pieces=params.pieces,
                                             max_turns=params.max_turns, n_chunks=5)
    outcomes = set()
    for g in range(48):
        players = [(int(batch.kind[g, s]), _net(nets, batch.net[g, s]), 0.25) for s in range(2)]
        r, p, histories = reference.play_game(int(batch.keys[g]), geo["rows"], geo["cols"], geo["pieces"],
                                              geo["max_turns"], players, base=21, offsets=geo["offsets"])
        assert (result[g], plies[g]) == (r, p), g
        outcomes.add(r)
        for s in range(2):
            if batch.learn[g, s]:
                expected = reference.td_lambda_change(players[s][1], histories[s], reference.reward(r, s),
                                                      lam[batch.net[g, s]])
                np.testing.assert_allclose(delta[g, s], expected, rtol=1e-11, atol=1e-14)
    assert outcomes == {-1, 0, 1}  # wins both ways and draws at the limit were checked


@pytest.mark.parametrize("geo, hidden2", LAYOUTS)
def test_the_two_ply_chooser_plays_and_learns_like_the_reference(geo, hidden2):
    """``--lookahead 2``: the numba engine's minimax over V (incremental pre-activations)
    picks the reference's moves (dense products), and learning stays TD(λ) on the
    after-states played."""
    params = KnightsParams(rows=geo["rows"], cols=geo["cols"], pieces=geo["pieces"], jumps=geo["jumps"],
                           max_turns=geo["max_turns"], lookahead=2, hidden2=hidden2)
    nets = game.init_networks(5, np.arange(3), params.inputs, 4, 0.7, hidden2)
    lam = np.array([0.0, 0.6, 1.0])
    batch = _mixed_batch(48, 3, seed=6)
    result, plies, delta = kernels.run_games(nets, lam, batch.kind, batch.net, batch.epsilon, batch.learn, batch.keys,
                                             base=21, jumps=params.geometry.table, pieces=params.pieces,
                                             max_turns=params.max_turns, n_chunks=5, lookahead=2)
    one_ply = kernels.run_games(nets, lam, batch.kind, batch.net, batch.epsilon, batch.learn, batch.keys, base=21,
                                jumps=params.geometry.table, pieces=params.pieces, max_turns=params.max_turns,
                                n_chunks=5)
    assert not np.array_equal(plies, one_ply[1])  # the chooser is really another one
    for g in range(48):
        players = [(int(batch.kind[g, s]), _net(nets, batch.net[g, s]), 0.25) for s in range(2)]
        r, p, histories = reference.play_game(int(batch.keys[g]), geo["rows"], geo["cols"], geo["pieces"],
                                              geo["max_turns"], players, base=21, offsets=geo["offsets"],
                                              lookahead=2)
        assert (result[g], plies[g]) == (r, p), g
        for s in range(2):
            if batch.learn[g, s]:
                expected = reference.td_lambda_change(players[s][1], histories[s], reference.reward(r, s),
                                                      lam[batch.net[g, s]])
                np.testing.assert_allclose(delta[g, s], expected, rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("geo, hidden2", LAYOUTS[1:])
def test_td_leaf_learns_from_the_reference_leaves(geo, hidden2):
    """``--td-leaf``: the numba engine's TD(λ) sums over the two-ply search's leaves
    (1 − V after the opponent's best reply, the after-state with no reply, ends without
    a gradient) equal the reference's, whose leaves are found by dense products; the
    games are those of the two-ply chooser."""
    params = KnightsParams(rows=geo["rows"], cols=geo["cols"], pieces=geo["pieces"], jumps=geo["jumps"],
                           max_turns=geo["max_turns"], lookahead=2, td_leaf=True, hidden2=hidden2)
    nets = game.init_networks(7, np.arange(3), params.inputs, 4, 0.7, hidden2)
    lam = np.array([0.0, 0.6, 1.0])
    batch = _mixed_batch(48, 3, seed=8)
    run = lambda leaf: kernels.run_games(nets, lam, batch.kind, batch.net, batch.epsilon, batch.learn,  # noqa: E731
                                         batch.keys, base=3, jumps=params.geometry.table, pieces=params.pieces,
                                         max_turns=params.max_turns, n_chunks=5, lookahead=2, td_leaf=leaf)
    (result, plies, delta), played = run(True), run(False)
    assert np.array_equal(result, played[0]) and np.array_equal(plies, played[1])  # learning, not playing
    assert not np.allclose(delta[batch.learn], played[2][batch.learn])
    signs = set()
    for g in range(48):
        players = [(int(batch.kind[g, s]), _net(nets, batch.net[g, s]), 0.25) for s in range(2)]
        r, p, histories = reference.play_game(int(batch.keys[g]), geo["rows"], geo["cols"], geo["pieces"],
                                              geo["max_turns"], players, base=3, offsets=geo["offsets"],
                                              lookahead=2, td_leaf=True)
        assert (result[g], plies[g]) == (r, p), g
        for s in range(2):
            if batch.learn[g, s]:
                signs |= {sign for _, sign, _ in histories[s]}
                expected = reference.td_leaf_change(players[s][1], histories[s], reference.reward(r, s),
                                                    lam[batch.net[g, s]])
                np.testing.assert_allclose(delta[g, s], expected, rtol=1e-10, atol=1e-13)
    assert {-1, 0} <= signs  # leaves after a reply, and ends the search saw, were checked


@pytest.mark.parametrize("hidden2", [0, 3])
def test_every_network_chooses_as_deep_as_its_own_plies(hidden2):
    """A bank whose networks look one or two plies deep (``Networks.plies``, what
    --mutate-lookahead varies): each side of each game chooses, and with TD-Leaf
    learns, at its own network's depth, as the reference does with per-side depths; the
    torch engine plays the same games with the same sums."""
    geo = GEOMETRIES[1]
    params = KnightsParams(rows=geo["rows"], cols=geo["cols"], pieces=geo["pieces"], jumps=geo["jumps"],
                           max_turns=geo["max_turns"], lookahead=2, td_leaf=True, hidden2=hidden2)
    nets = game.init_networks(7, np.arange(3), params.inputs, 4, 0.7, hidden2).choosing([2, 1, 2])
    lam = np.array([0.0, 0.6, 1.0])
    batch = _mixed_batch(48, 3, seed=8)
    batch = batch._replace(kind=np.where(batch.kind == game.KIND_SEARCH, game.KIND_NET, batch.kind))
    played = engine.run_batch(nets, lam, batch, params=params, base=3, backend=NUMBA, summed=False)
    learn = engine.learning_sides(batch)
    depths = nets.plies[batch.net]
    networks = batch.kind == game.KIND_NET
    assert (networks & (depths == 1)).any() and (networks & (depths == 2)).any()
    for g in range(48):
        players = [(int(batch.kind[g, s]), _net(nets, batch.net[g, s]), 0.25) for s in range(2)]
        r, p, histories = reference.play_game(int(batch.keys[g]), geo["rows"], geo["cols"], geo["pieces"],
                                              geo["max_turns"], players, base=3, offsets=geo["offsets"],
                                              lookahead=tuple(int(d) for d in depths[g]), td_leaf=True)
        assert (played.result[g], played.plies[g]) == (r, p), g
        for s in range(2):
            if learn[g, s]:
                change = reference.td_leaf_change if depths[g, s] == 2 else reference.td_lambda_change
                expected = change(players[s][1], histories[s], reference.reward(r, s), lam[batch.net[g, s]])
                np.testing.assert_allclose(played.delta[g, s], expected, rtol=1e-10, atol=1e-13)
    summed = engine.run_batch(nets, lam, batch, params=params, base=3, backend=NUMBA)
    on_torch = engine.run_batch(nets, lam, batch, params=params, base=3, backend=TORCH)
    assert np.array_equal(on_torch.result, summed.result) and np.array_equal(on_torch.plies, summed.plies)
    np.testing.assert_allclose(on_torch.delta, summed.delta, rtol=1e-9, atol=1e-12)
    uniform = engine.run_batch(nets.choosing(2), lam, batch, params=params, base=3, backend=NUMBA)
    assert not np.array_equal(uniform.plies, summed.plies)  # the depths really differ


def test_the_two_ply_chooser_takes_a_win_and_avoids_a_loss_on_hand_made_boards():
    """Replayed positions: X takes O's last piece when it can, whatever V says; and X
    does not step where O's reply takes X's last piece."""
    params = KnightsParams(rows=4, cols=4, pieces=1, max_turns=10, lookahead=2)
    nets = game.init_networks(1, np.arange(1), params.inputs, 3, 0.5)
    net = _net(nets, 0)
    offsets = reference.KNIGHT
    win = [[1, 0, 0, 0], [0, 0, 0, 0], [0, -1, 0, 0], [0, 0, 0, 0]]  # X a1 (row 0) takes O at (2, 1)
    index, moves = reference.choose(reference.NET, net, 0.0, win, 1, 0, offsets, lookahead=2)
    assert moves[index] == (0, 9)
    board = np.array(win, dtype=np.int8).reshape(-1)
    picked = kernels.lookahead_choice(nets.w1[0], nets.b1[0], nets.w2[0], float(nets.b2[0]), board, 0,
                                                params.geometry.table)
    assert picked == index
    # X on (0, 0), O on (3, 3): X's moves (1, 2) and (2, 1) are both attacked by no O
    # knight jump except where O can reach; pick a board where one move walks into a capture.
    trap = [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, -1]]
    index, moves = reference.choose(reference.NET, net, 0.0, trap, 1, 0, offsets, lookahead=2)
    after = reference.apply_move(trap, moves[index])
    assert all(reference.count(reference.apply_move(after, r), 1) == 1
               for r in reference.legal_moves(after, -1, offsets))
    board = np.array(trap, dtype=np.int8).reshape(-1)
    assert kernels.lookahead_choice(nets.w1[0], nets.b1[0], nets.w2[0], float(nets.b2[0]), board, 0,
                                    params.geometry.table) == index


@pytest.mark.parametrize("geo", GEOMETRIES, ids=["knight-5x7", "custom-4x6"])
def test_the_tree_search_plays_like_the_reference(geo):
    """``mcts<N>``: the kernel's UCT (arrays, an explicit path) picks the plain-Python
    reference's moves (dicts), against networks, random and greedy players, up to the
    turn limit; and a single board asked of ``mcts_choice`` gives the same move."""
    params = KnightsParams(rows=geo["rows"], cols=geo["cols"], pieces=geo["pieces"], jumps=geo["jumps"],
                           max_turns=40)
    nets = game.init_networks(2, np.arange(2), params.inputs, 3, 0.7)
    g = np.arange(6)
    mcts = game.KIND_MCTS_BASE + 12
    others = np.array([game.KIND_NET, game.KIND_RANDOM, game.KIND_GREEDY])[g % 3]
    kind = np.where((g % 2 == 0)[:, None], np.stack([np.full(6, mcts), others], 1),
                    np.stack([others, np.full(6, mcts)], 1))
    batch = GameBatch(kind.astype(np.int64), np.zeros((6, 2), dtype=np.int64), np.full((6, 2), 0.2),
                      np.zeros((6, 2), dtype=bool), rng.stream_keys(3, 99, g))
    result, plies, _ = kernels.run_games(nets, np.zeros(2), batch.kind, batch.net, batch.epsilon, batch.learn,
                                         batch.keys, base=0, jumps=params.geometry.table, pieces=params.pieces,
                                         max_turns=params.max_turns, n_chunks=3)
    for i in g:
        players = [(int(batch.kind[i, s]), _net(nets, 0), 0.2) for s in range(2)]
        assert (result[i], plies[i]) == reference.play_game(int(batch.keys[i]), geo["rows"], geo["cols"], geo["pieces"],
                                                            params.max_turns, players, offsets=geo["offsets"])[:2], i
    assert (result != 0).any()  # won games were checked (on 5 x 7, draws at the turn limit too)
    board = game.start_position(5, geo["rows"], geo["cols"], geo["pieces"])
    index, _ = reference.mcts_choice(board.tolist(), 1, 12345, 30, 20, geo["offsets"])
    assert kernels.mcts_choice(board.reshape(-1).astype(np.int64), 0, params.geometry.table, 30, 12345, 20) == index


def test_the_tree_search_takes_a_win_and_beats_greedy():
    """mcts400 takes O's last piece when it can, and wins most games against greedy."""
    params = KnightsParams(rows=4, cols=4, pieces=1)
    win = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [0, -1, 0, 0], [0, 0, 0, 0]]).reshape(-1)
    moves = game.legal_moves(win.reshape(4, 4), 1, "knight")
    for word in range(5):
        assert moves[kernels.mcts_choice(win, 0, params.geometry.table, 400, word, 50)] == (0, 9)
    nets = game.init_networks(0, np.arange(1), KnightsParams().inputs, 1, 0.0)
    played = engine.play_pairs(nets, np.array([[game.OPPONENTS["mcts400"], game.OPPONENTS["greedy"]]]), 20, seed=1)
    assert played.wins[0] >= 14, (played.wins, played.draws, played.losses)


@pytest.mark.parametrize("hidden2", [0, 3])
def test_an_agent_plays_single_boards_as_the_engine_does(hidden2):
    """``opponents.agent_move`` (``popplay play``, the PettingZoo policy): one ply, the
    after-state of highest V; two plies, the reference's minimax over V."""
    from popplay.games.knights.opponents import agent_move

    params = KnightsParams(hidden2=hidden2)
    nets = game.init_networks(4, np.arange(1), params.inputs, 4, 0.8, hidden2)
    net = _net(nets, 0)
    for key in range(6):
        board = game.start_position(key, 5, 7, 5)
        for player in (1, -1):
            moves = game.legal_moves(board, player)
            for lookahead in (1, 2):
                index, _ = reference.choose(reference.NET, net, 0.0, board.tolist(), player, 0, reference.KNIGHT,
                                            lookahead=lookahead)
                assert agent_move(nets.agent(0), board, player, "knight", lookahead) == moves[index]


def test_benchmark_bots_play_like_the_opponents_module():
    """The kernels' random/greedy/search choices are the single-board bot rules."""
    from popplay.games.knights.opponents import bot_move

    keys = rng.stream_keys(8, 99, np.arange(30))
    for name, kind in (("random", game.KIND_RANDOM), ("greedy", game.KIND_GREEDY), ("search", game.KIND_SEARCH)):
        for key in keys[:10]:
            board = game.start_position(int(key), 5, 7, 5)
            for ply in range(12):  # replay a bot-vs-bot game ply by ply with the same words
                player = 1 - 2 * (ply % 2)
                word = reference.RNG.draw(int(key), reference.RNG.mix_counter(10 + ply))
                index, moves = reference.choose(kind, None, 0.0, board.tolist(), player, word, reference.KNIGHT)
                move = bot_move(name, board, player, (word & 0xFFFFFFFF) / 2.0**32)
                assert move == (moves[index] if moves else None)
                if move is None:
                    continue
                board = game.apply_move(board, move)
                if game.winner(board):
                    break


def _agreement_games(params: KnightsParams, hidden2: int = 0):
    """90 games of four networks, greedy and random players among them, learning on
    some sides: what the torch engine is checked against numba with."""
    nets = game.init_networks(1, np.arange(4), params.inputs, 5, 0.6, hidden2)
    g = np.arange(90)
    kind = np.stack([np.where(g % 5 == 0, game.KIND_GREEDY, game.KIND_NET),
                     np.where(g % 7 == 0, game.KIND_RANDOM, 0)], 1)
    batch = GameBatch(kind.astype(np.int64), np.stack([g % 4, (g + 1 + g // 4) % 4], 1).astype(np.int64),
                      np.full((90, 2), 0.2), np.stack([g % 2 == 0, g % 3 == 0], 1), rng.stream_keys(2, 99, g))
    return nets, batch, np.array([0.3, 0.5, 0.7, 0.9])


@pytest.mark.parametrize("lookahead, hidden2, td_leaf", [(1, 0, False), (2, 0, False), (1, 3, False),
                                                       (2, 3, True)])
def test_torch_engine_agrees_with_numba(lookahead, hidden2, td_leaf, monkeypatch):
    """The same games and TD(λ) sums; with ``lookahead=2`` the torch engine's batched
    minimax over V (all replies of all moves at once) picks the numba engine's moves;
    with ``hidden2`` both engines evaluate and learn a second hidden layer; with
    ``td_leaf`` both learn from the same leaves."""
    params = KnightsParams(max_turns=60, lookahead=lookahead, hidden2=hidden2, td_leaf=td_leaf)
    nets, batch, lam = _agreement_games(params, hidden2)
    a = engine.run_batch(nets, lam, batch, params=params, base=5, backend=NUMBA)
    b = engine.run_batch(nets, lam, batch, params=params, base=5, backend=TORCH)
    assert np.array_equal(a.result, b.result) and np.array_equal(a.plies, b.plies)
    np.testing.assert_allclose(b.delta, a.delta, rtol=1e-9, atol=1e-12)
    if lookahead == 2:  # the chooser is really another one, on both engines
        one_ply = engine.run_batch(nets, lam, batch, params=dataclasses.replace(params, lookahead=1, td_leaf=False),
                                   base=5, backend=TORCH)
        assert not np.array_equal(one_ply.plies, b.plies)
        from popplay.games.knights import _torch

        monkeypatch.setattr(_torch, "LOOKAHEAD_ELEMENTS", 40 * 40 * 5 * 7)  # blocks of 7 games: the same
        blocks = engine.run_batch(nets, lam, batch, params=params, base=5, backend=TORCH)
        assert np.array_equal(blocks.plies, b.plies) and np.array_equal(blocks.delta, b.delta)


def test_torch_moves_by_factored_exponentials_and_one_each_play_numbas_games(monkeypatch):
    """Both ways of evaluating the moves (a product of per-piece and per-move
    exponentials, or an exponential per move where the weights are too large for the
    product) play the numba engine's games with its sums, and each really ran."""
    from popplay.games.knights import _torch

    params = KnightsParams(max_turns=60)
    nets, batch, lam = _agreement_games(params)
    on_numba = engine.run_batch(nets, lam, batch, params=params, base=5, backend=NUMBA)
    taken = []
    columns = _torch.TorchKnightsEngine._move_columns

    def spy(self, w1p, factored):
        taken.append(factored)
        return columns(self, w1p, factored)

    monkeypatch.setattr(_torch.TorchKnightsEngine, "_move_columns", spy)
    factored = engine.run_batch(nets, lam, batch, params=params, base=5, backend=TORCH)
    monkeypatch.setattr(_torch, "_factors_fit", lambda *args: False)
    direct = engine.run_batch(nets, lam, batch, params=params, base=5, backend=TORCH)
    assert taken == [True, False]
    for run in (factored, direct):
        assert np.array_equal(run.result, on_numba.result) and np.array_equal(run.plies, on_numba.plies)
        np.testing.assert_allclose(run.delta, on_numba.delta, rtol=1e-9, atol=1e-12)


def test_factored_move_values_stay_finite_and_exact_up_to_the_bound():
    """Weights just inside the bound: every factor near the edge of float64, and the
    moves' output pre-activations still those of one exponential per move."""
    import torch

    from popplay.games.knights import _torch

    params = KnightsParams()
    table = params.geometry.table
    k, hidden, n = params.pieces, 4, 300
    torch_engine = _torch.TorchKnightsEngine(jumps=table, pieces=k, max_turns=10, device="cpu")
    gen = np.random.default_rng(3)
    w1 = gen.choice([-55.0, 55.0], size=(2, params.inputs, hidden)) * gen.uniform(0.9, 1.0, (2, params.inputs, hidden))
    nets = game.Networks(w1=w1, b1=np.full((2, hidden), 40.0), w2=gen.normal(size=(2, hidden)), b2=np.zeros(2))
    assert _torch._factors_fit(nets, 2 * k, torch.float64)  # 40 + 12 · 55 = 700 < 707.4
    assert not _torch._factors_fit(nets._replace(w1=w1 * 1.02), 2 * k, torch.float64)
    assert not _torch._factors_fit(nets, 2 * k, torch.float32)  # float32's normal range ends at e^±87
    w1p = torch.cat([torch.as_tensor(w1), torch.zeros(2, 1, hidden, dtype=torch.float64)], dim=1)
    squares = torch.as_tensor(np.stack([gen.permutation(table.shape[0] - 1)[:2 * k] for _ in range(n)]))
    own, opp = squares[:, :k].sort(dim=1).values, squares[:, k:].sort(dim=1).values
    q = torch.as_tensor(gen.integers(0, 2, n))
    rows = params.inputs + 1
    z0 = torch_engine._preactivation(w1p.reshape(-1, hidden), torch.as_tensor(nets.b1), q, own, opp, rows)
    capture = torch.as_tensor(gen.random((n, k * table.shape[1])) < 0.3)
    middle = torch.zeros(2, hidden, 0, dtype=torch.float64), torch.zeros(2, 0, dtype=torch.float64)
    values = []
    for factored in (True, False):
        tables = [None, None, torch.as_tensor(nets.w2), torch.as_tensor(nets.b2)] + [None] * 6 + list(middle)
        tables += [None, torch_engine._move_columns(w1p, factored)]
        values.append(_torch._move_outputs(z0, q, own, capture, tuple(tables)))
    assert torch.isfinite(values[0]).all()
    assert (values[0] != values[1]).any()  # really two computations ...
    torch.testing.assert_close(values[0], values[1], rtol=1e-13, atol=1e-13)  # ... of the same values


def test_torch_td_in_chunks_of_plies_sums_what_one_chunk_sums(monkeypatch):
    from popplay.games.knights import _torch

    params = KnightsParams(max_turns=60)
    nets, batch, lam = _agreement_games(params)
    whole = engine.run_batch(nets, lam, batch, params=params, base=5, backend=TORCH)
    monkeypatch.setattr(_torch, "TD_CHUNK_ELEMENTS", 90 * 10 * 3)  # 3 plies a chunk
    chunks = engine.run_batch(nets, lam, batch, params=params, base=5, backend=TORCH)
    assert np.array_equal(chunks.result, whole.result) and np.array_equal(chunks.plies, whole.plies)
    np.testing.assert_allclose(chunks.delta, whole.delta, rtol=1e-12, atol=1e-15)
    assert np.abs(whole.delta).max() > 1e-3  # there was something to sum


def test_float32_torch_engine_plays_the_same_games_within_float32_rounding():
    params = KnightsParams(max_turns=60)
    nets = game.init_networks(1, np.arange(4), params.inputs, 5, 0.6)
    batch = _mixed_batch(120, 4, seed=4)
    batch = batch._replace(kind=np.where(batch.kind == game.KIND_SEARCH, game.KIND_NET, batch.kind))
    lam = np.array([0.3, 0.5, 0.7, 0.9])
    a = engine.run_batch(nets, lam, batch, params=params, base=7, backend=TORCH)
    b = engine.run_batch(nets, lam, batch, params=dataclasses.replace(params, dtype="float32"), base=7, backend=TORCH)
    assert b.delta.dtype == np.float32 and a.delta.dtype == np.float64  # really computed in float32
    same = (a.result == b.result) & (a.plies == b.plies)
    assert same.mean() > 0.9  # a near-tie between after-states may flip
    if same.all():
        np.testing.assert_allclose(b.delta, a.delta, rtol=1e-3, atol=1e-5)
    assert not np.array_equal(b.delta.astype(np.float64), a.delta)


def test_float32_on_the_numba_engine_is_refused_in_one_line(cli):
    code, out, err = cli(["train", "knights", "--backend", "numba", "--dtype", "float32", "--agents", "2",
                          "--games-per-agent", "2", "--episodes", "1"])
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == (
        "Error: this run computes in float32 (--dtype), which only the torch engine does: give --backend torch "
        "(auto picks numba where there is no GPU); the numba engine computes in float64")


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU")
def test_torch_engine_on_cuda_agrees_with_numba():
    params = KnightsParams(max_turns=60)
    nets = game.init_networks(1, np.arange(4), params.inputs, 4, 0.6)
    batch = _mixed_batch(64, 4, seed=3)
    batch = batch._replace(kind=np.where(batch.kind == game.KIND_SEARCH, game.KIND_NET, batch.kind))
    a = engine.run_batch(nets, np.full(4, 0.7), batch, params=params, base=0, backend=NUMBA)
    b = engine.run_batch(nets, np.full(4, 0.7), batch, params=params, base=0, backend=Backend("torch", "cuda"))
    same = (a.result == b.result) & (a.plies == b.plies)
    assert same.mean() > 0.9  # CUDA's exp may flip a near-tie now and then
    if same.all():
        np.testing.assert_allclose(b.delta, a.delta, rtol=1e-6, atol=1e-9)


def test_results_depend_only_on_each_games_stream_not_threads_or_batching():
    params = KnightsParams()
    nets = game.init_networks(6, np.arange(3), params.inputs, 4, 0.5)
    batch = _mixed_batch(200, 3, seed=9)
    full = engine.run_batch(nets, np.full(3, 0.7), batch, params=params, base=0)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = engine.run_batch(nets, np.full(3, 0.7), batch, params=params, base=0)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(full.result, single.result) and np.array_equal(full.delta, single.delta)
    part = GameBatch(*(x[50:120] for x in batch))
    some = kernels.run_games(nets, np.full(3, 0.7), part.kind, part.net, part.epsilon, part.learn, part.keys,
                             base=0, jumps=params.geometry.table, pieces=5, max_turns=100, n_chunks=3)
    assert np.array_equal(some[0], full.result[50:120]) and np.array_equal(some[1], full.plies[50:120])
    other = engine.run_batch(nets, np.full(3, 0.7), batch, params=params, base=params.max_turns + 10)
    assert not np.array_equal(other.plies, full.plies)  # another counter base: other games


def test_learning_sums_are_added_per_network_in_order():
    delta = np.random.default_rng(0).normal(size=(6, 2, 3))
    net = np.array([[0, 1], [1, 2], [2, 0], [0, 0], [1, 1], [2, 2]])
    learn = np.array([[1, 0], [1, 1], [0, 1], [1, 1], [0, 0], [1, 0]], dtype=bool)
    got = kernels.sum_by_network(delta, net, learn, 4)
    for q in range(4):
        expected = sum((delta[g, s] for g in range(6) for s in range(2) if learn[g, s] and net[g, s] == q),
                       np.zeros(3))
        assert np.array_equal(got[q], expected)


def test_no_legal_moves_means_passing_until_the_turn_limit():
    # on a 2x2 board no knight move exists: every game is a draw after max_turns passes
    params = KnightsParams(rows=2, cols=2, pieces=1, max_turns=7)
    nets = game.init_networks(0, np.arange(1), params.inputs, 2, 0.1)
    got = engine.play_pairs(nets, [[0, -1], [-2, -3]], 4, params=params)
    assert got.draws.tolist() == [4, 4] and got.turns == 8 * 7


def test_play_pairs_counts_and_bot_strengths():
    params = KnightsParams()
    nets = game.init_networks(0, np.arange(2), params.inputs, 4, 0.1)
    pairs = [[-2, -1], [-1, -2], [-3, -2], [-1, -1], [0, 1]]
    got = engine.play_pairs(nets, pairs, 60, params=params, seed=3)
    assert np.array_equal(got.wins + got.draws + got.losses, np.full(5, 60))
    assert got.score[0] >= 0.95 and got.score[1] <= 0.05  # greedy crushes random
    assert got.score[2] >= 0.9  # the two-ply search beats greedy
    assert 0.3 <= got.score[3] <= 0.7
    assert got.turns > 0
    again = engine.play_pairs(nets, pairs, 60, params=params, seed=3)
    assert np.array_equal(again.wins, got.wins) and np.array_equal(again.draws, got.draws)
    with pytest.raises(ValueError, match="player codes"):
        engine.play_pairs(nets, [[0, 2]], 2, params=params)
    with pytest.raises(ValueError, match="games"):
        engine.play_pairs(nets, [[0, 1]], 0, params=params)


def test_quality_uses_common_positions_and_splits_first_moves():
    from popplay.games.knights.opponents import quality

    params = KnightsParams()
    nets = game.init_networks(0, np.arange(3), params.inputs, 4, 0.1)
    nets = game.Networks(**{name: np.concatenate([x, x[:1]]) for name, x in nets.arrays().items()})  # 3 = 0
    q = quality(nets, "random", 40, params=params)
    assert np.array_equal(q.wins + q.draws + q.losses, np.full(4, 40))
    assert q.wins[3] == q.wins[0] and q.draws[3] == q.draws[0]  # same games for every agent
    assert q.summary()["best"] == q.score.max()
    with pytest.raises(ValueError, match="even"):
        quality(nets, "random", 3, params=params)
    with pytest.raises(ValueError, match="opponent"):
        quality(nets, "chess", 4, params=params)


def test_the_torch_engines_counting_sort_is_sort():
    """The ply re-sorts a side's pieces by counting (it fuses when compiled); captured
    pieces tie on the dump square."""
    import torch

    from popplay.games.knights._torch import _sorted_rows

    rows = torch.as_tensor(np.random.default_rng(5).integers(0, 37, size=(3000, 5)))
    rows[::4, 1:3] = 36  # two captured pieces: a tie
    assert torch.equal(_sorted_rows(rows), rows.sort(dim=1).values)
    assert torch.equal(_sorted_rows(rows.view(100, 30, 5)), rows.view(100, 30, 5).sort(dim=-1).values)


def test_the_torch_engines_choosers_pick_what_argmax_picks():
    """The ply finds the best move and the n-th legal move by counting (vector lanes
    when compiled); the slots are argmax's: first maximum, first NaN, 0 for no move."""
    import torch

    from popplay.games.knights._torch import _first_max
    from popplay.xp.th import nth_true as _nth

    rng_ = np.random.default_rng(6)
    values = torch.as_tensor(rng_.integers(0, 4, size=(4000, 40)).astype(np.float64))  # ties
    values[::7] = -torch.inf  # no legal move
    values[3::11, 5] = torch.nan
    values[3::22, 2] = torch.nan
    assert torch.equal(_first_max(values), values.argmax(dim=1))
    mask = torch.as_tensor(rng_.random((4000, 40)) < 0.3)
    mask[::9] = False
    rank = torch.as_tensor(rng_.integers(0, 20, size=4000))  # past the last True too
    expected = [int(np.flatnonzero(row)[r]) if r < row.sum() else 0 for row, r in zip(mask.numpy(), rank.numpy())]
    assert _nth(mask, rank).tolist() == expected

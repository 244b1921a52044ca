"""Slow plain-Python reference of the knights game and its TD(λ) agents (tests only).

Written from the rules as stated, with Python lists, coordinates and floats: legal
moves by direct (row, col) arithmetic (no jump tables), the network by explicit sums,
and TD(λ) in its backward view with dense eligibility traces over every weight
(Tesauro's scheme, weights held fixed during the game). It shares only the random
streams (tested on their own) and the word layout with the package:

* words ``base + i`` for i < 2k place the pieces (partial Fisher–Yates over squares;
  the first k chosen squares are X's, the next k O's);
* word ``base + 2k + ply`` decides ply ``ply``: its high 32 bits the ε test, its low
  32 bits every uniform choice (random move, tie, exploration).
"""
from __future__ import annotations

import math

from popplay.rng import make_rng
from popplay.xp import py

RNG = make_rng(py)
KNIGHT = [(-2, -1), (-2, 1), (-1, -2), (-1, 2), (1, -2), (1, 2), (2, -1), (2, 1)]
NET, RANDOM, GREEDY, SEARCH = 0, 1, 2, 3
MCTS = 1000  # kind MCTS + N: the tree search with N playouts
MCTS_EXPLORATION = 0.35


def legal_moves(board, player, offsets=KNIGHT):
    """Moves (from, to) of ``player`` on a list-of-rows board, ordered by from-square
    then by offset."""
    rows, cols = len(board), len(board[0])
    moves = []
    for r in range(rows):
        for c in range(cols):
            if board[r][c] != player:
                continue
            for dr, dc in offsets:
                rr, cc = r + dr, c + dc
                if 0 <= rr < rows and 0 <= cc < cols and board[rr][cc] != player:
                    moves.append((r * cols + c, rr * cols + cc))
    return moves


def apply_move(board, move):
    cols = len(board[0])
    (fr, fc), (tr, tc) = divmod(move[0], cols), divmod(move[1], cols)
    new = [row[:] for row in board]
    new[tr][tc] = new[fr][fc]
    new[fr][fc] = 0
    return new


def count(board, player):
    return sum(v == player for row in board for v in row)


def start_board(key, rows, cols, k, base=0):
    squares = list(range(rows * cols))
    for i in range(2 * k):
        u = RNG.uniform53(RNG.draw(key, RNG.mix_counter(base + i)))
        j = i + math.floor(u * (len(squares) - i))
        squares[i], squares[j] = squares[j], squares[i]
    board = [[0] * cols for _ in range(rows)]
    for i in range(2 * k):
        r, c = divmod(squares[i], cols)
        board[r][c] = 1 if i < k else -1
    return board


def inputs(board, player):
    """The network input: 1.0 where ``player`` has a piece, then where the other has."""
    flat = [v for row in board for v in row]
    return [1.0 if v == player else 0.0 for v in flat] + [1.0 if v == -player else 0.0 for v in flat]


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _layers(net, x):
    """(first hidden layer, the layer under the output, output pre-activation) of
    ``net`` = (w1, b1, w2, b2) or (w1, b1, w2, b2, wm, bm) with a second hidden layer."""
    w1, b1, w2, b2 = net[:4]
    hidden = []
    for h in range(len(b1)):
        z = b1[h]
        for i, xi in enumerate(x):
            z += xi * w1[i][h]
        hidden.append(sigmoid(z))
    top = hidden
    if len(net) > 4:
        wm, bm = net[4], net[5]
        top = [sigmoid(bm[j] + sum(hidden[h] * wm[h][j] for h in range(len(b1)))) for j in range(len(bm))]
    y = b2 + sum(w2[j] * top[j] for j in range(len(top)))
    return hidden, top, y


def forward(net, x):
    """(first hidden layer's activations, output pre-activation, V) of ``net``."""
    hidden, _, y = _layers(net, x)
    return hidden, y, sigmoid(y)


def gradient(net, x):
    """dV/dθ as (dw1, db1, dw2, db2), or (dw1, db1, dwm, dbm, dw2, db2) with a second
    hidden layer, by the chain rule written out."""
    w1, b1, w2, b2 = net[:4]
    hidden, top, y = _layers(net, x)
    v = sigmoid(y)
    g_out = v * (1.0 - v)
    dw2 = [g_out * a for a in top]
    if len(net) == 4:
        db1 = [g_out * w2[h] * hidden[h] * (1.0 - hidden[h]) for h in range(len(b1))]
        dw1 = [[x[i] * db1[h] for h in range(len(b1))] for i in range(len(x))]
        return dw1, db1, dw2, g_out
    wm = net[4]
    dbm = [g_out * w2[j] * top[j] * (1.0 - top[j]) for j in range(len(top))]
    dwm = [[hidden[h] * dbm[j] for j in range(len(top))] for h in range(len(b1))]
    db1 = [sum(dbm[j] * wm[h][j] for j in range(len(top))) * hidden[h] * (1.0 - hidden[h]) for h in range(len(b1))]
    dw1 = [[x[i] * db1[h] for h in range(len(b1))] for i in range(len(x))]
    return dw1, db1, dwm, dbm, dw2, g_out


def _flat(parts):
    """The package's flat order: w1 (row-major), b1, [wm (row-major), bm,] w2, b2."""
    out = [v for row in parts[0] for v in row] + list(parts[1])
    if len(parts) == 6:
        out += [v for row in parts[2] for v in row] + list(parts[3])
    return out + list(parts[-2]) + [parts[-1]]


def td_lambda_change(net, xs, reward, lam):
    """Σ_t δ_t e_t with e_t = λ e_{t-1} + ∇V(s_t) (backward view, fixed weights), flat.

    ``xs`` are the inputs of the learner's after-states in order; the last one is
    followed by the reward (1 win, 0 loss, 0.5 draw).
    """
    size = len(_flat(gradient(net, xs[0]))) if xs else 0
    trace = [0.0] * size
    change = [0.0] * size
    values = [forward(net, x)[2] for x in xs]
    for t, x in enumerate(xs):
        g = _flat(gradient(net, x))
        trace = [lam * e + gi for e, gi in zip(trace, g)]
        target = values[t + 1] if t + 1 < len(xs) else reward
        delta = target - values[t]
        change = [c + delta * e for c, e in zip(change, trace)]
    return change


def _search_score(board, move, player, offsets):
    after = apply_move(board, move)
    if count(after, -player) == 0:
        return 1000.0
    material = count(after, player) - count(after, -player)
    worst = material
    for reply in legal_moves(after, -player, offsets):
        later = apply_move(after, reply)
        if count(later, player) == 0:
            return -1000.0
        worst = min(worst, count(later, player) - count(later, -player))
    return float(worst)


def lookahead_score(net, board, move, player, offsets):
    """The two-ply chooser's score of ``move`` (None: it takes the last piece, a win):
    1 − the opponent's best after-state value by the same network, −1 where a reply takes
    the mover's last piece, the mover's own V where the opponent has no reply."""
    after = apply_move(board, move)
    if count(after, -player) == 0:
        return None
    replies = legal_moves(after, -player, offsets)
    if not replies:
        return forward(net, inputs(after, player))[2]
    later = [apply_move(after, r) for r in replies]
    if any(count(b, player) == 0 for b in later):
        return -1.0
    return 1.0 - max(forward(net, inputs(b, -player))[2] for b in later)


def _winner(board):
    return -1 if count(board, 1) == 0 else (1 if count(board, -1) == 0 else 0)


def mcts_choice(board, player, word, playouts, plies_left, offsets=KNIGHT):
    """UCT written out with dicts: nodes hold the move into them, visits, the summed
    reward of the player who made that move (win 1, draw ½, loss 0) and their children
    (None until expanded; a pass child where the side to move has no move). A playout
    walks the tree by UCT (unvisited children first, in move order), expands a visited
    leaf, then plays greedy-bot moves drawn from ``word``'s stream to the end or the
    turn limit. Returns the most visited root move (first on ties) and the moves; a
    move that takes the opponent's last piece at once, without searching."""
    moves = legal_moves(board, player, offsets)
    for i, m in enumerate(moves):
        if count(apply_move(board, m), -player) == 0:
            return i, moves
    new = lambda move: {"move": move, "visits": 0, "value": 0.0, "children": None, "over": False}  # noqa: E731
    root = new(None)
    root["children"] = [new(m) for m in moves]
    drawn = 0
    cols = len(board[0])
    for _ in range(playouts):
        b, p, ply, node, path, over = board, player, 0, root, [], False
        while True:
            if node["over"]:
                over = True
                break
            if node["children"] is None:
                node["children"] = [new(m) for m in legal_moves(b, p, offsets)] or [new(None)]
            chosen, best = None, -math.inf
            log_n = math.log(max(node["visits"], 1))
            for child in node["children"]:
                if child["visits"] == 0:
                    chosen = child
                    break
                score = child["value"] / child["visits"] + MCTS_EXPLORATION * math.sqrt(log_n / child["visits"])
                if score > best:
                    best, chosen = score, child
            if chosen["move"] is not None:
                b = apply_move(b, chosen["move"])
            path.append((chosen, p))
            node, p, ply = chosen, -p, ply + 1
            if count(b, 1) == 0 or count(b, -1) == 0 or ply >= plies_left:
                node["over"] = over = True
                break
            if node["visits"] == 0:
                break
        while not over and count(b, 1) and count(b, -1) and ply < plies_left:
            options = legal_moves(b, p, offsets)
            if options:
                u = RNG.uniform53(RNG.draw(word, RNG.mix_counter(drawn)))
                drawn += 1
                pool = [m for m in options if b[m[1] // cols][m[1] % cols] == -p] or options
                b = apply_move(b, pool[math.floor(u * len(pool))])
            p, ply = -p, ply + 1
        winner = _winner(b)
        root["visits"] += 1
        for child, mover in path:
            child["visits"] += 1
            child["value"] += 0.5 if winner == 0 else (1.0 if winner == mover else 0.0)
    visits = [child["visits"] for child in root["children"]]
    return visits.index(max(visits)), moves


def leaf(net, board, move, player, offsets):
    """TD-Leaf's record of ``move``: (inputs, gradient sign, J) where J is the mover's
    estimate at the two-ply search's leaf: 1 − V(the position after the opponent's best
    reply, seen by the opponent) (sign −1); V of the after-state where the opponent has
    no reply (+1); 1 for a win at once and 0 where a reply takes the last piece (no
    inputs, sign 0)."""
    after = apply_move(board, move)
    if count(after, -player) == 0:
        return None, 0, 1.0
    replies = legal_moves(after, -player, offsets)
    if not replies:
        x = inputs(after, player)
        return x, 1, forward(net, x)[2]
    later = [apply_move(after, r) for r in replies]
    if any(count(b, player) == 0 for b in later):
        return None, 0, 0.0
    ys = [forward(net, inputs(b, -player))[1] for b in later]
    x = inputs(later[ys.index(max(ys))], -player)
    return x, -1, 1.0 - forward(net, x)[2]


def td_leaf_change(net, leaves, reward, lam):
    """TD(λ) over TD-Leaf's records (:func:`leaf`): Σ_t δ_t e_t with δ_t = J_{t+1} − J_t
    (the last followed by the reward) and e_t = λ e_{t−1} + sign_t ∇V(x_t), flat."""
    size = len(_flat(gradient(net, [0.0] * len(net[0]))))
    trace = [0.0] * size
    change = [0.0] * size
    for t, (x, sign, value) in enumerate(leaves):
        g = [sign * gi for gi in _flat(gradient(net, x))] if sign else [0.0] * size
        trace = [lam * e + gi for e, gi in zip(trace, g)]
        target = leaves[t + 1][2] if t + 1 < len(leaves) else reward
        change = [c + (target - value) * e for c, e in zip(change, trace)]
    return change


def choose(kind, net, eps, board, player, word, offsets, lookahead=1, plies_left=None):
    """(move index, moves) for one ply of a player of ``kind``."""
    if kind >= MCTS:
        if not legal_moves(board, player, offsets):
            return None, []
        return mcts_choice(board, player, word, kind - MCTS, plies_left, offsets)
    moves = legal_moves(board, player, offsets)
    u = (word & 0xFFFFFFFF) / 2.0**32
    explore = ((word >> 32) & 0xFFFFFFFF) / 2.0**32 < eps
    if not moves:
        return None, moves
    if kind == RANDOM or (kind == NET and explore):
        return math.floor(u * len(moves)), moves
    cols = len(board[0])
    if kind == GREEDY:
        captures = [i for i, m in enumerate(moves) if board[m[1] // cols][m[1] % cols] == -player]
        if captures:
            return captures[math.floor(u * len(captures))], moves
        return math.floor(u * len(moves)), moves
    if kind == SEARCH:
        scores = [_search_score(board, m, player, offsets) for m in moves]
        tied = [i for i, s in enumerate(scores) if s == max(scores)]
        return tied[math.floor(u * len(tied))], moves
    if lookahead == 2:
        best, best_score = 0, -math.inf
        for i, m in enumerate(moves):
            score = lookahead_score(net, board, m, player, offsets)
            if score is None:
                return i, moves  # the first move that wins at once
            if score > best_score:
                best, best_score = i, score
        return best, moves
    values = [forward(net, inputs(apply_move(board, m), player))[1] for m in moves]
    return values.index(max(values)), moves  # first maximum


def play_game(key, rows, cols, k, max_plies, players, base=0, offsets=KNIGHT, lookahead=1, td_leaf=False):
    """One game; ``players`` = [(kind, net, eps)] for X (moves first) and O;
    ``lookahead``: one depth for both sides' networks, or (X's, O's).

    Returns (result: +1 X won, -1 O won, 0 draw; plies; per side the inputs of its
    after-states, in order: with ``td_leaf``, a two-ply network's :func:`leaf` records).
    """
    depths = tuple(lookahead) if isinstance(lookahead, (tuple, list)) else (lookahead, lookahead)
    board = start_board(key, rows, cols, k, base)
    histories = [[], []]
    result, plies = 0, max_plies
    for ply in range(max_plies):
        side = ply % 2
        player = 1 - 2 * side
        word = RNG.draw(key, RNG.mix_counter(base + 2 * k + ply))
        kind, net, eps = players[side]
        index, moves = choose(kind, net, eps, board, player, word, offsets, depths[side], max_plies - ply)
        if index is None:
            continue  # no legal move: the player passes
        leaves = td_leaf and kind == NET and depths[side] == 2
        if leaves:
            histories[side].append(leaf(net, board, moves[index], player, offsets))
        board = apply_move(board, moves[index])
        if not leaves:
            histories[side].append(inputs(board, player))
        if count(board, -player) == 0:
            result, plies = player, ply + 1
            break
    return result, plies, histories


def reward(result, side):
    player = 1 - 2 * side
    return 0.5 if result == 0 else (1.0 if result == player else 0.0)


def minimax_value(board, player, depth, offsets=KNIGHT):
    """Plain minimax (no pruning) on material for ``player`` to move, ``depth`` plies:
    own − opposing pieces at the horizon, −1000 with no pieces left, a pass when
    there is no legal move."""
    if count(board, player) == 0:
        return -1000.0
    if depth == 0:
        return float(count(board, player) - count(board, -player))
    moves = legal_moves(board, player, offsets)
    if not moves:
        return -minimax_value(board, -player, depth - 1, offsets)
    return max(-minimax_value(apply_move(board, m), -player, depth - 1, offsets) for m in moves)


def minimax_best_moves(board, player, depth, offsets=KNIGHT):
    """The indices (in legal-move order) of the moves with the best minimax score."""
    moves = legal_moves(board, player, offsets)
    scores = [-minimax_value(apply_move(board, m), -player, depth - 1, offsets) for m in moves]
    return [i for i, s in enumerate(scores) if s == max(scores)]

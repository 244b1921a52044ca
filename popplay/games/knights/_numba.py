"""Numba kernels of knights (private; see :mod:`popplay.games.knights.rules`).

Weights are fixed for the length of a call, so games are independent: each thread
plays whole games, one after the other, keeping the board, the sorted piece lists and
the learner's history in small scratch arrays (they stay in L1).

Evaluating the after-states of a ply costs H exponentials per move and almost no
arithmetic: a move changes the input planes in two or three places, so its hidden
pre-activations are the current ones minus the from-square column, plus the
to-square column, minus the captured piece's column. Only the output pre-activation
is compared (σ is monotone).

Learning uses the forward view of TD(λ) with weights fixed during the game:
Σ_t δ_t e_t with e_t = Σ_{k≤t} λ^{t−k} ∇V(s_k) equals Σ_k c_k ∇V(s_k) with
c_k = δ_k + λ c_{k+1}, so the game's history (values, hidden activations and the
≤ 2k active inputs of each after-state) is enough and the dense eligibility trace
over every weight is never formed: ∇V touches only the active inputs' rows.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from popplay.games.knights.rules import (
    KIND_DEPTH_BASE,
    KIND_GREEDY,
    KIND_MCTS_BASE,
    KIND_NET,
    KIND_NOISY,
    KIND_RANDOM,
    KIND_SEARCH,
    MAX_SEARCH_DEPTH,
    SEARCH_WIN,
    make_rules,
    parameter_count,
)
from popplay.xp import nb

_rules = make_rules(nb)
_draw = _rules.rng.draw
_mix_counter = _rules.rng.mix_counter
_uniform53 = _rules.rng.uniform53
_sigmoid = _rules.sigmoid
_pick = _rules.pick
_explores = _rules.explores
_choice = _rules.choice
_lambda_return_error = _rules.lambda_return_error
_reward = _rules.reward
MCTS_EXPLORATION = 0.35  # UCT's constant: √2 played worse against the searches (docs/knights.md)


@numba.njit(cache=True)
def mixed_counters(base, n):
    """mix_counter(base + i) for i < n (shared by every game of a call)."""
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        out[i] = _mix_counter(base + i)
    return out


@numba.njit(cache=True)
def _setup(key, mixed, k, squares, perm, board, pieces, counts):
    """The starting position: a partial Fisher-Yates shuffle of the squares."""
    for s in range(squares):
        perm[s] = s
        board[s] = 0
    for i in range(2 * k):
        j = i + _pick(_uniform53(_draw(key, mixed[i])), squares - i)
        tmp = perm[i]
        perm[i] = perm[j]
        perm[j] = tmp
    for side in range(2):
        for p in range(k):
            sq = perm[side * k + p]
            q = p
            while q > 0 and pieces[side, q - 1] > sq:
                pieces[side, q] = pieces[side, q - 1]
                q -= 1
            pieces[side, q] = sq
            board[sq] = 1 - 2 * side
        counts[side] = k


@numba.njit(cache=True)
def _moves(board, pieces, counts, side, jumps, mf, mt, mc):
    """Legal moves of ``side`` in canonical order (from-square, then offset)."""
    mover = 1 - 2 * side
    n_jumps = jumps.shape[1]
    n = 0
    for p in range(counts[side]):
        f = pieces[side, p]
        for j in range(n_jumps):
            t = jumps[f, j]
            if t < 0:
                continue
            v = board[t]
            if v == mover:
                continue
            mf[n] = f
            mt[n] = t
            mc[n] = v != 0
            n += 1
    return n


@numba.njit(cache=True)
def _preactivation(w1, b1, q, pieces, counts, side, squares, z):
    """Hidden pre-activations of network ``q`` for the position seen by ``side``
    (its pieces in the first plane), summed in input order like a dense product."""
    hidden = z.shape[0]
    for h in range(hidden):
        z[h] = b1[q, h]
    for p in range(counts[side]):
        sq = pieces[side, p]
        for h in range(hidden):
            z[h] += w1[q, sq, h]
    other = 1 - side
    for p in range(counts[other]):
        sq = squares + pieces[other, p]
        for h in range(hidden):
            z[h] += w1[q, sq, h]


@numba.njit(cache=True)
def _head(wm, bm, w2, b2, q, a1, s2):
    """Output pre-activation of network q from its first layer's activations ``a1``
    through the second hidden layer (``s2``: scratch of its width, left holding its
    activations)."""
    hidden2 = s2.shape[0]
    for j in range(hidden2):
        s2[j] = bm[q, j]
    for h in range(a1.shape[0]):
        a = a1[h]
        for j in range(hidden2):
            s2[j] += a * wm[q, h, j]
    y = b2[q]
    for j in range(hidden2):
        s2[j] = _sigmoid(s2[j])
        y += w2[q, j] * s2[j]
    return y


@numba.njit(cache=True)
def _net_best(w1, w2, b2, wm, bm, q, z0, zf, a1, s2, mf, mt, mc, n, squares):
    """Index of the move with the highest after-state value (first maximum)."""
    return _net_best_value(w1, w2, b2, wm, bm, q, z0, zf, a1, s2, mf, mt, mc, n, squares)[0]


@numba.njit(cache=True)
def _net_best_value(w1, w2, b2, wm, bm, q, z0, zf, a1, s2, mf, mt, mc, n, squares):
    """(index, output pre-activation) of the move with the highest after-state value
    (first maximum); ``z0``: the mover's pre-activations before the move; ``a1``, ``s2``:
    scratch for a second hidden layer (zero columns in ``wm``: none)."""
    hidden = z0.shape[0]
    two_layers = s2.shape[0] > 0
    best = -np.inf
    best_i = 0
    last_f = -1
    for i in range(n):
        f = mf[i]
        if f != last_f:
            for h in range(hidden):
                zf[h] = z0[h] - w1[q, f, h]
            last_f = f
        t = mt[i]
        if two_layers:
            if mc[i]:
                for h in range(hidden):
                    a1[h] = _sigmoid(zf[h] + w1[q, t, h] - w1[q, squares + t, h])
            else:
                for h in range(hidden):
                    a1[h] = _sigmoid(zf[h] + w1[q, t, h])
            y = _head(wm, bm, w2, b2, q, a1, s2)
        else:
            y = b2[q]
            if mc[i]:
                for h in range(hidden):
                    y += w2[q, h] * _sigmoid(zf[h] + w1[q, t, h] - w1[q, squares + t, h])
            else:
                for h in range(hidden):
                    y += w2[q, h] * _sigmoid(zf[h] + w1[q, t, h])
        if y > best:
            best = y
            best_i = i
    return best_i, best


_REPLY, _WIN, _LOSS, _PASS = 0, 1, 2, 3  # what the two-ply search sees after a move


@numba.njit(cache=True)
def _reply_outcome(board, pieces, counts, side, jumps, rf, rt, rc):
    """(outcome, replies) after ``side``'s move, the opponent's replies in rf, rt, rc:
    _WIN when the move took the opponent's last piece, _LOSS when a reply takes the
    mover's last piece, _PASS when the opponent has no reply, else _REPLY. The end rules
    of the two-ply chooser and of TD-Leaf's leaf, kept in one place so they agree."""
    other = 1 - side
    if counts[other] == 0:
        return _WIN, 0
    m = _moves(board, pieces, counts, other, jumps, rf, rt, rc)
    if counts[side] == 1:
        for j in range(m):
            if rc[j]:
                return _LOSS, m
    return (_PASS if m == 0 else _REPLY), m


@numba.njit(cache=True)
def _lookahead_pick(w1, b1, w2, b2, wm, bm, q, board, pieces, counts, side, jumps, mf, mt, mc, n, squares, scratch):
    """Index of the move whose worst reply is best for ``side`` by network q's values:
    a move that takes the opponent's last piece at once; else the highest of 1 − V of
    the opponent's best after-state (V seen from the opponent: the same network, the
    planes swapped), a reply that takes the mover's last piece counting as a loss (−1)
    and no reply (a pass) as V of the mover's own after-state. First maximum in move
    order, like the one-ply chooser."""
    board2, pieces2, counts2, rf, rt, rc, z0, zf, a1, s2 = scratch
    best = -np.inf
    best_i = 0
    for i in range(n):
        board2[:] = board
        pieces2[:, :] = pieces
        counts2[:] = counts
        _apply(board2, pieces2, counts2, side, mf[i], mt[i], mc[i])
        outcome, m = _reply_outcome(board2, pieces2, counts2, side, jumps, rf, rt, rc)
        if outcome == _WIN:
            return i
        if outcome == _LOSS:
            score = -1.0
        elif outcome == _PASS:
            score = _value(w1, b1, w2, b2, wm, bm, q, pieces2, counts2, side, squares, z0, s2)
        else:
            _preactivation(w1, b1, q, pieces2, counts2, 1 - side, squares, z0)
            score = 1.0 - _sigmoid(_net_best_value(w1, w2, b2, wm, bm, q, z0, zf, a1, s2, rf, rt, rc, m,
                                                   squares)[1])
        if score > best:
            best = score
            best_i = i
    return best_i


@numba.njit(cache=True)
def _value(w1, b1, w2, b2, wm, bm, q, pieces, counts, side, squares, z, s2):
    """V of network q for the position seen by ``side`` (``z`` is overwritten)."""
    _preactivation(w1, b1, q, pieces, counts, side, squares, z)
    if s2.shape[0] > 0:
        for h in range(z.shape[0]):
            z[h] = _sigmoid(z[h])
        return _sigmoid(_head(wm, bm, w2, b2, q, z, s2))
    y = b2[q]
    for h in range(z.shape[0]):
        y += w2[q, h] * _sigmoid(z[h])
    return _sigmoid(y)


@numba.njit(cache=True)
def _lookahead_scratch(squares, k, max_moves, hidden, hidden2):
    """Working arrays of :func:`_lookahead_pick` (one set per thread)."""
    return (np.empty(squares, dtype=np.int8), np.empty((2, k), dtype=np.int64), np.empty(2, dtype=np.int64),
            np.empty(max_moves, dtype=np.int64), np.empty(max_moves, dtype=np.int64),
            np.empty(max_moves, dtype=np.int64), np.empty(hidden), np.empty(hidden), np.empty(hidden),
            np.empty(hidden2))


@numba.njit(cache=True)
def _greedy_pick(mc, n, u):
    captures = 0
    for i in range(n):
        captures += mc[i]
    if captures == 0:
        return _pick(u, n)
    pick = _pick(u, captures)
    for i in range(n):
        if mc[i]:
            if pick == 0:
                return i
            pick -= 1
    return n - 1


@numba.njit(cache=True)
def _search_pick(board, pieces, counts, side, jumps, mf, mt, mc, n, u, scores):
    """Two-ply minimax on material (my move, the opponent's best reply); ties at random."""
    mover = 1 - 2 * side
    other = 1 - side
    n_jumps = jumps.shape[1]
    best = -np.inf
    for i in range(n):
        f = mf[i]
        t = mt[i]
        cap = mc[i]
        if cap and counts[other] == 1:
            score = SEARCH_WIN
        else:
            threat = 0
            for p in range(counts[other]):
                a = pieces[other, p]
                if cap and a == t:
                    continue
                for j in range(n_jumps):
                    b = jumps[a, j]
                    if b >= 0 and (b == t or (board[b] == mover and b != f)):
                        threat = 1
                        break
                if threat:
                    break
            if threat and counts[side] == 1:
                score = -SEARCH_WIN
            else:
                score = float(cap) - float(threat)
        scores[i] = score
        if score > best:
            best = score
    return _tied_pick(scores, n, best, u)


@numba.njit(cache=True)
def _tied_pick(scores, n, best, u):
    """The floor(u · ties)-th, in move order, of the moves scoring ``best``."""
    ties = 0
    for i in range(n):
        if scores[i] == best:
            ties += 1
    pick = _pick(u, ties)
    for i in range(n):
        if scores[i] == best:
            if pick == 0:
                return i
            pick -= 1
    return n - 1


@numba.njit(cache=True)
def _search_stack(squares, k, max_moves):
    """The alpha-beta search's working arrays, one level per ply (root at 0): boards,
    piece lists, piece counts, the moves (from, to, capture) of each level, and the
    loop's state per level (``istate``: side, depth, moves, current move; ``fstate``:
    alpha, beta, best)."""
    levels = MAX_SEARCH_DEPTH + 1
    return (np.empty((levels, squares), dtype=np.int8), np.empty((levels, 2, k), dtype=np.int64),
            np.empty((levels, 2), dtype=np.int64), np.empty((levels, max_moves), dtype=np.int64),
            np.empty((levels, max_moves), dtype=np.int64), np.empty((levels, max_moves), dtype=np.int64),
            np.empty((levels, 4), dtype=np.int64), np.empty((levels, 3)))


@numba.njit(cache=True)
def _copy_level(boards, piece_stack, count_stack, source, target):
    boards[target, :] = boards[source]
    piece_stack[target, :, :] = piece_stack[source]
    count_stack[target, :] = count_stack[source]


@numba.njit(cache=True)
def _negamax(stack, level0, side0, depth0, alpha0, beta0, jumps):
    """Alpha-beta value, for ``side0`` to move, of the position at ``level0`` of the
    stacks, ``depth0`` plies deep: material (own − opposing pieces) at the horizon,
    −SEARCH_WIN for a side with no pieces left; a side without a legal move passes
    (a ply). Children are copied one level down, so no move is ever undone.

    Written as a loop over an explicit stack (numba's cache mishandles recursive
    functions; ``stack``: :func:`_search_stack`)."""
    boards, piece_stack, count_stack, mfs, mts, mcs, istate, fstate = stack
    level = level0
    istate[level, 0], istate[level, 1] = side0, depth0
    fstate[level, 0], fstate[level, 1] = alpha0, beta0
    descending = True
    value = 0.0
    while True:
        if descending:
            side, depth, counts = istate[level, 0], istate[level, 1], count_stack[level]
            if counts[side] == 0:
                value = -SEARCH_WIN
                descending = False
                continue
            if depth == 0:
                value = float(counts[side] - counts[1 - side])
                descending = False
                continue
            n = _moves(boards[level], piece_stack[level], counts, side, jumps, mfs[level], mts[level], mcs[level])
            istate[level, 2], istate[level, 3] = n, 0
            fstate[level, 2] = -np.inf
            child = level + 1
            _copy_level(boards, piece_stack, count_stack, level, child)
            if n > 0:
                _apply(boards[child], piece_stack[child], count_stack[child], side, mfs[level, 0], mts[level, 0],
                       mcs[level, 0])
            istate[child, 0], istate[child, 1] = 1 - side, depth - 1
            fstate[child, 0], fstate[child, 1] = -fstate[level, 1], -fstate[level, 0]
            level = child
            continue
        if level == level0:
            return value
        parent = level - 1
        score = -value
        if score > fstate[parent, 2]:
            fstate[parent, 2] = score
        if fstate[parent, 2] > fstate[parent, 0]:
            fstate[parent, 0] = fstate[parent, 2]
        following = istate[parent, 3] + 1
        if following >= istate[parent, 2] or fstate[parent, 0] >= fstate[parent, 1]:
            value = fstate[parent, 2]  # every move tried (or a pass), or a cut-off
            level = parent
            continue
        istate[parent, 3] = following
        _copy_level(boards, piece_stack, count_stack, parent, level)
        _apply(boards[level], piece_stack[level], count_stack[level], istate[parent, 0], mfs[parent, following],
               mts[parent, following], mcs[parent, following])
        istate[level, 0], istate[level, 1] = 1 - istate[parent, 0], istate[parent, 1] - 1
        fstate[level, 0], fstate[level, 1] = -fstate[parent, 1], -fstate[parent, 0]
        descending = True


@numba.njit(cache=True)
def _depth_pick(board, pieces, counts, side, jumps, mf, mt, mc, n, u, scores, depth, stack):
    """The ``depth``-ply alpha-beta material search's move; equal best scores broken
    by ``u`` in move order."""
    best = _depth_scores(board, pieces, counts, side, jumps, mf, mt, mc, n, scores, depth, stack)
    return _tied_pick(scores, n, best, u)


@numba.njit(cache=True)
def _depth_scores(board, pieces, counts, side, jumps, mf, mt, mc, n, scores, depth, stack):
    """Scores of the ``n`` root moves (exact for the best ones) and the best score.
    Each root move is searched with its window's floor just under the best so far:
    scores are whole numbers, so a move that ties the best is scored exactly and
    every other one falls below it."""
    boards, piece_stack, count_stack = stack[0], stack[1], stack[2]
    boards[0, :] = board
    piece_stack[0, :, :] = pieces
    count_stack[0, :] = counts
    best = -np.inf
    for i in range(n):
        _copy_level(boards, piece_stack, count_stack, 0, 1)
        _apply(boards[1], piece_stack[1], count_stack[1], side, mf[i], mt[i], mc[i])
        floor = best - 0.5
        score = -_negamax(stack, 1, 1 - side, depth - 1, -np.inf, -floor, jumps)
        scores[i] = score
        if score > best:
            best = score
    return best


@numba.njit(cache=True)
def _mcts_tree(nodes, squares, k, max_moves, max_plies):
    """Working arrays of :func:`_mcts_pick` for up to ``nodes`` tree nodes: per node its
    first child (−1: not expanded, −2: the game is over there), child count, the move
    into it (from −1: a pass), visits and summed reward of the player who moved into
    it; the playout's board, pieces and counts; its moves; the path and its movers."""
    return (np.empty(nodes, dtype=np.int64), np.empty(nodes, dtype=np.int64), np.empty(nodes, dtype=np.int64),
            np.empty(nodes, dtype=np.int64), np.empty(nodes, dtype=np.int64), np.empty(nodes),
            np.empty(nodes), np.empty(squares, dtype=np.int8), np.empty((2, k), dtype=np.int64),
            np.empty(2, dtype=np.int64), np.empty(max_moves, dtype=np.int64), np.empty(max_moves, dtype=np.int64),
            np.empty(max_moves, dtype=np.int64), np.empty(max_plies + 2, dtype=np.int64),
            np.empty(max_plies + 2, dtype=np.int64))


@numba.njit(cache=True)
def _mcts_children(tree, node, free, f, t, c, n):
    """Give ``node`` the ``n`` children (moves f, t, c in order; none: one pass child)
    starting at node ``free``; returns the next free node."""
    first, count, move_f, move_t, move_c, visits, value = tree[0], tree[1], tree[2], tree[3], tree[4], tree[5], tree[6]
    first[node] = free
    count[node] = max(n, 1)
    for i in range(max(n, 1)):
        ch = free + i
        first[ch], count[ch], visits[ch], value[ch] = -1, 0, 0.0, 0.0
        if n == 0:
            move_f[ch], move_t[ch], move_c[ch] = -1, -1, 0
        else:
            move_f[ch], move_t[ch], move_c[ch] = f[i], t[i], c[i]
    return free + max(n, 1)


@numba.njit(cache=True)
def _mcts_pick(board, pieces, counts, side, jumps, mf, mt, mc, n, word, playouts, plies_left, tree):
    """Monte-Carlo tree search (UCT, exploration constant √2, rewards win 1, draw ½,
    loss 0) with ``playouts`` playouts from ``side``'s position: the root move visited
    most (the first in move order on ties). Playouts play the greedy bot's rule (a
    random capture if any, else a random move: uniform random playouts mostly reach
    the turn limit on the default board, and a search fed draws plays at random);
    they draw from the ply's ``word`` as a stream key, so the player repeats exactly;
    a game still on after ``plies_left`` plies is a draw, as in the engine. A move
    that takes the opponent's last piece is played at once (the search values a win
    later as much as a win now, and would put it off)."""
    first, count, move_f, move_t, move_c, visits, value, b2, p2, c2, rf, rt, rc, path, movers = tree
    if counts[1 - side] == 1:
        for i in range(n):
            if mc[i]:
                return i
    first[0], count[0], visits[0], value[0] = -1, 0, 0.0, 0.0
    free = _mcts_children(tree, 0, 1, mf, mt, mc, n)
    drawn = 0
    for _ in range(playouts):
        b2[:] = board
        p2[:, :] = pieces
        c2[:] = counts
        node, s, ply, depth = 0, side, 0, 0
        path[0] = 0
        over = False
        while True:
            if first[node] == -2:
                over = True
                break
            if first[node] == -1:  # a visited leaf: expand it, then play out from its first child
                m = _moves(b2, p2, c2, s, jumps, rf, rt, rc)
                free = _mcts_children(tree, node, free, rf, rt, rc, m)
            chosen = first[node]
            best = -np.inf
            log_n = np.log(max(visits[node], 1.0))
            for ch in range(first[node], first[node] + count[node]):
                if visits[ch] == 0.0:
                    chosen = ch
                    break
                score = value[ch] / visits[ch] + MCTS_EXPLORATION * np.sqrt(log_n / visits[ch])
                if score > best:
                    best, chosen = score, ch
            if move_f[chosen] >= 0:
                _apply(b2, p2, c2, s, move_f[chosen], move_t[chosen], move_c[chosen])
            depth += 1
            path[depth], movers[depth] = chosen, s
            node, s, ply = chosen, 1 - s, ply + 1
            if c2[0] == 0 or c2[1] == 0 or ply >= plies_left:
                first[node] = -2
                over = True
                break
            if visits[node] == 0.0:
                break
        while not over:  # the random playout
            if c2[0] == 0 or c2[1] == 0 or ply >= plies_left:
                break
            m = _moves(b2, p2, c2, s, jumps, rf, rt, rc)
            if m > 0:
                i = _greedy_pick(rc, m, _uniform53(_draw(word, _mix_counter(drawn))))
                drawn += 1
                _apply(b2, p2, c2, s, rf[i], rt[i], rc[i])
            s, ply = 1 - s, ply + 1
        winner = -1 if c2[0] == 0 else (1 if c2[1] == 0 else 0)  # +1: X (side 0) won
        visits[0] += 1.0
        for d in range(1, depth + 1):
            mover_sign = 1 - 2 * movers[d]
            visits[path[d]] += 1.0
            value[path[d]] += 0.5 if winner == 0 else (1.0 if winner == mover_sign else 0.0)
    best_i = 0
    for i in range(1, n):
        if visits[1 + i] > visits[1 + best_i]:
            best_i = i
    return best_i


@numba.njit(cache=True)
def mcts_choice(board, side, jumps, playouts, word, plies_left):
    """The move index (in legal-move order) the ``playouts``-playout tree search plays
    for ``side`` on one flat board (+1 X, −1 O), with stream key ``word``; −1 if
    ``side`` has no legal move."""
    flat, pieces, counts, mf, mt, mc, n = _one_board(board, side, jumps)
    if n == 0:
        return -1
    tree = _mcts_tree(1 + n + playouts * max(mf.shape[0], 1), flat.shape[0], pieces.shape[1], mf.shape[0],
                      plies_left)
    return _mcts_pick(flat, pieces, counts, side, jumps, mf, mt, mc, n, word, playouts, plies_left, tree)


@numba.njit(cache=True)
def _one_board(board, side, jumps):
    """One flat board (+1 X, −1 O) as the kernels hold positions, with ``side``'s legal
    moves: (board, pieces, counts, from, to, captures, count)."""
    squares = board.shape[0]
    k = max(1, squares)
    pieces = np.zeros((2, k), dtype=np.int64)
    counts = np.zeros(2, dtype=np.int64)
    for sq in range(squares):  # squares in order: the piece lists come out sorted
        if board[sq] != 0:
            owner = 0 if board[sq] == 1 else 1
            pieces[owner, counts[owner]] = sq
            counts[owner] += 1
    max_moves = k * jumps.shape[1]
    mf = np.empty(max_moves, dtype=np.int64)
    mt = np.empty(max_moves, dtype=np.int64)
    mc = np.empty(max_moves, dtype=np.int64)
    flat = board.astype(np.int8)
    n = _moves(flat, pieces, counts, side, jumps, mf, mt, mc)
    return flat, pieces, counts, mf, mt, mc, n


@numba.njit(cache=True)
def depth_search_scores(board, side, jumps, depth):
    """The root scores of the ``depth``-ply search for ``side`` on one flat board (+1 X,
    −1 O), in legal-move order; only the best ones are exact (see :func:`_depth_scores`)."""
    flat, pieces, counts, mf, mt, mc, n = _one_board(board, side, jumps)
    squares, k, max_moves = flat.shape[0], pieces.shape[1], mf.shape[0]
    scores = np.empty(n)
    _depth_scores(flat, pieces, counts, side, jumps, mf, mt, mc, n, scores, depth,
                  _search_stack(squares, k, max_moves))
    return scores


@numba.njit(cache=True)
def lookahead_choice(w1, b1, w2, b2, board, side, jumps, wm=None, bm=None):
    """The two-ply chooser's move (its index in legal-move order; −1: no legal move) for
    ``side`` on one flat board (+1 X, −1 O), with one network (w1 (inputs, hidden), b1,
    w2, b2, and a second layer wm (hidden, hidden2), bm if given): what the engine plays
    with ``--lookahead 2``, for tests and single boards."""
    hidden = b1.shape[0]
    if wm is None:
        wm, bm = np.zeros((hidden, 0)), np.zeros(0)
    return _lookahead_one(w1, b1, w2, b2, wm, bm, board, side, jumps)


@numba.njit(cache=True)
def _lookahead_one(w1, b1, w2, b2, wm, bm, board, side, jumps):
    flat, pieces, counts, mf, mt, mc, n = _one_board(board, side, jumps)
    squares, k, max_moves = flat.shape[0], pieces.shape[1], mf.shape[0]
    if n == 0:
        return -1
    bank_b2 = np.empty(1)
    bank_b2[0] = b2
    hidden, hidden2 = b1.shape[0], bm.shape[0]
    return _lookahead_pick(w1.reshape(1, w1.shape[0], hidden), b1.reshape(1, hidden),
                           w2.reshape(1, w2.shape[0]), bank_b2, wm.reshape(1, hidden, hidden2),
                           bm.reshape(1, hidden2), 0, flat, pieces, counts, side, jumps, mf, mt, mc, n, squares,
                           _lookahead_scratch(squares, k, max_moves, hidden, hidden2))


@numba.njit(cache=True)
def _apply(board, pieces, counts, side, f, t, cap):
    """Move f -> t for ``side`` (capturing on t if ``cap``); piece lists stay sorted."""
    mover = 1 - 2 * side
    other = 1 - side
    board[f] = 0
    board[t] = mover
    c = counts[side]
    p = 0
    while pieces[side, p] != f:
        p += 1
    while p > 0 and pieces[side, p - 1] > t:
        pieces[side, p] = pieces[side, p - 1]
        p -= 1
    while p < c - 1 and pieces[side, p + 1] < t:
        pieces[side, p] = pieces[side, p + 1]
        p += 1
    pieces[side, p] = t
    if cap:
        c = counts[other]
        p = 0
        while pieces[other, p] != t:
            p += 1
        while p < c - 1:
            pieces[other, p] = pieces[other, p + 1]
            p += 1
        counts[other] = c - 1


@numba.njit(cache=True)
def _record(w1, b1, w2, b2, wm, bm, q, pieces, counts, side, row, squares, z, s2, slot, hist_v, hist_s, hist_h,
            hist_h2, hist_x, hist_n):
    """Store in history ``row`` the position seen by ``side`` (the learner's after-state:
    ``row`` = ``side``): its value V, hidden activations (both layers), active inputs;
    the sign of V's gradient in the learner's estimate is +1."""
    _preactivation(w1, b1, q, pieces, counts, side, squares, z)
    hidden = z.shape[0]
    if s2.shape[0] > 0:
        for h in range(hidden):
            z[h] = _sigmoid(z[h])
            hist_h[row, slot, h] = z[h]
        y = _head(wm, bm, w2, b2, q, z, s2)
        for j in range(s2.shape[0]):
            hist_h2[row, slot, j] = s2[j]
    else:
        y = b2[q]
        for h in range(hidden):
            a = _sigmoid(z[h])
            hist_h[row, slot, h] = a
            y += w2[q, h] * a
    hist_v[row, slot] = _sigmoid(y)
    hist_s[row, slot] = 1.0
    m = 0
    for p in range(counts[side]):
        hist_x[row, slot, m] = pieces[side, p]
        m += 1
    other = 1 - side
    for p in range(counts[other]):
        hist_x[row, slot, m] = squares + pieces[other, p]
        m += 1
    hist_n[row, slot] = m


@numba.njit(cache=True)
def _record_leaf(w1, b1, w2, b2, wm, bm, q, board, pieces, counts, side, jumps, squares, scratch, slot, hist_v,
                 hist_s, hist_h, hist_h2, hist_x, hist_n):
    """TD-Leaf: store, for the learner's move that led to ``board`` (its after-state),
    the leaf of the two-ply search's principal line instead of the after-state: the
    position after the opponent's best reply by the learner's network, valued J = 1 − V
    (V seen from the opponent; gradient sign −1); V of the after-state itself where the
    opponent has no reply (sign +1); and J = 1 (a win) or 0 (a reply takes the last
    piece) without a gradient (sign 0) where the search sees the end."""
    board2, pieces2, counts2, rf, rt, rc, z0, zf, a1, s2 = scratch
    other = 1 - side
    outcome, m = _reply_outcome(board, pieces, counts, side, jumps, rf, rt, rc)
    if outcome == _WIN or outcome == _LOSS:
        hist_v[side, slot], hist_s[side, slot], hist_n[side, slot] = (1.0 if outcome == _WIN else 0.0), 0.0, 0
        return
    if outcome == _PASS:
        _record(w1, b1, w2, b2, wm, bm, q, pieces, counts, side, side, squares, z0, s2, slot, hist_v, hist_s,
                hist_h, hist_h2, hist_x, hist_n)
        return
    _preactivation(w1, b1, q, pieces, counts, other, squares, z0)
    j = _net_best_value(w1, w2, b2, wm, bm, q, z0, zf, a1, s2, rf, rt, rc, m, squares)[0]
    board2[:] = board
    pieces2[:, :] = pieces
    counts2[:] = counts
    _apply(board2, pieces2, counts2, other, rf[j], rt[j], rc[j])
    _record(w1, b1, w2, b2, wm, bm, q, pieces2, counts2, other, side, squares, z0, s2, slot, hist_v, hist_s,
            hist_h, hist_h2, hist_x, hist_n)
    hist_v[side, slot] = 1.0 - hist_v[side, slot]
    hist_s[side, slot] = -1.0


@numba.njit(cache=True)
def _td_accumulate(w2, wm, q, lam, side, steps, result, hist_v, hist_s, hist_h, hist_h2, hist_x, hist_n, g2, out):
    """out = Σ_t c_t ∇J_t over the side's recorded estimates J_t (flat w1, b1, [wm, bm,]
    w2, b2): J_t = V(s_t) of its after-states, or TD-Leaf's leaf values, whose gradient
    is ±∇V or none (``hist_s``: +1, −1, 0; J(1 − J) = V(1 − V) either way); ``g2``:
    scratch of the second layer's width (none: zero)."""
    hidden, hidden2 = hist_h.shape[2], g2.shape[0]
    at_b2 = out.shape[0] - 1
    at_w2 = at_b2 - (hidden2 if hidden2 else hidden)
    at_bm = at_w2 - hidden2
    at_wm = at_bm - hidden * hidden2
    n_w1 = at_wm - hidden
    for i in range(out.shape[0]):
        out[i] = 0.0
    r = _reward(result, 1 - 2 * side)
    c = 0.0
    for t in range(steps - 1, -1, -1):
        v = hist_v[side, t]
        target = r if t == steps - 1 else hist_v[side, t + 1]
        c = _lambda_return_error(c, target, v, lam)
        sign = hist_s[side, t]
        if sign == 0.0:  # an end the search saw: a known value, nothing to differentiate
            continue
        g_out = c * sign * v * (1.0 - v)
        out[at_b2] += g_out
        if hidden2 > 0:
            for j in range(hidden2):
                a2 = hist_h2[side, t, j]
                out[at_w2 + j] += g_out * a2
                g2[j] = g_out * w2[q, j] * a2 * (1.0 - a2)
                out[at_bm + j] += g2[j]
            for h in range(hidden):
                a = hist_h[side, t, h]
                back = 0.0
                for j in range(hidden2):
                    out[at_wm + h * hidden2 + j] += g2[j] * a
                    back += g2[j] * wm[q, h, j]
                g_h = back * a * (1.0 - a)
                out[n_w1 + h] += g_h
                for m in range(hist_n[side, t]):
                    out[hist_x[side, t, m] * hidden + h] += g_h
            continue
        for h in range(hidden):
            a = hist_h[side, t, h]
            out[n_w1 + hidden + h] += g_out * a
            g_h = g_out * w2[q, h] * a * (1.0 - a)
            out[n_w1 + h] += g_h
            for m in range(hist_n[side, t]):
                out[hist_x[side, t, m] * hidden + h] += g_h


@numba.njit(cache=True, parallel=True)
def play_games(w1, b1, w2, b2, wm, bm, lam, kind, net, eps, learn, keys, mixed, jumps, k, max_plies, lookahead,
               td_leaf, n_chunks, out_result, out_plies, out_delta):
    """Play every game to its end; accumulate learners' TD(λ) sums into out_delta.

    kind, net, eps, learn: (games, 2) per side (side 0 = X, moves first).
    wm, bm: the networks' second hidden layer, (P, hidden, hidden2) and (P, hidden2);
    hidden2 = 0 for none.
    lookahead: (games, 2) plies each side's network chooser looks ahead (1 or 2).
    td_leaf: learners choosing two plies deep learn from the leaves of their search
    (TD-Leaf) instead of the after-states played.
    out_result: +1 X won, -1 O won, 0 draw; out_plies: plies played;
    out_delta[g, side]: Σ c_t ∇V(s_t) for learning sides (unscaled by α).
    """
    n_games = keys.shape[0]
    squares = w1.shape[1] // 2
    hidden, hidden2 = b1.shape[1], bm.shape[1]
    max_moves = k * jumps.shape[1]
    max_steps = (max_plies + 1) // 2
    max_playouts = 0  # sizes the tree search's arrays (none without such players)
    for g in range(n_games):
        for side in range(2):
            if kind[g, side] >= KIND_MCTS_BASE:
                max_playouts = max(max_playouts, kind[g, side] - KIND_MCTS_BASE)
    for chunk in prange(n_chunks):
        lo = chunk * n_games // n_chunks
        hi = (chunk + 1) * n_games // n_chunks
        board = np.empty(squares, dtype=np.int8)
        perm = np.empty(squares, dtype=np.int64)
        pieces = np.empty((2, k), dtype=np.int64)
        counts = np.empty(2, dtype=np.int64)
        mf = np.empty(max_moves, dtype=np.int64)
        mt = np.empty(max_moves, dtype=np.int64)
        mc = np.empty(max_moves, dtype=np.int64)
        scores = np.empty(max_moves)
        stack = _search_stack(squares, k, max_moves)
        scratch = _lookahead_scratch(squares, k, max_moves, hidden, hidden2)
        tree = _mcts_tree(1 + max_moves + max_playouts * max_moves, squares, k, max_moves, max_plies)
        z0 = np.empty(hidden)
        zf = np.empty(hidden)
        a1 = np.empty(hidden)
        s2 = np.empty(hidden2)
        hist_v = np.empty((2, max_steps))
        hist_s = np.empty((2, max_steps))
        hist_h = np.empty((2, max_steps, hidden))
        hist_h2 = np.empty((2, max_steps, hidden2))
        hist_x = np.empty((2, max_steps, 2 * k), dtype=np.int64)
        hist_n = np.empty((2, max_steps), dtype=np.int64)
        steps = np.zeros(2, dtype=np.int64)
        for g in range(lo, hi):
            key = keys[g]
            _setup(key, mixed, k, squares, perm, board, pieces, counts)
            steps[0] = 0
            steps[1] = 0
            result = 0
            plies = max_plies
            for ply in range(max_plies):
                side = ply & 1
                n = _moves(board, pieces, counts, side, jumps, mf, mt, mc)
                if n == 0:
                    continue  # no legal move: pass
                word = _draw(key, mixed[2 * k + ply])
                u = _choice(word)
                kd = kind[g, side]
                if (kd == KIND_NET or kd == KIND_NOISY) and _explores(word, eps[g, side]):
                    i = _pick(u, n)
                elif kd == KIND_NET and lookahead[g, side] == 2:
                    i = _lookahead_pick(w1, b1, w2, b2, wm, bm, net[g, side], board, pieces, counts, side, jumps,
                                        mf, mt, mc, n, squares, scratch)
                elif kd == KIND_NET:
                    _preactivation(w1, b1, net[g, side], pieces, counts, side, squares, z0)
                    i = _net_best(w1, w2, b2, wm, bm, net[g, side], z0, zf, a1, s2, mf, mt, mc, n, squares)
                elif kd == KIND_RANDOM:
                    i = _pick(u, n)
                elif kd == KIND_GREEDY or kd == KIND_NOISY:
                    i = _greedy_pick(mc, n, u)
                elif kd == KIND_SEARCH:
                    i = _search_pick(board, pieces, counts, side, jumps, mf, mt, mc, n, u, scores)
                elif kd >= KIND_MCTS_BASE:
                    i = _mcts_pick(board, pieces, counts, side, jumps, mf, mt, mc, n, word, kd - KIND_MCTS_BASE,
                                   max_plies - ply, tree)
                else:
                    i = _depth_pick(board, pieces, counts, side, jumps, mf, mt, mc, n, u, scores,
                                    kd - KIND_DEPTH_BASE, stack)
                _apply(board, pieces, counts, side, mf[i], mt[i], mc[i])
                if learn[g, side] and td_leaf and lookahead[g, side] == 2:
                    _record_leaf(w1, b1, w2, b2, wm, bm, net[g, side], board, pieces, counts, side, jumps, squares,
                                 scratch, steps[side], hist_v, hist_s, hist_h, hist_h2, hist_x, hist_n)
                    steps[side] += 1
                elif learn[g, side]:
                    _record(w1, b1, w2, b2, wm, bm, net[g, side], pieces, counts, side, side, squares, z0, s2,
                            steps[side], hist_v, hist_s, hist_h, hist_h2, hist_x, hist_n)
                    steps[side] += 1
                if counts[1 - side] == 0:
                    result = 1 - 2 * side
                    plies = ply + 1
                    break
            out_result[g] = result
            out_plies[g] = plies
            for side in range(2):
                if learn[g, side]:
                    q = net[g, side]
                    _td_accumulate(w2, wm, q, lam[q], side, steps[side], result, hist_v, hist_s, hist_h, hist_h2,
                                   hist_x, hist_n, s2, out_delta[g, side])


@numba.njit(cache=True, parallel=True)
def sum_segments(delta_rows, order, starts, initial, out):
    """out[a] = initial[a] + Σ delta_rows[order[starts[a]:starts[a+1]]], added one row
    at a time in that order (deterministic)."""
    agents = out.shape[0]
    size = out.shape[1]
    for a in prange(agents):
        for i in range(size):
            out[a, i] = initial[a, i]
        for r in range(starts[a], starts[a + 1]):
            row = order[r]
            for i in range(size):
                out[a, i] += delta_rows[row, i]


def run_games(nets, lam, kind, net, eps, learn, keys, *, base, jumps, pieces, max_turns, n_chunks, lookahead=1,
              td_leaf=False):
    """Play ``len(keys)`` games (see :func:`play_games`); returns (result, plies, delta).

    ``lookahead``: one depth for every network side, or (games, 2) per side.

    ``delta`` is (games, 2, P) with rows only for learning sides (others untouched),
    or None when no side learns.
    """
    n_games = keys.shape[0]
    inputs, hidden = nets.w1.shape[1], nets.w1.shape[2]
    wm, bm = nets.middle()
    size = parameter_count(inputs, hidden, bm.shape[1])
    learning = bool(learn.any())
    delta = np.empty((n_games, 2, size) if learning else (1, 2, size))
    result = np.empty(n_games, dtype=np.int8)
    plies = np.empty(n_games, dtype=np.int64)
    mixed = mixed_counters(base, 2 * pieces + max_turns)
    play_games(np.ascontiguousarray(nets.w1, dtype=np.float64), np.ascontiguousarray(nets.b1, dtype=np.float64),
               np.ascontiguousarray(nets.w2, dtype=np.float64), np.ascontiguousarray(nets.b2, dtype=np.float64),
               np.ascontiguousarray(wm, dtype=np.float64), np.ascontiguousarray(bm, dtype=np.float64),
               np.ascontiguousarray(lam, dtype=np.float64), np.ascontiguousarray(kind, dtype=np.int64),
               np.ascontiguousarray(net, dtype=np.int64), np.ascontiguousarray(eps, dtype=np.float64),
               np.ascontiguousarray(learn, dtype=np.bool_), np.ascontiguousarray(keys, dtype=np.int64), mixed,
               np.ascontiguousarray(jumps, dtype=np.int64), pieces, max_turns,
               np.ascontiguousarray(np.broadcast_to(np.asarray(lookahead, dtype=np.int64), (n_games, 2))),
               bool(td_leaf),
               max(1, min(n_games, n_chunks)), result, plies, delta)
    return result, plies, (delta if learning else None)


def sum_by_network(delta: np.ndarray, net: np.ndarray, learn: np.ndarray, networks: int,
                   initial: np.ndarray | None = None) -> np.ndarray:
    """Σ of the learning sides' rows per network, in (game, side) order: (networks, P).

    ``initial`` (networks, P) continues a running sum (the rows of earlier games, summed
    elsewhere) instead of starting from 0: the same additions in the same order."""
    rows = delta.reshape(-1, delta.shape[-1])
    flat_learn = np.asarray(learn, dtype=bool).reshape(-1)
    flat_net = np.asarray(net, dtype=np.int64).reshape(-1)
    index = np.flatnonzero(flat_learn)
    order = index[np.argsort(flat_net[index], kind="stable")]
    starts = np.searchsorted(flat_net[order], np.arange(networks + 1)).astype(np.int64)
    out = np.empty((networks, rows.shape[1]))
    start = np.zeros_like(out) if initial is None else np.ascontiguousarray(initial, dtype=np.float64)
    if start.shape != out.shape:  # the kernel does not check bounds
        raise ValueError(f"initial has shape {start.shape}, expected {out.shape}")
    sum_segments(rows, order.astype(np.int64), starts, start, out)
    return out

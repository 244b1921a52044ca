"""Benchmark opponents for knights, and the quality of agents against them.

* ``random`` plays a uniformly random legal move;
* ``greedy`` captures when it can (a random capture), otherwise plays at random;
* ``search`` is a two-ply minimax on material: it maximises (own − opposing pieces)
  after the opponent's best reply, a capture of the last piece counting as a win or
  a loss; equal scores are broken at random;
* ``search1`` … ``search4`` search d plies deep with alpha-beta pruning (material at
  the horizon, a side with no pieces lost, a side with no move passes; equal best
  scores broken at random in move order, from the game's own draws). ``search1``
  plays exactly greedy's moves and ``search2`` exactly search's; the deeper ones are
  the upper rungs of the ladder (:mod:`popplay.tournaments.ladder`);
* ``mcts100`` … ``mcts6400``: Monte-Carlo tree search (UCT) with that many playouts
  a move, the playouts played by greedy's rule, a win in one taken at once; its
  random draws come from the ply's own word, so its games repeat exactly.

Quality of an agent = (wins + draws/2) / games against an opponent, the games split
evenly between moving first and second. All agents meet the same starting positions
and the same dice (common random numbers), so their qualities compare fairly.
The engines play these bots inside their batched kernels (the search on the numba
engine only); :func:`bot_move` is the same rule for one board, for people and tests.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from popplay.games.knights import _numba, engine
from popplay.games.knights import rules as game
from popplay.games.knights.rules import OPPONENTS, KnightsParams, Networks

__all__ = ["OPPONENTS", "Quality", "quality", "bot_move", "agent_move", "strongest"]

# Weakest first, as the ladder rates them on the default board (docs/knights.md):
# search1 plays greedy's moves and search2 the search's (same rule, same tie-breaks);
# search3, whose horizon ends on its own move, rates a little below search2.
# The tree searches from their ratings beside these rungs (400 games per pair): mcts100
# 973, mcts400 1292, mcts1600 1502 (search2 1511), mcts6400 1612 (search4 1587).
_STRENGTH = ("random", "noisy75", "noisy50", "noisy25", "search1", "greedy", "mcts100", "mcts400", "search3",
             "mcts1600", "search2", "search", "search4", "mcts6400")


class Quality(NamedTuple):
    """Per agent: wins, draws and losses against one opponent, and the quality."""

    opponent: str
    wins: np.ndarray
    draws: np.ndarray
    losses: np.ndarray
    score: np.ndarray  # (wins + draws/2) / games

    def summary(self) -> dict[str, float]:
        return {"best": float(self.score.max()), "mean": float(self.score.mean()),
                "worst": float(self.score.min())}


def quality(nets: Networks, opponent: str, games: int, *, params: KnightsParams | None = None, seed: int = 0,
            backend: Any = None) -> Quality:
    """Every network plays ``games`` games against ``opponent`` (greedily, ε = 0)."""
    if opponent not in OPPONENTS:
        raise ValueError(f"opponent must be one of {', '.join(OPPONENTS)} (got {opponent!r})")
    if games < 2 or games % 2:
        raise ValueError(f"games must be even and at least 2, half moving first (got {games})")
    code = OPPONENTS[opponent]
    agents = np.arange(nets.count)
    pairs = np.stack([agents, np.full_like(agents, code)], axis=1)
    played = engine.play_pairs(nets, pairs, games, params=params, seed=seed, tag=game.TAG_EVALUATION,
                             streams=np.full(nets.count, code), backend=backend)
    return Quality(opponent, played.wins, played.draws, played.losses, played.score)


def strongest(names: tuple[str, ...] | list[str]) -> str:
    """The strongest of the named opponents (random < greedy < search)."""
    return max(names, key=_STRENGTH.index)


def bot_move(opponent: str, board: np.ndarray, player: int, u: float,
             jumps: str = "knight", plies_left: int = game.DEFAULT_MAX_TURNS) -> tuple[int, int] | None:
    """The move bot ``opponent`` plays on ``board`` with uniform draw ``u`` in [0, 1)
    (None: no legal move, pass); the tree searches key their playouts by ``u`` and
    count a game still on after ``plies_left`` plies a draw."""
    moves = game.legal_moves(board, player, jumps)
    if not moves:
        return None
    flat = np.asarray(board).reshape(-1)
    if opponent == "random":
        return moves[math.floor(u * len(moves))]
    if opponent == "greedy":
        captures = [m for m in moves if flat[m[1]] == -player]
        pool = captures or moves
        return pool[math.floor(u * len(pool))]
    if opponent not in OPPONENTS:
        raise ValueError(f"opponent must be one of {', '.join(OPPONENTS)} (got {opponent!r})")
    rows, cols = np.asarray(board).shape
    if opponent.startswith("mcts"):
        index = _numba.mcts_choice(np.ascontiguousarray(flat, dtype=np.int64), 0 if player == 1 else 1,
                                   game.geometry(rows, cols, jumps).table, int(opponent[len("mcts"):]),
                                   int(u * 2.0**53), int(plies_left))
        return moves[index]
    if opponent != "search":  # search<d>: the engines' alpha-beta kernel, on this board
        depth = int(opponent[len("search"):])
        scores = _numba.depth_search_scores(np.ascontiguousarray(flat, dtype=np.int64), 0 if player == 1 else 1,
                                            game.geometry(rows, cols, jumps).table, depth)
        tied = [m for m, s in zip(moves, scores) if s == scores.max()]
        return tied[math.floor(u * len(tied))]
    scores = [_search_score(board, m, player, jumps) for m in moves]
    tied = [m for m, s in zip(moves, scores) if s == max(scores)]
    return tied[math.floor(u * len(tied))]


def agent_move(net: game.Network, board: np.ndarray, player: int, jumps: str = "knight",
               lookahead: int | None = None) -> tuple[int, int] | None:
    """The move an agent with ``net`` plays on ``board`` without exploring (None: pass):
    the after-state of highest V with ``lookahead`` 1, the engines' minimax over its V
    with 2 (``--lookahead 2``); by default as deep as the agent chose (``net.plies``,
    else 1)."""
    if lookahead is None:
        lookahead = net.plies or 1
    if lookahead == 1:
        return game.best_move(net, board, player, jumps)
    moves = game.legal_moves(board, player, jumps)
    if not moves:
        return None
    rows, cols = np.asarray(board).shape
    index = _numba.lookahead_choice(np.asarray(net.w1, dtype=np.float64), np.asarray(net.b1, dtype=np.float64),
                                    np.asarray(net.w2, dtype=np.float64), float(net.b2),
                                    np.ascontiguousarray(np.asarray(board).reshape(-1), dtype=np.int64),
                                    0 if player == 1 else 1, game.geometry(rows, cols, jumps).table,
                                    None if net.wm is None else np.asarray(net.wm, dtype=np.float64),
                                    None if net.bm is None else np.asarray(net.bm, dtype=np.float64))
    return moves[index]


def _search_score(board: np.ndarray, move: tuple[int, int], player: int, jumps: str) -> float:
    after = game.apply_move(board, move, jumps)
    if not (after == -player).any():
        return game.SEARCH_WIN
    gain = float(np.asarray(board).reshape(-1)[move[1]] == -player)
    for reply in game.legal_moves(after, -player, jumps):
        if after.reshape(-1)[reply[1]] == player:
            return -game.SEARCH_WIN if int((after == player).sum()) == 1 else gain - 1.0
    return gain

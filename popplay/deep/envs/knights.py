"""Knights for the deep agents: a single-agent gymnasium environment against a fixed
opponent (``popplay/Knights-v0``), and the round robin in which a deep population's
members play each other (``--rank-by tournament``).

The game is :mod:`popplay.games.knights.rules` (Bell's knights, default 5 × 7 board,
5 pieces a side). Spaces follow popplay's PettingZoo environment
(:mod:`popplay.games.knights.pettingzoo`), so an action means the same in both:

* **Observation**: float32 (2 · rows · cols,): 1 where the agent has a piece, then 1
  where the opponent has one (:func:`popplay.games.knights.rules.encode`).
* **Action**: ``from_square · jumps + j`` moves the piece on ``from_square`` by jump
  ``j``; the last action passes. The deep agents have no action masks, so an illegal
  action (or a pass while a move exists) plays a uniformly random legal move instead,
  from the environment's own stream; ``info["illegal"]`` says when. An agent that never
  learns legality therefore plays at random rather than losing at once, and exploration
  plays whole games.
* **Episode**: the agent is X (moves first) or O with even odds at each reset; the
  opponent (``opponent=``: ``random``, ``greedy`` or ``search1`` … ``search4``, the
  ladder's bots; registered as ``popplay/Knights-v0``, ``popplay/KnightsGreedy-v0``,
  ``popplay/KnightsSearch1-v0`` … ``popplay/KnightsSearch4-v0``) replies inside
  :meth:`KnightsEnv.step`. Reward +1 when the agent takes
  the opponent's last piece, −1 when it loses its last, else 0; after ``max_turns``
  plies the episode is truncated (the rules' draw).

:meth:`KnightsEnv.round_robin` is the two-player protocol a deep population's PBT ranks
by: every pair of members plays ``games_per_pair`` games from shared starting positions,
each member moving first in half of them, all members acting greedily through one
batched call per game column and ply.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import gymnasium
import numpy as np
from gymnasium import spaces

from popplay import rng as _rng
from popplay.deep.envs import KNIGHTS_OPPONENTS
from popplay.games.knights import rules as game
from popplay.games.knights.opponents import bot_move

__all__ = ["KnightsEnv", "OPPONENTS", "round_robin_reference"]

OPPONENTS = KNIGHTS_OPPONENTS  # what the environment can play inside its steps
#: The streams of the members' round robins (starting positions and illegal-move dice).
TAG_DEEP_TOURNAMENT = 0x6B6E6474  # "kndt"


class KnightsEnv(gymnasium.Env):
    """One side of a knights game against a fixed opponent (see the module)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, rows: int = 5, cols: int = 7, pieces: int = 5, jumps: str = "knight",
                 max_turns: int = game.DEFAULT_MAX_TURNS, opponent: str = "random",
                 render_mode: str | None = None) -> None:
        params = game.KnightsParams(rows=rows, cols=cols, pieces=pieces, jumps=jumps, max_turns=max_turns)
        params.validate()
        if opponent not in OPPONENTS:
            raise ValueError(f"opponent must be one of {', '.join(OPPONENTS)} (got {opponent!r})")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {', '.join(self.metadata['render_modes'])} or None")
        self.params = params
        self.opponent = opponent
        self.render_mode = render_mode
        self.table = params.geometry.table[:-1]  # (squares, jumps); the engines' extra row is not a square
        self.pass_action = rows * cols * self.table.shape[1]
        self.observation_space = spaces.Box(0.0, 1.0, (2 * rows * cols,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.pass_action + 1)
        self.board = np.zeros((rows, cols), dtype=np.int8)
        self.me, self.plies = 1, 0

    # --- the single-agent game ---------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        p = self.params
        while True:  # with one piece a side, O's first reply may end the game: draw again
            self.board = game.start_position(int(self.np_random.integers(0, 2**62)), p.rows, p.cols, p.pieces)
            self.me, self.plies = (1 if self.np_random.random() < 0.5 else -1), 0
            if self.me == -1:
                self._opponent_moves()
            if not game.winner(self.board):
                break
        return self.observation(self.board, self.me), {"side": "X" if self.me == 1 else "O"}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        move, illegal = self.resolve(self.board, self.me, int(action), float(self.np_random.random()))
        info = {"illegal": illegal}
        self._play(move)
        if game.winner(self.board):
            return self.observation(self.board, self.me), 1.0, True, False, info
        if self.plies >= self.params.max_turns:
            return self.observation(self.board, self.me), 0.0, False, True, info
        self._opponent_moves()
        if game.winner(self.board):
            return self.observation(self.board, self.me), -1.0, True, False, info
        return self.observation(self.board, self.me), 0.0, False, self.plies >= self.params.max_turns, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        marks = {1: "X", -1: "O", 0: "."}
        return "\n".join(" ".join(marks[int(v)] for v in row) for row in self.board) + "\n"

    def _opponent_moves(self) -> None:
        p = self.params
        self._play(bot_move(self.opponent, self.board, -self.me, float(self.np_random.random()), p.jumps,
                            plies_left=p.max_turns - self.plies))

    def _play(self, move: tuple[int, int] | None) -> None:
        if move is not None:
            self.board = game.apply_move(self.board, move, self.params.jumps)
        self.plies += 1

    # --- the rules of actions, shared with the round robin ------------------------------
    @staticmethod
    def observation(board: np.ndarray, player: int) -> np.ndarray:
        return game.encode(board, player).astype(np.float32)

    def resolve(self, board: np.ndarray, player: int, action: int, u: float) -> tuple[tuple[int, int] | None, bool]:
        """The move ``action`` plays for ``player`` (None: a pass) and whether it was
        illegal, in which case the move is the legal one ``u`` (uniform in [0, 1)) picks."""
        if not 0 <= action <= self.pass_action:
            raise ValueError(f"action must lie in [0, {self.pass_action}] (got {action})")
        moves = game.legal_moves(board, player, self.params.jumps)
        chosen = game.action_move(self.table, action)
        legal = (chosen in moves) if chosen is not None else (action == self.pass_action and not moves)
        if legal:
            return chosen, False
        return (moves[math.floor(u * len(moves))] if moves else None), True

    # --- the two-player protocol: members against each other ----------------------------
    def round_robin(self, act: Callable[[np.ndarray], np.ndarray], members: int, games_per_pair: int,
                    seed: int, generation: int, *, rows: slice | None = None,
                    gather: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every pair of ``members`` plays ``games_per_pair`` games (rounded up to even:
        half with each moving first, from the same starting positions), every member
        choosing ``act``'s greedy action: ``act`` maps one observation per member
        (members, obs_dim) to one action each. Illegal actions play a random legal move
        from the game's own stream. Returns (wins, draws): wins[i, j] games i won against
        j, draws symmetric. Games of every pair advance together, ply by ply; the moves
        are those of :func:`round_robin_reference`, which plays them one at a time.

        Over ranks, each rank passes the ``rows`` (members) its ``act`` serves and a
        ``gather`` that stacks every rank's rows in member order (an all-gather): every
        rank keeps every board, asks its own members' actions, gathers all of them once
        per ply and plays the same moves, so the results equal one process's."""
        games = _Games(self, members, games_per_pair, seed, generation)
        obs_dim = self.observation_space.shape[0]
        mine = np.arange(members)[rows if rows is not None else slice(None)]
        for ply in range(self.params.max_turns):
            side = ply % 2  # 0: X to move in every game still on, 1: O
            grid = games.by_mover[side]  # (members, columns) game indices, the mover's row
            live = ~games.over[grid]
            if not live.any():
                break
            player = 1 if side == 0 else -1
            obs = np.zeros((len(mine), grid.shape[1], obs_dim), dtype=np.float32)
            for row, m in enumerate(mine):
                for column in np.flatnonzero(live[m]):
                    obs[row, column] = self.observation(games.boards[grid[m, column]], player)
            actions = np.stack([np.asarray(act(obs[:, column])).reshape(-1) for column in range(grid.shape[1])],
                               axis=1).astype(np.int64)
            if gather is not None:
                actions = np.asarray(gather(actions))
            for m, column in zip(*np.nonzero(live)):
                games.advance(int(grid[m, column]), player, int(actions[m, column]), ply)
        return games.results()


class _Games:
    """The games of a members' round robin: who plays X and O in each, its board and
    its stream, and the two (members, columns) grids of game indices by mover."""

    def __init__(self, env: KnightsEnv, members: int, games_per_pair: int, seed: int, generation: int) -> None:
        p = env.params
        self.env = env
        half = max(1, math.ceil(games_per_pair / 2))
        pairs = [(i, j) for i in range(members) for j in range(members) if i != j]
        self.x = np.array([i for i, j in pairs for _ in range(half)], dtype=np.int64)
        self.o = np.array([j for i, j in pairs for _ in range(half)], dtype=np.int64)
        rounds = np.array([g for _ in pairs for g in range(half)], dtype=np.int64)
        # one stream per unordered pair and game: both colours start from its position
        ids = np.minimum(self.x, self.o) * members + np.maximum(self.x, self.o)
        self.keys = _rng.stream_keys(seed, TAG_DEEP_TOURNAMENT, [generation], ids * half + rounds)[0]
        self.boards = [game.start_position(int(k), p.rows, p.cols, p.pieces) for k in self.keys]
        # each colour's dice apart: the same position played with colours swapped draws anew
        self.dice = self.keys ^ np.where(self.x < self.o, 0, 0x5DEECE66D).astype(self.keys.dtype)
        self.over = np.zeros(len(self.x), dtype=bool)
        self.result = np.zeros(len(self.x), dtype=np.int64)  # +1 X won, −1 O won, 0 draw
        order = np.arange(len(self.x))
        columns = (members - 1) * half
        self.by_mover = (order[np.argsort(self.x, kind="stable")].reshape(members, columns),
                         order[np.argsort(self.o, kind="stable")].reshape(members, columns))

    def advance(self, index: int, player: int, action: int, ply: int) -> None:
        """Game ``index``'s mover ``player`` plays ``action`` at ``ply``."""
        r = _rng._numpy_rng()
        u = float(r.uniform53(r.draw(np.int64(self.dice[index]), r.mix_counter(np.int64(ply)))))
        move, _ = self.env.resolve(self.boards[index], player, action, u)
        if move is not None:
            self.boards[index] = game.apply_move(self.boards[index], move, self.env.params.jumps)
        won = game.winner(self.boards[index])
        if won or ply + 1 >= self.env.params.max_turns:
            self.over[index], self.result[index] = True, won

    def results(self) -> tuple[np.ndarray, np.ndarray]:
        members = self.by_mover[0].shape[0]
        wins = np.zeros((members, members))
        draws = np.zeros((members, members))
        np.add.at(wins, (self.x[self.result == 1], self.o[self.result == 1]), 1.0)
        np.add.at(wins, (self.o[self.result == -1], self.x[self.result == -1]), 1.0)
        drawn = self.result == 0
        np.add.at(draws, (self.x[drawn], self.o[drawn]), 1.0)
        np.add.at(draws, (self.o[drawn], self.x[drawn]), 1.0)
        return wins, draws


def round_robin_reference(env: KnightsEnv, act: Callable[[np.ndarray], np.ndarray], members: int,
                          games_per_pair: int, seed: int, generation: int) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`KnightsEnv.round_robin` the slow way (for tests): one game at a time, to
    its end, asking ``act`` for the mover's action alone."""
    games = _Games(env, members, games_per_pair, seed, generation)
    obs_dim = env.observation_space.shape[0]
    for index in range(len(games.x)):
        for ply in range(env.params.max_turns):
            player, mover = (1, games.x[index]) if ply % 2 == 0 else (-1, games.o[index])
            obs = np.zeros((members, obs_dim), dtype=np.float32)
            obs[mover] = env.observation(games.boards[index], player)
            games.advance(index, player, int(np.asarray(act(obs)).reshape(-1)[mover]), ply)
            if games.over[index]:
                break
    return games.results()

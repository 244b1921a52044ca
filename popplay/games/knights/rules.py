"""Knights: Bell's self-play board game (section 3), its rules and its TD(λ) agents.

The game. Chess knights on a ``rows × cols`` board (default 5 × 7), ``pieces`` per
side (default 5) placed at random on distinct squares. X (+1) moves first, then the
players alternate; a move jumps one own piece by one of the jump offsets (the
knight's by default) to an empty square or onto an opposing piece, capturing it. A
player wins by capturing every opposing piece. The game is drawn when ``max_turns``
plies (single moves) have been played without a winner; the default is 100 plies
(see ``docs/knights.md`` for why). A player with no legal move passes: the ply
counts towards the limit and the other player moves again (with knights this needs
every own piece to be boxed in by own pieces, which is rare but possible).

A board is an int8 array shaped ``(rows, cols)``: +1 for X's pieces, −1 for O's, 0
empty. Squares are numbered ``row * cols + col``; a move is ``(from_square,
to_square)``. Legal moves are listed in canonical order: by from-square, then by
the order of the jump offsets.

The agents. V(s) is a network with two binary input planes (the pieces of the
player who just moved, then the opponent's), one hidden layer of H sigmoid units (a
second of H2 with ``hidden2``) and a sigmoid output: the player's estimated chance of winning (win 1, draw 0.5, loss 0)
in the after-state ``s``, with the opponent to move. An agent plays the legal move
whose after-state has the highest value (ε-greedy while learning) and learns by
TD(λ) over its own after-states.

Inside the engines legal moves come from a jump table (per square, the target
square of every offset, −1 off the board) so that every game of every agent runs
the same branch-free steps. The numba engine plays each game to the end in one
thread; the torch engine advances all games in lockstep as tensors.

Random streams. A game has one stream (key); word ``base + i`` for ``i < 2k``
places the pieces (a partial Fisher–Yates shuffle of the squares: the first k
chosen squares are X's, the next k O's) and word ``base + 2k + ply`` decides ply
``ply``: its high 32 bits the ε test, its low 32 bits every uniform choice.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, NamedTuple, Sequence

import numpy as np

from popplay import rng as _rng
from popplay.core.options import option
from popplay.games.schedule import replication_warning
from popplay.operators.evolution import REPLICATE_WHEN, Lineage
from popplay.xp import npx, py

# Random-stream families of this domain (rng.py's own tags are below 32).
TAG_PLAY = 32  # learning games: keyed by (agent slot, game slot), counter by episode
TAG_OPPONENT = 33  # which population member an agent's game slot meets, per episode
TAG_INIT = 34  # initial network weights, per agent slot
TAG_EVALUATION = 35  # games against benchmark opponents
TAG_MATCH = 36  # games between given players (tournaments)
TAG_LEAGUE = 37  # which game slots meet the league, and whom in it, per episode

# Player kinds inside the engines.
KIND_NET, KIND_RANDOM, KIND_GREEDY, KIND_SEARCH = 0, 1, 2, 3
KIND_NOISY = 4  # greedy, but a random move with its player's ε (networks explore with theirs too)
TORCH_KINDS = (KIND_NET, KIND_RANDOM, KIND_GREEDY)  # the players the torch engine has; numba has them all
# Player codes accepted by :func:`play_pairs`: >= 0 is a network index, < 0 a bot.
# Kind KIND_DEPTH_BASE + d: the alpha-beta material search d plies deep (benchmark
# code -(KIND_DEPTH_BASE + d), name "search<d>"); numba engine only.
KIND_DEPTH_BASE = 10
MAX_SEARCH_DEPTH = 4
# Noisy greedy bots: greedy, but a uniformly random move with probability ε (the
# ladder's rungs between random and greedy).
NOISY = {"noisy75": (-21, 0.75), "noisy50": (-22, 0.5), "noisy25": (-23, 0.25)}
# Kind KIND_MCTS_BASE + N: Monte-Carlo tree search with N random playouts a move
# (code -(KIND_MCTS_BASE + N), name "mcts<N>"); numba engine only.
KIND_MCTS_BASE = 1000
MCTS_PLAYOUTS = (100, 400, 1600, 6400)
OPPONENTS: dict[str, int] = {"random": -1, "greedy": -2, "search": -3,
                             **{f"search{d}": -(KIND_DEPTH_BASE + d) for d in range(1, MAX_SEARCH_DEPTH + 1)},
                             **{name: code for name, (code, _) in NOISY.items()},
                             **{f"mcts{n}": -(KIND_MCTS_BASE + n) for n in MCTS_PLAYOUTS}}
KIND_OF_CODE = {-1: KIND_RANDOM, -2: KIND_GREEDY, -3: KIND_SEARCH,
                **{-(KIND_DEPTH_BASE + d): KIND_DEPTH_BASE + d for d in range(1, MAX_SEARCH_DEPTH + 1)},
                **{code: KIND_NOISY for code, _ in NOISY.values()},
                **{-(KIND_MCTS_BASE + n): KIND_MCTS_BASE + n for n in MCTS_PLAYOUTS}}
BOT_EPSILON = {code: eps for code, eps in NOISY.values()}  # bots not listed never explore
# The ladder's rungs, weakest first (popplay.tournaments.ladder rates them);
# ``--eval-opponents ladder`` evaluates against all of them.
LADDER_RUNGS = ("random", "noisy75", "noisy50", "noisy25", "greedy", "search2", "search3", "search4")

KNIGHT: tuple[tuple[int, int], ...] = ((-2, -1), (-2, 1), (-1, -2), (-1, 2), (1, -2), (1, 2), (2, -1), (2, 1))
DEFAULT_MAX_TURNS = 100
DTYPES = ("float64", "float32")
LEAGUE_SAMPLING = ("uniform", "pfsp")
PAIRINGS = ("uniform", "adaptive")
SEARCH_WIN = 1000.0  # score of a won (lost: minus) position in the material search
MAX_SIDE = 26  # rows and columns are named a..z / 1..26 in the terminal


def parse_jumps(spec: str) -> tuple[tuple[int, int], ...]:
    """Jump offsets from ``"knight"`` or ``"dr,dc;dr,dc;..."`` (e.g. ``"1,0;-1,0;0,1;0,-1"``)."""
    text = str(spec).strip().lower()
    if text == "knight":
        return KNIGHT
    offsets = []
    try:
        for part in text.split(";"):
            if not part.strip():
                continue
            dr, dc = (int(v) for v in part.split(","))
            offsets.append((dr, dc))
    except ValueError:
        raise ValueError(f"jumps must be 'knight' or 'dr,dc;dr,dc;...' (got {spec!r})") from None
    if not offsets:
        raise ValueError(f"jumps must list at least one offset (got {spec!r})")
    if (0, 0) in offsets:
        raise ValueError("jumps must not contain the offset 0,0 (a piece must move)")
    if len(set(offsets)) != len(offsets):
        raise ValueError(f"jumps lists an offset twice (got {spec!r})")
    return tuple(offsets)


@dataclass(frozen=True)
class KnightsParams:
    """Train a knights population by TD(λ) self-play. Quality = the mean agent's
    (wins + draws/2)/games against the strongest benchmark opponent evaluated."""

    rows: int = option(5, "Board rows.", min=1, max=MAX_SIDE)
    cols: int = option(7, "Board columns.", min=1, max=MAX_SIDE)
    pieces: int = option(5, "Pieces per side, placed at random.", min=1)
    jumps: str = option("knight", "Jump pattern: 'knight' or offsets 'dr,dc;dr,dc;...'.")
    max_turns: int = option(DEFAULT_MAX_TURNS, "Plies (single moves) after which a game is drawn.", min=1,
                            max=100_000)
    agents: int = option(16, "Agents in the population.", min=1)
    games_per_agent: int = option(64, "Games each agent plays at once per episode (copies of itself, each against "
                                      "a random population member; half as X).", min=1)
    episodes: int = option(10000, "Learning episodes (one game per copy each).", min=1, budget=True)
    hidden: int = option(4, "Hidden sigmoid units of each value network.", min=1, max=1024)
    hidden2: int = option(0, "Units of a second sigmoid hidden layer after the first (0: none, Bell's one layer).",
                          min=0, max=1024)
    start_width: int = option(0, "First-layer units each agent starts with switched on, of --hidden (0: all). An "
                                 "off unit has every weight into and out of it zero and never learns, so the "
                                 "agent is a network of that width; the engines still compute --hidden units.",
                              min=0, max=1024)
    start_width2: int = option(0, "Second-layer units each agent starts with switched on, of --hidden2 (0: all; "
                                  "needs --hidden2): as --start-width, for the second hidden layer.",
                               min=0, max=1024)
    lookahead: int = option(1, "Plies the agents' move chooser looks ahead: 1 plays the after-state of highest V; "
                               "2 plays minimax over V (the move after which the opponent's best reply, valued "
                               "by the same network, is least good for it; taking the last piece wins at once). "
                               "Learning stays TD(λ) on the after-states played unless --td-leaf.", min=1, max=2)
    td_leaf: bool = option(False, "Agents choosing two plies deep (--lookahead 2, or copies switched by "
                                  "--mutate-lookahead) learn TD-Leaf(λ) from the leaves of each move's two-ply "
                                  "search (the position after the opponent's best reply) instead of the "
                                  "after-states played; one-ply agents learn TD(λ) as ever.")
    dtype: str = option("float64", "Floating point of the torch engine's games and TD(λ) sums (float32: half the "
                                   "memory traffic on a GPU; the weights stay float64). The numba engine computes "
                                   "in float64 only.", choices=DTYPES)
    alpha: float = option(0.05, "TD(λ) step size per game copy (copies' changes are summed).")
    alpha_half_life: int = option(0, "A learning-rate schedule: every agent's step size halves every this many "
                                     "episodes, alpha · 2^(−episode/half-life) (0: constant). Each agent keeps its "
                                     "own half-life, which --mutate-params varies as it varies alpha.", min=0)
    lam: float = option(0.7, "Eligibility-trace decay λ.", min=0.0, max=1.0)
    epsilon: float = option(0.05, "Exploration: chance of a random move while learning.", min=0.0, max=1.0)
    init_scale: float = option(0.1, "Initial weights uniform on ±this.", min=0.0)
    opponents_learn: bool = option(False, "Opponents also learn from the games they are drawn into.")
    eval_every: int = option(20, "Episodes between evaluations against the benchmark opponents.", min=1)
    eval_every_seconds: float = option(0.0, "Also evaluate once this many seconds of learning time passed since the "
                                            "last evaluation (0: by episodes only). Slow episodes (two plies, wide "
                                            "networks) then still give curve points; learning is unchanged, but "
                                            "when the points fall depends on the machine's speed. One process only.",
                                       min=0.0)
    eval_games: int = option(100, "Games per agent and opponent in an evaluation.", min=2)
    eval_opponents: str = option("random,greedy", "Benchmark opponents to evaluate against: some of random, "
                                                  "noisy75, noisy50, noisy25, greedy, search, search1 ... search4, "
                                                  "mcts100, mcts400, mcts1600, mcts6400 (tree searches); "
                                                  "ladder: every rung of the ladder, and the population's ladder "
                                                  "Elo in the curves.")
    snapshot_every: int = option(100, "Episodes between snapshots of the population kept in the run file "
                                      "(0: none).", min=0)
    league: int = option(0, "A league of past generations: the last K snapshots (--snapshot-every apart) join "
                            "the opponent pool, frozen (0: the population plays only itself).", min=0)
    league_fraction: float = option(0.5, "With --league: the fraction of game slots played against it.",
                                    min=0.0, max=1.0)
    league_sampling: str = option("uniform", "With --league: uniform over its members, or pfsp (prioritised "
                                             "fictitious self-play: a snapshot weighted by (1 - the population's "
                                             "recent score against it)^2).", choices=LEAGUE_SAMPLING)
    seed: int = option(0, "Seed of every random stream.")
    # Selective replication with variation (see docs/tournaments.md).
    replicate_every: int = option(0, "Episodes between selective replications: rank the population, copy the best "
                                     "over the worst (0: off).", min=0)
    replicate_fraction: float = option(0.25, "Fraction of the population replaced at each replication, "
                                             "in (0, 0.5].")
    mutate_weights: float = option(0.01, "Std of Gaussian noise added to every weight of a copy (0: exact copies).")
    mutate_params: float = option(1.0, "A copy's alpha, lambda, epsilon are multiplied by log-uniform factors in "
                                       "[1/S, S] (1: unchanged; lambda and epsilon stay in [0, 1]).")
    mutate_lookahead: float = option(0.0, "Chance that a copy switches its move chooser between one and two plies "
                                          "(each agent keeps its own --lookahead, the league's snapshots theirs): "
                                          "selection then decides whether looking deeper pays for its cost "
                                          "(0: a copy looks as deep as its parent).", min=0.0, max=1.0)
    mutate_width: float = option(0.0, "Chance that a copy halves or doubles its number of switched-on first-layer "
                                      "units, within [1, --hidden] (new units start with small random input "
                                      "weights and zero output weights: the copy plays as its parent until it "
                                      "learns; 0: a copy keeps its parent's width).", min=0.0, max=1.0)
    mutate_width2: float = option(0.0, "As --mutate-width, for the second hidden layer's switched-on units, within "
                                       "[1, --hidden2], from a stream of its own (needs --hidden2).",
                                  min=0.0, max=1.0)
    tournament_games: int = option(2, "Games per pair in the ranking round robin (half moving first); 0 ranks by "
                                      "the mean learning score since the last replication instead (no extra games).")
    tournament_pairing: str = option("uniform", "uniform: every pair of the ranking round robin plays "
                                                "--tournament-games; adaptive: the same budget, half spread evenly, "
                                                "the rest in rounds of 2 games to the pairs whose order is still "
                                                "undecided.", choices=PAIRINGS)
    replicate_when: str = option("always", "always: the worst are replaced by the best at every replication; "
                                           "significant: only where the parent's rating interval (at "
                                           "--replicate-confidence) lies wholly above the child's (needs "
                                           "--tournament-games).", choices=REPLICATE_WHEN)
    replicate_confidence: float = option(0.95, "With --replicate-when significant: the rating intervals' "
                                               "confidence, in (0, 1).")

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks = [
            (1 <= self.rows <= MAX_SIDE, "rows", f"must lie in [1, {MAX_SIDE}]"),
            (1 <= self.cols <= MAX_SIDE, "cols", f"must lie in [1, {MAX_SIDE}]"),
            (self.pieces >= 1, "pieces", "must be at least 1"),
            (2 * self.pieces <= self.rows * self.cols, "pieces",
             f"must fit twice on the board ({self.rows}x{self.cols} has {self.rows * self.cols} squares)"),
            (1 <= self.max_turns <= 100_000, "max_turns", "must lie in [1, 100000]"),
            (self.agents >= 1, "agents", "must be at least 1"),
            (self.games_per_agent >= 1, "games_per_agent", "must be at least 1"),
            (self.episodes >= 1, "episodes", "must be at least 1"),
            (1 <= self.hidden <= 1024, "hidden", "must lie in [1, 1024]"),
            (0 <= self.hidden2 <= 1024, "hidden2", "must lie in [0, 1024] (0: no second layer)"),
            (0 <= self.start_width <= self.hidden, "start_width",
             f"must lie in [0, --hidden = {self.hidden}] (0: every unit on)"),
            (0.0 <= self.mutate_width <= 1.0, "mutate_width", "must lie in [0, 1]"),
            (0 <= self.start_width2 <= self.hidden2, "start_width2",
             f"must lie in [0, --hidden2 = {self.hidden2}] (0: every unit on; a second layer needs --hidden2)"),
            (0.0 <= self.mutate_width2 <= 1.0, "mutate_width2", "must lie in [0, 1]"),
            (self.mutate_width2 == 0.0 or self.hidden2 > 0, "mutate_width2",
             "varies the second hidden layer: add --hidden2"),
            (self.lookahead in (1, 2), "lookahead", "must be 1 or 2"),
            (not self.td_leaf or self.lookahead == 2 or self.mutate_lookahead > 0.0, "td_leaf",
             "learns from the leaves of a two-ply search: add --lookahead 2 (or --mutate-lookahead, so that "
             "copies that switch to two plies learn so)"),
            (self.dtype in DTYPES, "dtype", f"must be one of {', '.join(DTYPES)}"),
            (math.isfinite(self.alpha) and self.alpha > 0.0, "alpha", "must be positive"),
            (self.alpha_half_life >= 0, "alpha_half_life", "must be non-negative (0: constant step size)"),
            (0.0 <= self.lam <= 1.0, "lam", "must lie in [0, 1]"),
            (0.0 <= self.epsilon <= 1.0, "epsilon", "must lie in [0, 1]"),
            (math.isfinite(self.init_scale) and self.init_scale >= 0.0, "init_scale", "must be non-negative"),
            (self.eval_every >= 1, "eval_every", "must be at least 1"),
            (math.isfinite(self.eval_every_seconds) and self.eval_every_seconds >= 0.0, "eval_every_seconds",
             "must be non-negative (0: by episodes only)"),
            (self.eval_games >= 2, "eval_games", "must be at least 2 (half move first)"),
            (self.snapshot_every >= 0, "snapshot_every", "must be non-negative (0: no snapshots)"),
            (self.league >= 0, "league", "must be non-negative (0: no league)"),
            (self.league == 0 or self.snapshot_every > 0, "league",
             "needs snapshots to draw its members from (--snapshot-every above 0)"),
            (0.0 <= self.league_fraction <= 1.0, "league_fraction", "must lie in [0, 1]"),
            (self.league_sampling in LEAGUE_SAMPLING, "league_sampling", f"must be one of {', '.join(LEAGUE_SAMPLING)}"),
            (self.replicate_every >= 0, "replicate_every", "must be non-negative (0: no replication)"),
            (self.replicate_every == 0 or self.agents >= 2, "agents", "must be at least 2 to replicate"),
            (0.0 < self.replicate_fraction <= 0.5, "replicate_fraction", "must lie in (0, 0.5]"),
            (math.isfinite(self.mutate_weights) and self.mutate_weights >= 0.0, "mutate_weights",
             "must be non-negative (0: no weight noise)"),
            (math.isfinite(self.mutate_params) and self.mutate_params >= 1.0, "mutate_params",
             "must be at least 1 (1: no parameter variation)"),
            (self.tournament_pairing in PAIRINGS, "tournament_pairing", f"must be one of {', '.join(PAIRINGS)}"),
            (self.replicate_when in REPLICATE_WHEN, "replicate_when", f"must be one of {', '.join(REPLICATE_WHEN)}"),
            (self.replicate_when == "always" or self.tournament_games > 0, "replicate_when",
             "significant compares tournament ratings: give --tournament-games above 0"),
            (0.0 < self.replicate_confidence < 1.0, "replicate_confidence", "must lie in (0, 1)"),
            (self.tournament_games >= 0, "tournament_games",
             "must be non-negative (0: rank by the learning scores since the last selection)"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name} {message} (got {getattr(self, name)!r})")
        parse_jumps(self.jumps)
        parse_opponents(self.eval_opponents)

    @property
    def widths_vary(self) -> bool:
        """Whether some agent may have units switched off, in either hidden layer (see
        :func:`off_units`, :func:`off_units2`)."""
        return 0 < self.start_width < self.hidden or self.mutate_width > 0.0 or self.widths2_vary

    @property
    def widths2_vary(self) -> bool:
        """Whether some agent may have second-layer units switched off."""
        return 0 < self.start_width2 < self.hidden2 or self.mutate_width2 > 0.0

    @property
    def copies_vary(self) -> bool:
        """Whether selective replication's copies differ from their parents (any mutation on)."""
        return (self.mutate_params > 1.0 or self.mutate_weights > 0.0 or self.mutate_lookahead > 0.0
                or self.mutate_width > 0.0 or self.mutate_width2 > 0.0)

    def schedule_warnings(self) -> list[str]:
        """What an episode budget will not do that the settings ask for."""
        return replication_warning(self.replicate_every, self.episodes, "episodes")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def geometry(self) -> "Geometry":
        return geometry(self.rows, self.cols, self.jumps)

    @property
    def inputs(self) -> int:
        return 2 * self.rows * self.cols


def parse_opponents(spec: str) -> tuple[str, ...]:
    """Benchmark opponents from a comma-separated list (e.g. ``"random,greedy"``;
    ``ladder`` stands for every rung of the ladder)."""
    parts = [part.strip().lower() for part in str(spec).split(",") if part.strip()]
    names = tuple(dict.fromkeys(name for part in parts for name in (LADDER_RUNGS if part == "ladder" else (part,))))
    bad = [name for name in names if name not in OPPONENTS]
    if not names or bad:
        raise ValueError(f"eval_opponents must list some of {', '.join(OPPONENTS)} or ladder (got {spec!r})")
    return names


# ---------------------------------------------------------------------------
# Board geometry and the public game API (single boards, for users writing bots)


@dataclass(frozen=True)
class Geometry:
    """A board size and jump pattern, with the jump table the engines use."""

    rows: int
    cols: int
    offsets: tuple[tuple[int, int], ...]

    @property
    def squares(self) -> int:
        return self.rows * self.cols

    @property
    def table(self) -> np.ndarray:
        """(squares + 1, len(offsets)) int64: target square of each offset, −1 off the
        board; the extra last row (all −1) serves captured pieces in the torch engine."""
        return _jump_table(self.rows, self.cols, self.offsets)


@lru_cache(maxsize=64)
def _jump_table(rows: int, cols: int, offsets: tuple[tuple[int, int], ...]) -> np.ndarray:
    table = np.full((rows * cols + 1, len(offsets)), -1, dtype=np.int64)
    for r in range(rows):
        for c in range(cols):
            for j, (dr, dc) in enumerate(offsets):
                if 0 <= r + dr < rows and 0 <= c + dc < cols:
                    table[r * cols + c, j] = (r + dr) * cols + c + dc
    table.setflags(write=False)
    return table


def geometry(rows: int = 5, cols: int = 7, jumps: str | Sequence[tuple[int, int]] = "knight") -> Geometry:
    """The :class:`Geometry` of a board; ``jumps`` is ``"knight"``, a spec string or offsets."""
    offsets = parse_jumps(jumps) if isinstance(jumps, str) else tuple((int(a), int(b)) for a, b in jumps)
    return Geometry(int(rows), int(cols), offsets)


def _check_board(board: Any) -> np.ndarray:
    array = np.asarray(board)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"board must be a 2-D array (rows, cols), got shape {array.shape}")
    if array.dtype.kind not in "biu" or not np.isin(array, (-1, 0, 1)).all():
        raise ValueError("board must hold only -1 (O), 0 (empty) and +1 (X)")
    return array.astype(np.int8, copy=False)


def _check_player(player: int) -> int:
    if player not in (1, -1):
        raise ValueError(f"player must be +1 (X) or -1 (O), got {player!r}")
    return int(player)


def legal_moves(board: np.ndarray, player: int,
                jumps: str | Sequence[tuple[int, int]] = "knight") -> list[tuple[int, int]]:
    """Every legal move ``(from_square, to_square)`` of ``player`` on ``board``.

    A move jumps one of ``player``'s pieces by a jump offset to a square on the board
    that does not hold one of ``player``'s own pieces (an opposing piece there is
    captured). Ordered by from-square, then by offset. An empty list means the
    player must pass.
    """
    board = _check_board(board)
    player = _check_player(player)
    rows, cols = board.shape
    table = geometry(rows, cols, jumps).table
    flat = board.reshape(-1)
    moves = []
    for square in np.flatnonzero(flat == player):
        for target in table[square]:
            if target >= 0 and flat[target] != player:
                moves.append((int(square), int(target)))
    return moves


def apply_move(board: np.ndarray, move: tuple[int, int],
               jumps: str | Sequence[tuple[int, int]] = "knight") -> np.ndarray:
    """The board after ``move`` (a new array); raises ValueError for an illegal move.

    The mover is whoever owns the piece on the from-square.
    """
    board = _check_board(board)
    try:
        start, target = (int(v) for v in move)
    except (TypeError, ValueError):
        raise ValueError(f"a move is a pair (from_square, to_square), got {move!r}") from None
    flat = board.reshape(-1)
    if not (0 <= start < flat.size and 0 <= target < flat.size):
        raise ValueError(f"move {move!r} leaves the board (squares 0..{flat.size - 1})")
    player = int(flat[start])
    if player == 0 or (start, target) not in legal_moves(board, player, jumps):
        raise ValueError(f"move {move!r} is not legal on this board")
    new = flat.copy()
    new[target] = player
    new[start] = 0
    return new.reshape(board.shape)


def winner(board: np.ndarray) -> int:
    """+1 if X has captured every O piece, −1 if O has captured every X piece, else 0."""
    board = _check_board(board)
    has_x, has_o = bool((board == 1).any()), bool((board == -1).any())
    if has_x and not has_o:
        return 1
    if has_o and not has_x:
        return -1
    return 0


def outcome(board: np.ndarray, plies: int, max_turns: int = DEFAULT_MAX_TURNS) -> int | None:
    """The result after ``plies`` plies: +1/−1 for a win, 0 for a draw at the turn
    limit, None while the game goes on."""
    won = winner(board)
    if won:
        return won
    return 0 if plies >= max_turns else None


def move_action(table: np.ndarray, move: tuple[int, int]) -> int:
    """The action of ``move`` (from, to) for other libraries' agents (PettingZoo's,
    gymnasium's): ``from · jumps + j`` where jump ``j`` of the jump ``table`` takes
    ``from`` to ``to``; the pass is action ``squares · jumps``."""
    start, target = move
    return start * table.shape[1] + int(np.flatnonzero(table[start] == target)[0])


def action_move(table: np.ndarray, action: int) -> tuple[int, int] | None:
    """The move (from, to) of ``action`` (:func:`move_action`'s inverse); None for the
    pass, or for a jump that leaves the board."""
    start, jump = divmod(int(action), table.shape[1])
    if start >= table.shape[0]:
        return None
    target = int(table[start, jump])
    return (start, target) if target >= 0 else None


def encode(board: np.ndarray, player: int) -> np.ndarray:
    """The network input for ``player``: float64, shaped (2 · squares,): 1 where
    ``player`` has a piece, then 1 where the opponent has one."""
    board = _check_board(board)
    player = _check_player(player)
    flat = board.reshape(-1)
    return np.concatenate([(flat == player), (flat == -player)]).astype(np.float64)


def random_board(rows: int = 5, cols: int = 7, pieces: int = 5, *, seed: int = 0, game: int = 0) -> np.ndarray:
    """A starting position: ``pieces`` of each side on distinct random squares (the
    position game ``game`` of stream family ``seed`` starts from)."""
    if 2 * pieces > rows * cols or pieces < 1:
        raise ValueError(f"{pieces} pieces per side do not fit on a {rows}x{cols} board")
    key = int(_rng.stream_keys(seed, TAG_MATCH, [game])[0])
    return start_position(key, rows, cols, pieces)


def start_position(key: int, rows: int, cols: int, pieces: int, base: int = 0) -> np.ndarray:
    """The starting board of the game with stream ``key`` (words ``base .. base+2k-1``)."""

    r = _rng.make_rng(py)
    squares = list(range(rows * cols))
    for i in range(2 * pieces):
        u = r.uniform53(r.draw(int(key), r.mix_counter(base + i)))
        j = i + int(math.floor(u * (len(squares) - i)))
        squares[i], squares[j] = squares[j], squares[i]
    flat = np.zeros(rows * cols, dtype=np.int8)
    flat[squares[:pieces]] = 1
    flat[squares[pieces:2 * pieces]] = -1
    return flat.reshape(rows, cols)


# ---------------------------------------------------------------------------
# Square names for people: columns a, b, c... left to right, rows 1, 2, 3... top down


def square_name(square: int, cols: int) -> str:
    row, col = divmod(int(square), cols)
    return f"{chr(ord('a') + col)}{row + 1}"


def parse_square(text: str, rows: int, cols: int) -> int:
    """A square from ``"b3"`` (column letter, row number) or its number ``"15"``."""
    text = text.strip().lower()
    if text.isdigit():
        square = int(text)
        if square < rows * cols:
            return square
        raise ValueError(f"square {text} is off the board (0..{rows * cols - 1})")
    if len(text) >= 2 and text[0].isalpha() and text[1:].isdigit():
        col, row = ord(text[0]) - ord("a"), int(text[1:]) - 1
        if 0 <= col < cols and 0 <= row < rows:
            return row * cols + col
    raise ValueError(f"{text!r} is not a square (a1..{chr(ord('a') + cols - 1)}{rows} or 0..{rows * cols - 1})")


# ---------------------------------------------------------------------------
# Networks


class Network(NamedTuple):
    """One agent's value network: V = σ(b2 + w2 · σ(b1 + x w1)); with a second hidden
    layer, V = σ(b2 + w2 · σ(bm + σ(b1 + x w1) wm))."""

    w1: np.ndarray  # (2 · squares, hidden)
    b1: np.ndarray  # (hidden,)
    w2: np.ndarray  # (hidden,) or (hidden2,)
    b2: np.ndarray  # () float
    wm: np.ndarray | None = None  # (hidden, hidden2): the second hidden layer's weights (None: no such layer)
    bm: np.ndarray | None = None  # (hidden2,)
    plies: int | None = None  # how deep its move chooser looks (None: the run's --lookahead)


class Networks(NamedTuple):
    """A bank of networks with the agent axis leading (what the engines play with)."""

    w1: np.ndarray  # (agents, 2 · squares, hidden)
    b1: np.ndarray  # (agents, hidden)
    w2: np.ndarray  # (agents, hidden), or (agents, hidden2) with a second hidden layer
    b2: np.ndarray  # (agents,)
    wm: np.ndarray | None = None  # (agents, hidden, hidden2): the second hidden layer (None: none)
    bm: np.ndarray | None = None  # (agents, hidden2)
    # (agents,) int64: plies each network's move chooser looks ahead (None: the run's --lookahead
    # for all). Not a weight: pack() leaves it out.
    plies: np.ndarray | None = None

    def agent(self, index: int) -> Network:
        middle = (None, None) if self.wm is None else (self.wm[index], self.bm[index])
        plies = None if self.plies is None else int(self.plies[index])
        return Network(self.w1[index], self.b1[index], self.w2[index], np.asarray(self.b2[index]), *middle, plies)

    @property
    def count(self) -> int:
        return int(self.b2.shape[0])

    @property
    def hidden2(self) -> int:
        """Units of the second hidden layer (0: none)."""
        return 0 if self.wm is None else int(self.wm.shape[2])

    def middle(self) -> tuple[np.ndarray, np.ndarray]:
        """(wm, bm) as arrays for the engines: zero columns where there is no second layer."""
        if self.wm is not None:
            return self.wm, self.bm
        count, hidden = self.b1.shape
        return np.zeros((count, hidden, 0)), np.zeros((count, 0))

    def arrays(self) -> dict[str, np.ndarray]:
        """The named arrays, the second layer's only where there is one."""
        out = {"w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2}
        if self.wm is not None:
            out.update(wm=self.wm, bm=self.bm)
        return out

    def stacked(self, others: Sequence["Networks"]) -> "Networks":
        """These networks, then ``others``' (of the same shape), in one bank (with their
        chooser depths where every part has them)."""
        parts = [self, *others]
        plies = (None if any(part.plies is None for part in parts)
                 else np.concatenate([part.plies for part in parts]).astype(np.int64))
        return Networks(**{name: np.ascontiguousarray(np.concatenate([value] + [o.arrays()[name] for o in others]))
                           for name, value in self.arrays().items()}, plies=plies)

    def take(self, rows: Sequence[int] | np.ndarray) -> "Networks":
        """The networks ``rows`` (slots), in that order: contiguous copies, their chooser
        depths with them."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        cut = {name: np.ascontiguousarray(value[rows]) for name, value in self.arrays().items()}
        return Networks(**cut, plies=None if self.plies is None else self.plies[rows].copy())

    def choosing(self, plies: np.ndarray | int | None) -> "Networks":
        """These networks with the chooser depths ``plies`` (one for all, or one each)."""
        return self._replace(plies=None if plies is None else
                             np.ascontiguousarray(np.broadcast_to(np.asarray(plies, dtype=np.int64), (self.count,))))


def parameter_count(inputs: int, hidden: int, hidden2: int = 0) -> int:
    """Weights of one network, in the flat order w1 (row-major), b1, [wm (row-major),
    bm,] w2, b2."""
    return inputs * hidden + hidden + hidden * hidden2 + hidden2 + (hidden2 or hidden) + 1


def unpack(flat: np.ndarray, inputs: int, hidden: int, hidden2: int = 0) -> Networks:
    """Split flat parameter rows (agents, P) into a :class:`Networks`."""
    n = inputs * hidden
    w1, b1 = flat[:, :n].reshape(-1, inputs, hidden), flat[:, n:n + hidden]
    at = n + hidden
    middle = {}
    if hidden2:
        middle = {"wm": flat[:, at:at + hidden * hidden2].reshape(-1, hidden, hidden2),
                  "bm": flat[:, at + hidden * hidden2:at + hidden * hidden2 + hidden2]}
        at += hidden * hidden2 + hidden2
    out = hidden2 or hidden
    return Networks(w1, b1, flat[:, at:at + out], flat[:, at + out], **middle)


def pack(nets: Networks) -> np.ndarray:
    """The inverse of :func:`unpack`: (agents, P) float64."""
    agents = nets.b2.shape[0]
    middle = [] if nets.wm is None else [nets.wm.reshape(agents, -1), nets.bm]
    return np.concatenate([nets.w1.reshape(agents, -1), nets.b1, *middle, nets.w2, nets.b2[:, None]], axis=1)


def off_units(nets: Networks) -> np.ndarray:
    """(agents, hidden) bool: the first-layer units switched off, every weight into and
    out of them exactly zero. Such a unit's sigmoid sits at 1/2 and reaches nothing, so
    the network computes what one without the unit computes; :func:`unit_parameters`
    keeps learning and mutation off it (``--start-width``, ``--mutate-width``)."""
    w1, b1 = np.asarray(nets.w1), np.asarray(nets.b1)
    outgoing = np.asarray(nets.w2) == 0.0 if nets.wm is None else (np.asarray(nets.wm) == 0.0).all(axis=2)
    return (w1 == 0.0).all(axis=1) & (b1 == 0.0) & outgoing


def off_units2(nets: Networks) -> np.ndarray:
    """(agents, hidden2) bool: the second-layer units switched off, as :func:`off_units`
    for the first layer (every weight into and out of them exactly zero); (agents, 0)
    without a second layer."""
    if nets.wm is None:
        return np.zeros((nets.count, 0), dtype=bool)
    wm, bm, w2 = np.asarray(nets.wm), np.asarray(nets.bm), np.asarray(nets.w2)
    return (wm == 0.0).all(axis=1) & (bm == 0.0) & (w2 == 0.0)


def _units_on(off: np.ndarray) -> np.ndarray:
    return (off.shape[1] - off.sum(axis=1)).astype(np.int64)


def unit_widths(nets: Networks) -> np.ndarray:
    """(agents,) int64: each network's first-layer units switched on."""
    return _units_on(off_units(nets))


def unit_widths2(nets: Networks) -> np.ndarray:
    """(agents,) int64: each network's second-layer units switched on (0 without one)."""
    return _units_on(off_units2(nets))


def units_between(low: np.ndarray, high: np.ndarray, size: int) -> np.ndarray:
    """(agents, size) bool: unit j of row a where ``low[a] <= j < high[a]`` (the units a
    width change switches on, or those beyond a width with ``high`` = ``size``)."""
    units = np.arange(size)[None, :]
    return (units >= np.asarray(low)[:, None]) & (units < np.asarray(high)[:, None])


def unit_parameters(units: np.ndarray, inputs: int, hidden2: int = 0, *, incoming_only: bool = False) -> np.ndarray:
    """(agents, parameter_count) bool, in :func:`pack`'s order: the weights into and out
    of the first-layer ``units`` ((agents, hidden) bool); only those into them with
    ``incoming_only``."""
    agents, hidden = units.shape
    out = np.zeros((agents, hidden), dtype=bool) if incoming_only else units
    nets = Networks(np.broadcast_to(units[:, None, :], (agents, inputs, hidden)), units,
                    np.zeros((agents, hidden2), dtype=bool) if hidden2 else out, np.zeros(agents, dtype=bool),
                    *((np.broadcast_to(out[:, :, None], (agents, hidden, hidden2)),
                       np.zeros((agents, hidden2), dtype=bool)) if hidden2 else ()))
    return pack(nets)


def unit_parameters2(units2: np.ndarray, inputs: int, hidden: int, *, incoming_only: bool = False) -> np.ndarray:
    """(agents, parameter_count) bool, in :func:`pack`'s order: the weights into and out
    of the second-layer ``units2`` ((agents, hidden2) bool); only those into them with
    ``incoming_only``."""
    agents, hidden2 = units2.shape
    nothing = np.zeros((agents, inputs, hidden), dtype=bool)
    nets = Networks(nothing, nothing[:, 0], np.zeros_like(units2) if incoming_only else units2,
                    np.zeros(agents, dtype=bool), np.broadcast_to(units2[:, None, :], (agents, hidden, hidden2)),
                    units2)
    return pack(nets)


def frozen_parameters(nets: Networks, inputs: int) -> np.ndarray:
    """(agents, parameter_count) bool: the weights of every switched-off unit, in either
    hidden layer: what learning and weight noise must leave at exactly zero."""
    frozen = unit_parameters(off_units(nets), inputs, nets.hidden2)
    if nets.wm is not None:
        frozen |= unit_parameters2(off_units2(nets), inputs, int(nets.b1.shape[1]))
    return frozen


def with_widths(flat: np.ndarray, widths: np.ndarray, inputs: int, hidden: int, hidden2: int = 0,
                widths2: np.ndarray | None = None) -> np.ndarray:
    """``flat`` (agents, P) with every first-layer unit from each row's width on (and,
    given ``widths2``, every second-layer unit from its second-layer width on) switched
    off, its weights zeroed; in place, returned."""
    flat[unit_parameters(units_between(widths, np.full(len(widths), hidden), hidden), inputs, hidden2)] = 0.0
    if widths2 is not None and hidden2:
        flat[unit_parameters2(units_between(widths2, np.full(len(widths2), hidden2), hidden2), inputs, hidden)] = 0.0
    return flat


def _sigmoid(x: Any) -> Any:
    return npx.sigmoid(x)


def value(net: Network, board: np.ndarray, player: int) -> float:
    """V of ``board`` for ``player`` (who has just moved): its estimated chance to win."""
    x = encode(board, player)
    _check_network(net, x.size)
    hidden = _sigmoid(np.asarray(net.b1) + x @ np.asarray(net.w1))
    if net.wm is not None:
        hidden = _sigmoid(np.asarray(net.bm) + hidden @ np.asarray(net.wm))
    return float(_sigmoid(float(net.b2) + hidden @ np.asarray(net.w2)))


def move_values(net: Network, board: np.ndarray, player: int,
                jumps: str | Sequence[tuple[int, int]] = "knight") -> list[tuple[tuple[int, int], float]]:
    """Every legal move of ``player`` with the value of its after-state, in canonical order."""
    return [(move, value(net, apply_move(board, move, jumps), player))
            for move in legal_moves(board, player, jumps)]


def best_move(net: Network, board: np.ndarray, player: int,
              jumps: str | Sequence[tuple[int, int]] = "knight") -> tuple[int, int] | None:
    """The greedy agent's move (first maximum in canonical order), None to pass."""
    scored = move_values(net, board, player, jumps)
    if not scored:
        return None
    best = max(v for _, v in scored)
    return next(m for m, v in scored if v == best)


def _check_network(net: Network, inputs: int) -> None:
    w1 = np.asarray(net.w1)
    if w1.ndim != 2 or w1.shape[0] != inputs:
        raise ValueError(f"network expects {w1.shape[0] if w1.ndim == 2 else '?'} inputs, board gives {inputs}")


def init_networks(seed: int, agent_slots: np.ndarray, inputs: int, hidden: int, scale: float,
                  hidden2: int = 0) -> Networks:
    """Initial weights, uniform on [−scale, scale], from each agent slot's own stream
    (word i of a slot's stream is flat parameter i)."""
    r = _rng._numpy_rng()
    count = parameter_count(inputs, hidden, hidden2)
    keys = _rng.stream_keys(seed, TAG_INIT, agent_slots)[:, None]
    counters = np.arange(count, dtype=np.int64)[None, :]
    u = r.uniform53(r.draw(keys, r.mix_counter(counters)))
    return unpack(scale * (2.0 * u - 1.0), inputs, hidden, hidden2)


# ---------------------------------------------------------------------------
# Rules shared by the engines (written once for popplay.xp namespaces)


def make_rules(xp: Any) -> SimpleNamespace:
    """The per-ply choices and the TD(λ) recursion for array namespace ``xp``."""
    rng = _rng.make_rng(xp)
    uniform_hi32 = rng.uniform_hi32
    uniform_lo32 = rng.uniform_lo32
    sigmoid = xp.sigmoid

    @xp.fn
    def pick(u, n):
        """The floor(u · n)-th of n choices (u uniform on [0, 1))."""
        return xp.to_int(xp.floor(u * xp.to_float(n)))

    @xp.fn
    def explores(word, eps):
        return uniform_hi32(word) < eps

    @xp.fn
    def choice(word):
        return uniform_lo32(word)

    @xp.fn
    def opponent(agent, u, agents):
        """A uniformly drawn other member of a population of ``agents`` >= 2."""
        return (agent + 1 + pick(u, agents - 1)) % agents

    @xp.fn
    def lambda_return_error(c_next, target, v, lam):
        """c_t = δ_t + λ c_{t+1}: the forward-view weight of ∇V(s_t) (see engine docs)."""
        return (target - v) + lam * c_next

    @xp.fn
    def reward(result, player):
        """1 win, 0 loss, 0.5 draw for ``player`` (+1/−1) given ``result`` (+1/−1/0)."""
        return xp.where(result == 0, 0.5, xp.where(result == player, 1.0, 0.0))

    return SimpleNamespace(sigmoid=sigmoid, pick=pick, explores=explores, choice=choice, opponent=opponent,
                           lambda_return_error=lambda_return_error, reward=reward, rng=rng)


def words_per_game(pieces: int, max_turns: int) -> int:
    """Counter words one game uses: placement of 2k pieces plus one per ply."""
    return 2 * int(pieces) + int(max_turns)


# ---------------------------------------------------------------------------
# Population state


class Snapshot(NamedTuple):
    """The population's networks and learning parameters after ``episode`` episodes."""

    episode: int
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    alpha: np.ndarray
    lam: np.ndarray
    epsilon: np.ndarray
    agent_id: np.ndarray
    wm: np.ndarray | None = None  # the second hidden layer (None: none)
    bm: np.ndarray | None = None
    plies: np.ndarray | None = None  # each agent's chooser depth (None: the run's --lookahead)

    @property
    def networks(self) -> Networks:
        return Networks(self.w1, self.b1, self.w2, self.b2, self.wm, self.bm, self.plies)


class KnightsState(NamedTuple):
    """Changing state between episodes; every array has the agent axis leading."""

    w1: np.ndarray  # (agents, 2 · squares, hidden) float64
    b1: np.ndarray  # (agents, hidden)
    w2: np.ndarray  # (agents, hidden)
    b2: np.ndarray  # (agents,)
    alpha: np.ndarray  # (agents,) step size of each agent
    lam: np.ndarray  # (agents,) trace decay λ of each agent
    epsilon: np.ndarray  # (agents,) exploration of each agent
    agent_id: np.ndarray  # (agents,) int64 stable identity (lineage)
    score: np.ndarray  # (agents,) learning score (wins + draws/2)/games in the last episode (0.5 before)
    eval_record: np.ndarray  # (opponents, agents, 3) int64 wins, draws, losses at the last evaluation
    eval_episode: np.ndarray  # (1,) int64: episode of the last evaluation (−1: none yet)
    episode: int  # episodes done
    turns: int  # agent turns (plies of every learning game) so far
    snapshots: tuple[Snapshot, ...]  # periodic copies of the population
    score_history: tuple[np.ndarray, ...] = ()  # every episode's learning scores (agents,)
    fitness: np.ndarray | None = None  # (agents,) what the last selection ranked by (NaN before any)
    lineage: Any = None  # popplay.operators.evolution.Lineage: every operator applied to the agents
    league_score: np.ndarray | None = None  # (snapshots,) the population's recent score against each snapshot
    wm: np.ndarray | None = None  # (agents, hidden, hidden2): the second hidden layer (None: none)
    bm: np.ndarray | None = None  # (agents, hidden2)
    plies: np.ndarray | None = None  # (agents,) int64: each agent's chooser depth (None: the run's --lookahead)
    # (agents,) float64: each agent's step-size half-life in episodes (0: constant; None: the run's
    # --alpha-half-life for all)
    half_life: np.ndarray | None = None

    @property
    def networks(self) -> Networks:
        return Networks(self.w1, self.b1, self.w2, self.b2, self.wm, self.bm, self.plies)

    def with_networks(self, nets: Networks, **changes: Any) -> "KnightsState":
        """This state with ``nets`` as its networks (contiguous copies, their chooser
        depths where they carry them) and ``changes``."""
        arrays = {name: np.ascontiguousarray(value) for name, value in nets.arrays().items()}
        if nets.plies is not None:
            arrays["plies"] = np.ascontiguousarray(nets.plies, dtype=np.int64)
        return self._replace(**arrays, **changes)

    def snapshot(self) -> Snapshot:
        copy = lambda a: None if a is None else a.copy()  # noqa: E731
        return Snapshot(self.episode, self.w1.copy(), self.b1.copy(), self.w2.copy(), self.b2.copy(),
                        self.alpha.copy(), self.lam.copy(), self.epsilon.copy(), self.agent_id.copy(),
                        copy(self.wm), copy(self.bm), copy(self.plies))


# Parameters the lineage records for knights agents (values after each event;
# ``noise``: the standard deviation of the weight noise a mutation added; ``plies``: the
# agent's chooser depth; ``width``: its first-layer units switched on; ``half_life``: its
# step-size schedule's, in episodes, 0 for none; ``width2``: its second-layer units
# switched on, 0 without a second layer).
LINEAGE_PARAMETERS = ("alpha", "lam", "epsilon", "noise", "plies", "width", "half_life", "width2")


def founders(params: KnightsParams, agent_slots: np.ndarray) -> Networks:
    """The initial networks of ``agent_slots`` (also what a diverged agent is reset to):
    :func:`init_networks`, with the units beyond ``--start-width`` (and
    ``--start-width2``) switched off."""
    nets = init_networks(params.seed, agent_slots, params.inputs, params.hidden, params.init_scale, params.hidden2)
    if not (0 < params.start_width < params.hidden or 0 < params.start_width2 < params.hidden2):
        return nets
    flat = with_widths(pack(nets), np.full(len(agent_slots), params.start_width or params.hidden), params.inputs,
                       params.hidden, params.hidden2, np.full(len(agent_slots), params.start_width2 or params.hidden2))
    return unpack(flat, params.inputs, params.hidden, params.hidden2)


def initial_state(params: KnightsParams) -> KnightsState:
    agents = params.agents
    nets = founders(params, np.arange(agents))
    full = lambda v: np.full(agents, v, dtype=np.float64)  # noqa: E731
    opponents = len(parse_opponents(params.eval_opponents))
    ids = np.arange(agents, dtype=np.int64)
    lineage = Lineage.start(ids, LINEAGE_PARAMETERS, {"alpha": params.alpha, "lam": params.lam,
                                                      "epsilon": params.epsilon, "plies": params.lookahead,
                                                      "width": params.start_width or params.hidden,
                                                      "width2": params.start_width2 or params.hidden2,
                                                      "half_life": params.alpha_half_life})
    state = KnightsState(
        np.ascontiguousarray(nets.w1), np.ascontiguousarray(nets.b1), np.ascontiguousarray(nets.w2),
        np.ascontiguousarray(nets.b2), full(params.alpha), full(params.lam), full(params.epsilon),
        ids, full(0.5), np.zeros((opponents, agents, 3), dtype=np.int64),
        np.full(1, -1, dtype=np.int64), 0, 0, (), (), full(np.nan), lineage,
    ).with_networks(nets.choosing(params.lookahead), half_life=full(params.alpha_half_life))
    return state._replace(snapshots=(state.snapshot(),)) if params.snapshot_every else state


# ---------------------------------------------------------------------------
# Batched play: the entry point for learning, evaluation and tournaments


class GameBatch(NamedTuple):
    """Who plays each game: per game and side (0 = X, who moves first)."""

    kind: np.ndarray  # (games, 2) int64: KIND_NET, KIND_RANDOM, KIND_GREEDY, KIND_SEARCH
    net: np.ndarray  # (games, 2) int64: network index where kind is KIND_NET
    epsilon: np.ndarray  # (games, 2) float64: exploration of network players
    learn: np.ndarray  # (games, 2) bool: accumulate this side's TD(λ) change
    keys: np.ndarray  # (games,) int64: each game's random stream


class Played(NamedTuple):
    """What a batch of games produced."""

    result: np.ndarray  # (games,) int8: +1 X won, −1 O won, 0 draw
    plies: np.ndarray  # (games,) int64: plies played (turns)
    delta: np.ndarray | None  # (networks, P) Σ c_t ∇V per network (unscaled by α), None without learners

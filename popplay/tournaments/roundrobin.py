"""Round-robin tournaments between knights players, batched on the engine.

Every pair of players meets for ``games`` games, half with each side moving first,
and all games of all pairs are played in one batch (in chunks of at most
``MAX_BATCH`` games to bound memory), never pair by pair. Players are network
indices (>= 0) or benchmark bots (:data:`popplay.games.knights.rules.OPPONENTS`: −1
random, −2 greedy, −3 search).

Common random numbers: game j of every pair starts from the same position and uses
the same dice (stream ``(seed, tag, 0, j)`` at counter ``base``), so every player
meets the same set of starting positions. With an odd number of games the pairs
alternate which player gets the extra first move (pair k: the lower-indexed player
when k is even), so no player is favoured overall.

Results: ``wins[i, j]`` games i won against j, ``draws`` (symmetric), ``losses`` =
``wins.T``, and the score matrix s_ij = (wins_ij + draws_ij/2) / games_ij, with
s_ij + s_ji = 1 off the diagonal (NaN on it). Ratings: :func:`elo_ratings` (Elo
scale, base 10, 400 points per factor of ten in odds, fitted by maximum likelihood;
mean 0, or the anchor player at 0).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from popplay import stats
from popplay.distributed import collectives
from popplay.distributed.group import current
from popplay.games.knights import engine
from popplay.games.knights.rules import KnightsParams, Networks
from popplay.tournaments.ratings import elo_ratings, elo_standard_errors, score_matrix

# Random-stream families of tournaments (knights' own tags are 32-36).
TAG_TOURNAMENT = 48  # `popplay tournament` and round_robin's default
TAG_SELECTION = 49  # the ranking round robins of selective replication during training

MAX_BATCH = 1 << 18  # games per engine call


class Tournament(NamedTuple):
    """The results of a round robin between n players."""

    players: np.ndarray  # (n,) player codes as given
    wins: np.ndarray  # (n, n) int64: games i won against j
    draws: np.ndarray  # (n, n) int64, symmetric
    losses: np.ndarray  # (n, n) int64: games i lost against j (= wins.T)
    turns: int  # plies played in all games

    @property
    def games(self) -> np.ndarray:
        """(n, n) games played between i and j (0 on the diagonal)."""
        return self.wins + self.draws + self.losses

    @property
    def score(self) -> np.ndarray:
        """s_ij = (wins_ij + draws_ij / 2) / games_ij; NaN on the diagonal."""
        return score_matrix(self.wins, self.draws, self.games)

    @property
    def total(self) -> np.ndarray:
        """Each player's score over all its games: (wins + draws/2) / games."""
        games = self.games.sum(axis=1)
        return (self.wins.sum(axis=1) + 0.5 * self.draws.sum(axis=1)) / np.maximum(games, 1)

    def ratings(self, *, anchor: int | None = None, prior_draws: float = 2.0) -> np.ndarray:
        """Elo ratings (see :func:`popplay.tournaments.ratings.elo_ratings`)."""
        return elo_ratings(self.wins, self.draws, anchor=anchor, prior_draws=prior_draws)

    def rating_errors(self, ratings: np.ndarray, *, anchor: int | None = None, prior_draws: float = 2.0
                      ) -> np.ndarray:
        """Standard errors of :meth:`ratings` (same arguments), from the fit's Fisher
        information (:func:`popplay.tournaments.ratings.elo_standard_errors`)."""
        return elo_standard_errors(ratings, self.wins, self.draws, anchor=anchor, prior_draws=prior_draws)


def round_robin(nets: Networks, players: Any, games: int, *, params: KnightsParams | None = None, seed: int = 0,
                tag: int = TAG_TOURNAMENT, base: int = 0, epsilon: float | Any = 0.0, backend: Any = None,
                dist: Any = None) -> Tournament:
    """Every pair of ``players`` plays ``games`` games (see the module docstring).

    Args:
        nets: the networks players refer to (agent axis leading).
        players: (n,) player codes: network indices >= 0, bots < 0.
        games: games per pair, at least 1.
        params: the game (board, pieces, jumps, turn limit); knights defaults if None.
        seed, tag, base: the games' random streams: (seed, tag, 0, j) from counter ``base``.
        epsilon: exploration of network players (0: greedy play, as for quality).
        backend: a :class:`popplay.core.backend.Backend`; numba on the CPU by default.
        dist: the job (:func:`popplay.distributed.group.current` by default). With
            several ranks every rank must call this with the same arguments: each plays
            a contiguous block of the pairs and the counts are gathered in pair order
            (games are independent, so the result is that of one process).
    """

    dist = current() if dist is None else dist
    players = _checked(players, games)
    first, second = np.triu_indices(len(players), k=1)
    # With an odd number of games, alternate who gets the extra first move.
    swap = (np.arange(len(first)) % 2 == 1) & (games % 2 == 1)
    a, b = np.where(swap, second, first), np.where(swap, first, second)
    wins, draws, losses, turns = _play_pair_list(nets, players[a], players[b], games, 0, params=params, seed=seed,
                                                 tag=tag, base=base, epsilon=epsilon, backend=backend, dist=dist)
    return _tournament(players, a, b, wins, draws, losses, turns)


def adaptive_round_robin(nets: Networks, players: Any, games: int, *, params: KnightsParams | None = None,
                         seed: int = 0, tag: int = TAG_TOURNAMENT, base: int = 0, epsilon: float | Any = 0.0,
                         backend: Any = None, dist: Any = None, confidence: float = 0.95) -> Tournament:
    """A round robin that spends its games where pairs are still undecided.

    The budget is that of :func:`round_robin` (``games`` per pair). Half of it (at
    least 2 games per pair) is spread evenly; the rest goes out in rounds of 2 games
    to the pairs whose order the ratings so far do not settle (their rating
    difference within the ``confidence`` interval of its standard error), the least
    settled first, until the budget is spent or every pair is settled. Round r plays
    from stream family r (``(seed, tag, r, j)``), so every pair of a round meets the
    same starting positions; results are a :class:`Tournament` as usual (pairs
    played different numbers of games)."""
    dist = current() if dist is None else dist
    players = _checked(players, games)
    a, b = np.triu_indices(len(players), k=1)
    budget = games * len(a)
    first_round = max(2, games // 2)
    wins, draws, losses, turns = _play_pair_list(nets, players[a], players[b], first_round, 0, params=params,
                                                 seed=seed, tag=tag, base=base, epsilon=epsilon, backend=backend,
                                                 dist=dist)
    spent = first_round * len(a)
    z = stats.z_value(confidence)
    round_number = 1
    while spent + 2 <= budget:
        result = _tournament(players, a, b, wins, draws, losses, turns)
        ratings = result.ratings()
        errors = result.rating_errors(ratings)
        gap = np.abs(ratings[a] - ratings[b]) / np.maximum(np.hypot(errors[a], errors[b]), 1e-12)
        undecided = np.flatnonzero(gap < z)
        if not len(undecided):
            break
        chosen = undecided[np.argsort(gap[undecided], kind="stable")][:(budget - spent) // 2]
        more = _play_pair_list(nets, players[a[chosen]], players[b[chosen]], 2, round_number, params=params,
                               seed=seed, tag=tag, base=base, epsilon=epsilon, backend=backend, dist=dist)
        wins[chosen] += more[0]
        draws[chosen] += more[1]
        losses[chosen] += more[2]
        turns += more[3]
        spent += 2 * len(chosen)
        round_number += 1
    return _tournament(players, a, b, wins, draws, losses, turns)


def _checked(players: Any, games: int) -> np.ndarray:
    players = np.asarray(players, dtype=np.int64).reshape(-1)
    if games < 1:
        raise ValueError(f"games must be at least 1 (got {games})")
    if len(players) < 2:
        raise ValueError("a tournament needs at least two players")
    return players


def _play_pair_list(nets: Networks, first: np.ndarray, second: np.ndarray, games: int, stream: int, *,
                    params: KnightsParams | None, seed: int, tag: int, base: int, epsilon: float | Any,
                    backend: Any, dist: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(wins, draws, losses of each pair's first player, turns) of ``games`` games per
    pair from stream family ``stream``; with several ranks, each plays a contiguous
    block of the pairs and the counts are gathered in pair order."""
    pairs = np.stack([first, second], axis=1)
    wins = np.zeros(len(pairs), dtype=np.int64)
    draws = np.zeros(len(pairs), dtype=np.int64)
    losses = np.zeros(len(pairs), dtype=np.int64)
    turns = 0
    step = max(1, MAX_BATCH // games)
    block = -(-len(pairs) // dist.world_size)  # this rank's pairs: [mine_lo, mine_hi)
    mine_lo, mine_hi = min(len(pairs), dist.rank * block), min(len(pairs), (dist.rank + 1) * block)
    for lo in range(mine_lo, mine_hi, step):  # chunks of many pairs: memory, not a loop over pairs
        hi = min(lo + step, mine_hi)
        played = engine.play_pairs(nets, pairs[lo:hi], games, params=params, seed=seed, tag=tag,
                                 streams=np.full(hi - lo, stream, dtype=np.int64), epsilon=epsilon, backend=backend,
                                 base=base)
        wins[lo:hi], draws[lo:hi], losses[lo:hi] = played.wins, played.draws, played.losses
        turns += played.turns
    if dist.distributed:

        counts = np.zeros((3, block), dtype=np.int64)  # the last block may be short: padded
        counts[:, :mine_hi - mine_lo] = wins[mine_lo:mine_hi], draws[mine_lo:mine_hi], losses[mine_lo:mine_hi]
        gathered = collectives.all_gather_axis(counts, axis=1, dist=dist)[:, :len(pairs)]
        wins, draws, losses = (np.ascontiguousarray(row) for row in gathered)
        turns = collectives.sum_int(int(turns), dist=dist)
    return wins, draws, losses, int(turns)


def _tournament(players: np.ndarray, a: np.ndarray, b: np.ndarray, wins: np.ndarray, draws: np.ndarray,
                losses: np.ndarray, turns: int) -> Tournament:
    n = len(players)
    w = np.zeros((n, n), dtype=np.int64)
    d = np.zeros((n, n), dtype=np.int64)
    w[a, b] = wins
    w[b, a] = losses
    d[a, b] = draws
    d[b, a] = draws
    return Tournament(players, w, d, w.T.copy(), turns)


def pad_hidden(nets: Networks, hidden: int, hidden2: int = 0) -> Networks:
    """The same value functions with ``hidden`` units (and ``hidden2`` in a second
    layer, where the networks have one): extra units have zero weights out (and in),
    so they add exactly 0 to every output (networks of different sizes can then play
    in one batch)."""
    have, have2 = nets.w1.shape[2], nets.hidden2
    if hidden < have or hidden2 < have2:
        raise ValueError(f"cannot shrink networks from {have} to {hidden} hidden units")
    extra, extra2 = hidden - have, hidden2 - have2
    if extra == 0 and extra2 == 0:
        return nets

    def pad(a: np.ndarray, axis: int, count: int) -> np.ndarray:
        shape = list(a.shape)
        shape[axis] = count
        return np.concatenate([a, np.zeros(shape)], axis=axis)

    b2 = np.asarray(nets.b2, dtype=np.float64).copy()
    if nets.wm is None:
        return Networks(pad(nets.w1, 2, extra), pad(nets.b1, 1, extra), pad(nets.w2, 1, extra), b2, plies=nets.plies)
    return Networks(pad(nets.w1, 2, extra), pad(nets.b1, 1, extra), pad(nets.w2, 1, extra2), b2,
                    pad(pad(nets.wm, 1, extra), 2, extra2), pad(nets.bm, 1, extra2), nets.plies)


def stack_networks(parts: list[Networks]) -> Networks:
    """Networks of several populations in one stack (padded to the largest hidden
    layers); all with a second hidden layer or all without."""
    if len({p.wm is None for p in parts}) > 1:
        raise ValueError("networks with and without a second hidden layer (--hidden2) cannot play in one batch")
    hidden, hidden2 = max(p.w1.shape[2] for p in parts), max(p.hidden2 for p in parts)
    padded = [pad_hidden(p, hidden, hidden2) for p in parts]
    return padded[0].stacked(padded[1:])

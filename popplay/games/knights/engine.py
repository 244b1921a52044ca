"""Playing batches of knights games on an engine: numba's fused CPU loops, or torch's
batched tensors (CPU or CUDA); the entry point of learning, evaluation and tournaments."""
from __future__ import annotations

from typing import Any, NamedTuple

import numba
import numpy as np

from popplay import rng as _rng
from popplay.games.knights import _numba as kernels
from popplay.games.knights.rules import (
    BOT_EPSILON,
    KIND_NET,
    KIND_OF_CODE,
    OPPONENTS,
    TAG_MATCH,
    TORCH_KINDS,
    GameBatch,
    KnightsParams,
    Networks,
    Played,
)


def run_batch(nets: Networks, lam: np.ndarray, batch: GameBatch, *, params: KnightsParams, base: int,
              backend: Any = None, summed: bool = True) -> Played:
    """Play a :class:`GameBatch` to the end on ``backend`` (numba CPU by default).

    ``base`` is the first counter word of every game's stream (e.g. episode × words
    per game). Weights stay fixed for the whole batch; the returned ``delta`` holds
    each network's summed TD(λ) change, to be scaled by its α. With ``summed=False``
    (numba only) it holds every (game, side)'s own change, shaped (games, 2, P), with
    rows only for learning sides (:func:`learning_sides`), for a caller that continues
    a running sum (sharded populations).

    Each network chooses its moves as deep as ``nets.plies`` says (the run's
    ``--lookahead`` where the bank carries no depths).
    """
    geo = params.geometry
    _check_networks(nets, params)
    batch = batch._replace(learn=learning_sides(batch))
    depth = params.lookahead if nets.plies is None else np.ascontiguousarray(nets.plies[batch.net])
    if summed and backend is not None and backend.name == "torch" and np.isin(batch.kind, TORCH_KINDS).all():
        engine = _torch_engine(geo.table, params.pieces, params.max_turns, backend.device, backend.compile,
                               params.dtype)
        result, plies, delta = engine.play(nets, lam, batch.kind, batch.net, batch.epsilon, batch.learn,
                                           batch.keys, base=base, lookahead=depth, td_leaf=params.td_leaf)
        return Played(result, plies, delta)
    chunks = backend.chunks(len(batch.keys)) if backend is not None and backend.name == "numba" else _chunks(len(batch.keys))
    result, plies, delta = kernels.run_games(nets, lam, batch.kind, batch.net, batch.epsilon, batch.learn,
                                             batch.keys, base=base, jumps=geo.table, pieces=params.pieces,
                                             max_turns=params.max_turns, n_chunks=chunks,
                                             lookahead=depth, td_leaf=params.td_leaf)
    if delta is not None and summed:
        delta = kernels.sum_by_network(delta, batch.net, batch.learn, nets.count)
    return Played(result, plies, delta)


def learning_sides(batch: GameBatch) -> np.ndarray:
    """(games, 2): the sides whose TD(λ) changes count (network players asked to learn)."""
    return np.asarray(batch.learn, dtype=bool) & (np.asarray(batch.kind) == KIND_NET)


def _check_networks(nets: Networks, params: KnightsParams) -> None:
    w1 = np.asarray(nets.w1)
    if w1.ndim != 3 or w1.shape[1] != params.inputs:
        raise ValueError(f"networks take {w1.shape[1] if w1.ndim == 3 else '?'} inputs; a {params.rows}x{params.cols} "
                         f"board gives {params.inputs}")
    count, hidden, hidden2 = w1.shape[0], w1.shape[2], nets.hidden2
    if (np.shape(nets.b1) != (count, hidden) or np.shape(nets.w2) != (count, hidden2 or hidden)
            or np.shape(nets.b2) != (count,)
            or (nets.wm is not None and (np.shape(nets.wm) != (count, hidden, hidden2)
                                         or np.shape(nets.bm) != (count, hidden2)))):
        raise ValueError("network arrays disagree in agents or hidden units")
    if nets.plies is not None and (np.shape(nets.plies) != (count,) or not np.isin(nets.plies, (1, 2)).all()):
        raise ValueError("networks' chooser depths must be one per network, each 1 or 2")


def _chunks(items: int) -> int:
    return max(1, min(items, numba.get_num_threads() * 16))


_ENGINES: dict[tuple, Any] = {}


def _torch_engine(table: np.ndarray, pieces: int, max_turns: int, device: str, compile: bool = False,
                  dtype: str = "float64") -> Any:
    from popplay.games.knights._torch import TorchKnightsEngine  # defers torch: the numba engine needs none

    key = (table.tobytes(), table.shape, pieces, max_turns, device, compile, dtype)
    if key not in _ENGINES:
        _ENGINES.clear()
        _ENGINES[key] = TorchKnightsEngine(jumps=table, pieces=pieces, max_turns=max_turns, device=device,
                                           compile=compile, dtype=dtype)
    return _ENGINES[key]


class MatchResults(NamedTuple):
    """Counts from the first player's point of view, one entry per pair."""

    wins: np.ndarray  # (pairs,) int64
    draws: np.ndarray
    losses: np.ndarray
    turns: int  # plies played in all games

    @property
    def score(self) -> np.ndarray:
        """(wins + draws/2) / games of the first player."""
        games = self.wins + self.draws + self.losses
        return (self.wins + 0.5 * self.draws) / np.maximum(games, 1)


def play_pairs(nets: Networks, pairs: Any, games: int, *, params: KnightsParams | None = None, seed: int = 0,
               streams: Any = None, tag: int = TAG_MATCH, epsilon: float | Any = 0.0, backend: Any = None,
               base: int = 0) -> MatchResults:
    """Every pair of players plays ``games`` games; half with each player moving first.

    Args:
        nets: the networks players may refer to (agent axis leading).
        pairs: (n, 2) player codes: an int >= 0 is the network of that index, a
            negative one a benchmark opponent (:data:`OPPONENTS`: −1 random,
            −2 greedy, −3 search).
        games: games per pair (game j: the pair's first player is X when j is even).
        params: board size, pieces, jump pattern and turn limit (defaults: 5 × 7, 5, knight, 100).
        seed, tag, streams: game j of pair i uses stream ``(seed, tag, streams[i], j)``;
            ``streams`` defaults to ``arange(n)``. Equal stream ids give equal starting
            positions and dice (common random numbers, e.g. for all agents against a bot).
        epsilon: exploration of network players (scalar or per network); 0 plays greedily.
        backend: a :class:`popplay.core.backend.Backend`; numba on the CPU by default.

    Returns:
        :class:`MatchResults` (wins, draws, losses of each pair's first player).
    """
    params = params if params is not None else KnightsParams()
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if games < 1:
        raise ValueError(f"games must be at least 1 (got {games})")
    if len(pairs) and (pairs.max() >= nets.count or pairs.min() < min(OPPONENTS.values())):
        raise ValueError(f"player codes must lie in [{min(OPPONENTS.values())}, {nets.count - 1}]")
    n_pairs = len(pairs)
    streams = np.arange(n_pairs) if streams is None else np.asarray(streams, dtype=np.int64).reshape(-1)
    if streams.shape != (n_pairs,):
        raise ValueError("streams must give one stream id per pair")
    if n_pairs == 0:
        empty = np.zeros(0, dtype=np.int64)
        return MatchResults(empty, empty, empty, 0)
    j = np.arange(games)
    first_is_x = (j % 2 == 0)[None, :]
    players = np.where(first_is_x[..., None], pairs[:, None, :], pairs[:, None, ::-1])  # (n, games, 2)
    players = players.reshape(-1, 2)
    kind = np.where(players >= 0, KIND_NET, 0)
    for code, k in KIND_OF_CODE.items():
        kind = np.where(players == code, k, kind)
    eps_of_net = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (max(nets.count, 1),))
    eps = np.where(players >= 0, eps_of_net[np.clip(players, 0, None)], 0.0)
    for code, bot_eps in BOT_EPSILON.items():
        eps = np.where(players == code, bot_eps, eps)
    batch = GameBatch(kind.astype(np.int64), np.clip(players, 0, None).astype(np.int64), eps,
                      np.zeros(players.shape, dtype=bool), _rng.stream_keys(seed, tag, streams, j).reshape(-1))
    played = run_batch(nets, np.zeros(max(nets.count, 1)), batch, params=params, base=base, backend=backend)
    result = played.result.reshape(n_pairs, games).astype(np.int64)
    first_sign = np.where(first_is_x, 1, -1)
    wins = (result == first_sign).sum(axis=1)
    losses = (result == -first_sign).sum(axis=1)
    draws = games - wins - losses
    return MatchResults(wins, draws, losses, int(played.plies.sum()))

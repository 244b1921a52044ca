"""A ladder of fixed knights players on one Elo scale, and agents placed on it.

The rungs, weakest first: ``random``; greedy with 75 %, 50 % and 25 % of its moves
random (``noisy75``, ``noisy50``, ``noisy25``: greedy beats random in nearly every
game, so without them random = 0 would be tied to the rest by nothing but the prior);
``greedy`` (which plays exactly the moves of a 1-ply material search); and the
alpha-beta material searches ``search2`` (exactly the two-ply ``search``),
``search3`` and ``search4`` (:mod:`popplay.games.knights.opponents`). A ladder may
name other rungs (:func:`parse_rungs`): the Monte-Carlo tree searches ``mcts100`` …
``mcts6400`` reach above ``search4`` but cost seconds a game, so they are asked for.
They are rated once, by a round robin among themselves, on the Elo scale with random
at 0 (maximum likelihood with two virtual draws per player, standard errors from the
fit's Fisher information). A rating depends on the game (board, pieces, jumps, turn
limit), on the games per pair and on the seed; it is computed on first use and kept
in a cache file (``$XDG_CACHE_HOME/popplay`` or ``~/.cache/popplay``), so the rungs'
ratings never move between runs that compare agents.

An agent's ladder Elo: the rating that maximises the likelihood of its results
against the rungs, their ratings held fixed; one virtual draw is shared out evenly
over the rungs it met, so that an agent that beats (or loses to) everything still
gets a finite rating. Its 95 % interval is ±1.96 standard errors from the Fisher
information of its own games (the rungs' own errors are reported beside them).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from popplay import stats
from popplay.games.knights.rules import LADDER_RUNGS, OPPONENTS, KnightsParams, init_networks
from popplay.tournaments.ratings import ELO_SCALE, elo_ratings, elo_standard_errors
from popplay.tournaments.roundrobin import round_robin

RUNGS = LADDER_RUNGS
RUNG_GAMES = 400  # games per pair of rungs
TAG_LADDER = 50  # the rungs' round robin's random streams
LADDER_VERSION = 1  # bump when a rung's rule changes: cached ratings are then recomputed


class Ladder(NamedTuple):
    """The rungs and their ratings (random = 0) with standard errors."""

    names: tuple[str, ...]
    ratings: np.ndarray
    errors: np.ndarray
    games: int  # per pair of rungs

    def rating(self, name: str) -> float:
        return float(self.ratings[self.names.index(name)])

    def as_dict(self) -> dict[str, Any]:
        return {"games_per_pair": self.games,
                "rungs": [{"name": n, "elo": round(float(r), 1), "se": round(float(e), 1)}
                          for n, r, e in zip(self.names, self.ratings, self.errors)]}


class LadderElo(NamedTuple):
    """Per agent: ladder Elo and its 95 % interval."""

    elo: np.ndarray
    low: np.ndarray
    high: np.ndarray

    def summary(self) -> dict[str, float]:
        return {"best": float(self.elo.max()), "mean": float(self.elo.mean()), "worst": float(self.elo.min())}


def parse_rungs(spec: str | None) -> tuple[str, ...]:
    """The rungs named in ``spec`` (comma-separated benchmark players, ``random``
    among them: it anchors the scale), weakest first as given; the default ladder
    for None."""
    if spec is None:
        return RUNGS
    names = tuple(name.strip() for name in spec.split(",") if name.strip())
    unknown = [name for name in names if name not in OPPONENTS]
    if unknown:
        raise ValueError(f"unknown rung {unknown[0]!r} (rungs are benchmark players: {', '.join(OPPONENTS)})")
    if len(set(names)) != len(names) or len(names) < 2 or "random" not in names:
        raise ValueError(f"rungs must be at least two different players, random among them (got {spec!r})")
    return names


def rate_rungs(params: KnightsParams, games: int = RUNG_GAMES, seed: int = 0, backend: Any = None,
               rungs: tuple[str, ...] = RUNGS) -> Ladder:
    """The rungs' round robin and their ratings (random anchored at 0)."""
    codes = np.array([OPPONENTS[name] for name in rungs], dtype=np.int64)
    nets = init_networks(0, np.arange(1), params.inputs, 1, 0.0)  # bots need none; the engine takes some
    played = round_robin(nets, codes, games, params=params, seed=seed, tag=TAG_LADDER, backend=backend)
    anchor = rungs.index("random")
    ratings = elo_ratings(played.wins, played.draws, anchor=anchor)
    errors = elo_standard_errors(ratings, played.wins, played.draws, anchor=anchor)
    return Ladder(tuple(rungs), ratings, errors, games)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "popplay"


def _cache_key(params: KnightsParams, games: int, seed: int, rungs: tuple[str, ...]) -> str:
    game = {"rows": params.rows, "cols": params.cols, "pieces": params.pieces, "jumps": params.jumps,
            "max_turns": params.max_turns, "games": games, "seed": seed, "version": LADDER_VERSION,
            "rungs": list(rungs)}
    return hashlib.sha256(json.dumps(game, sort_keys=True).encode()).hexdigest()[:16]


_MEMORY: dict[str, Ladder] = {}


def ladder(params: KnightsParams | None = None, games: int = RUNG_GAMES, seed: int = 0,
           rungs: tuple[str, ...] = RUNGS) -> Ladder:
    """The rated ladder of ``params``' game with ``rungs``: from memory, the cache
    file, or rated now (and cached; an unreadable or unwritable cache only costs the
    rating again)."""
    params = params if params is not None else KnightsParams()
    rungs = tuple(rungs)
    key = _cache_key(params, games, seed, rungs)
    if key in _MEMORY:
        return _MEMORY[key]
    path = cache_dir() / f"ladder-{key}.json"
    found = None
    try:
        stored = json.loads(path.read_text())
        if stored.get("names") == list(rungs):
            found = Ladder(rungs, np.asarray(stored["ratings"], dtype=np.float64),
                           np.asarray(stored["errors"], dtype=np.float64), int(stored["games"]))
    except (OSError, ValueError, KeyError, TypeError):
        found = None
    if found is None or found.ratings.shape != (len(rungs),) or not np.isfinite(found.ratings).all():
        found = rate_rungs(params, games, seed, rungs=rungs)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps({"names": list(rungs), "ratings": found.ratings.tolist(),
                                             "errors": found.errors.tolist(), "games": games}))
            temporary.replace(path)  # whole or not at all: a reader never sees half a file
        except OSError:
            pass
    _MEMORY[key] = found
    return found


def ladder_elo(results: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], rungs: Ladder,
               prior_draws: float = 1.0) -> LadderElo:
    """Every agent's ladder Elo from its (wins, draws, losses) against some rungs.

    Args:
        results: rung name -> (wins, draws, losses), arrays over agents.
        rungs: the rated :class:`Ladder`.
        prior_draws: virtual draws per agent, shared out evenly over the rungs met.
    """
    names = [name for name in results if name in rungs.names]
    if not names:
        raise ValueError(f"no ladder rung among {', '.join(results) or 'no opponents'} "
                         f"(rungs: {', '.join(rungs.names)})")
    theta_k = np.array([rungs.rating(name) for name in names]) / ELO_SCALE  # (m,)
    wins, draws, losses = (np.stack([np.asarray(results[name][i], dtype=np.float64) for name in names], axis=1)
                           for i in range(3))  # (agents, m)
    share = prior_draws / len(names)
    score = wins + 0.5 * draws + 0.5 * share
    games = wins + draws + losses + share
    theta = np.full(wins.shape[0], theta_k.mean())
    for _ in range(100):  # Newton on a concave log-likelihood, steps capped
        p = 1.0 / (1.0 + np.exp(theta_k[None, :] - theta[:, None]))
        gradient = (score - games * p).sum(axis=1)
        information = (games * p * (1.0 - p)).sum(axis=1)
        step = np.clip(gradient / information, -1.0, 1.0)
        theta = theta + step
        if np.abs(step).max() < 1e-12:
            break
    p = 1.0 / (1.0 + np.exp(theta_k[None, :] - theta[:, None]))
    error = ELO_SCALE / np.sqrt((games * p * (1.0 - p)).sum(axis=1))
    elo = ELO_SCALE * theta
    return LadderElo(elo, *stats.normal_interval(elo, error))

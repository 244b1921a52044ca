"""Bell §3: the knights board game learned by self-play with TD(λ) neural agents."""
from __future__ import annotations

from typing import Any

from popplay.core.registry import DomainSpec, register
from popplay.games.knights.rules import LINEAGE_PARAMETERS, parameter_count

_F8 = 8


def games_bytes(games: int) -> int:
    """A batch of ``games`` greedy games (evaluations, tournaments): pairs, keys, results."""
    return int(games) * 160  # measured: about 140 bytes a game (evaluate, 4e6 games)


def memory_bytes(p: Any, world: int = 1, local: int = 1) -> int:
    """Networks and their copies, one TD(λ) change per game copy and side, the batch
    of games, snapshots and an evaluation's games (the whole run, once per machine)."""
    size = parameter_count(2 * int(p.rows) * int(p.cols), int(p.hidden), int(p.hidden2))
    agents = int(p.agents)
    games = agents * int(p.games_per_agent)
    networks = agents * size * _F8 * 4  # weights, a copy for replication, deltas summed, a checkpoint copy
    deltas = games * 2 * size * _F8  # one TD(λ) change per game copy and side
    per_game = 64 + 2 * int(p.max_turns) * 4  # board, dice and result of every game in the batch
    snapshots = 0
    if int(p.snapshot_every) > 0:
        snapshots = (int(p.episodes) // int(p.snapshot_every) + 1) * agents * size * _F8
    evaluation = games_bytes(agents * max(int(p.eval_games), 2))
    return networks + deltas + games * per_game + snapshots + evaluation


SPEC = register(DomainSpec(
    name="knights", params="popplay.games.knights.rules:KnightsParams",
    experiment="popplay.games.knights.experiment:KnightsExperiment", sharded=True,
    memory=memory_bytes, budget_counter=("episode", "episodes"), lineage_parameters=LINEAGE_PARAMETERS, steps_label="agent turns (all agents)",
    plot_units={"quality against": "quality against opponent\n(wins + draws/2) / games",
                "score": "learning score\n(wins + draws/2) / games"},
))

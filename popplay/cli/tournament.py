"""``popplay tournament RUN.h5 [MORE.h5 …]``: a round robin between stored knights agents."""
from __future__ import annotations

import os
import sys
from collections import Counter
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from popplay.cli.app import app, invocation
from popplay.cli.common import DistTimeoutOption, NprocOption, print_json
from popplay.core.errors import PopplayError, UsageError
from popplay.core.limits import MemoryLimitError, check_fits
from popplay.games.knights import games_bytes
from popplay.training import ranks as sharded

CONVENTION = ("Elo scale, fitted by maximum likelihood (Bradley-Terry, a draw counts half a win): "
              "P(i scores against j) = 1 / (1 + 10^((R_j - R_i) / 400)); mean rating 0, or the anchor at 0; "
              "2 virtual draws per player against a reference player keep perfect scores finite")


class Anchor(str, Enum):
    random = "random"
    greedy = "greedy"
    search = "search"


@app.command("tournament")
def tournament(
    runs: Annotated[list[Path], typer.Argument(
        help="Knights run files; every agent of each run's population enters.", metavar="RUN.h5 [MORE.h5 ...]",
        dir_okay=False)],
    games: Annotated[int, typer.Option(
        min=1, help="Games per pair of players, half with each moving first (rounded up to even).")] = 10,
    snapshots: Annotated[bool, typer.Option(
        "--snapshots", help="Also enter the populations of every snapshot stored in the runs (cross-generation).")
    ] = False,
    snapshot_every: Annotated[Optional[int], typer.Option(
        help="With --snapshots: only snapshots taken at multiples of this many episodes.")] = None,
    anchor: Annotated[Optional[Anchor], typer.Option(
        help="A benchmark opponent that joins as the fixed anchor of the rating scale (rated 0).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the tournament's games (starting positions and dice).")] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on the last line.")] = False,
    nproc: NprocOption = 1,
    timeout: DistTimeoutOption = 60.0,
) -> None:
    """Round robin: every pair plays G games (half moving first, all batched on the
    engine, greedy play); ranks by Elo rating from the win/draw matrices."""
    from popplay.tournaments.entrants import EntrantError, describe_game, load_field  # defers numba
    from popplay.tournaments.roundrobin import TAG_TOURNAMENT, round_robin  # defers numba

    if games < 1:
        raise UsageError(f"--games must be at least 1 (got {games})")
    games += games % 2  # as `evaluate` does: each side moves first equally often
    seen: set[str] = set()
    kept = []
    for run in runs:  # runs/latest-knights.h5 beside the run it links to: one population, not two
        if os.path.realpath(run) not in seen:
            seen.add(os.path.realpath(run))
            kept.append(run)
    if len(kept) < len(runs):
        print(f"Warning: {len(runs) - len(kept)} run file(s) named twice; each population enters once",
              file=sys.stderr)
    runs = kept
    if snapshot_every is not None and not snapshots:
        raise UsageError("--snapshot-every applies with --snapshots only")
    try:
        field = load_field(runs, snapshots=snapshots, snapshot_every=snapshot_every,
                           anchor=anchor.value if anchor is not None else None)
    except EntrantError as error:
        raise UsageError(str(error)) from None
    if len(runs) > 1:  # a glob can match unrelated runs: never mix them silently
        counts = Counter(e.path for e in field.entrants if e.kind == "agent")
        print(f"Note: {len(runs)} run files enter one round robin: "
              + ", ".join(f"{path} ({count} players)" for path, count in counts.items()), file=sys.stderr)
    if len(field.players) < 2:
        raise UsageError("a tournament needs at least two players (give more runs, --snapshots or --anchor)")

    players = len(field.players)
    try:  # every pair's games are played as one batch (on one rank, at worst)
        check_fits(games_bytes(players * (players - 1) // 2 * games), f"--games {games} for {players} players")
    except MemoryLimitError as error:
        raise UsageError(str(error)) from None
    if sharded.wants_launch(nproc):  # ranks split the pairs (popplay.tournaments.roundrobin)

        ARGV = invocation()

        if ARGV is None or not any(a == "--nproc" or a.startswith("--nproc=") for a in ARGV):
            raise UsageError("--nproc: start popplay from its command line (popplay.cli.main)")
        raise typer.Exit(sharded.launch_command(ARGV, nproc, timeout))
    try:
        with sharded.rank_session(nproc, timeout) as dist:
            result = round_robin(field.nets, field.players, games, params=field.params, seed=seed,
                                 tag=TAG_TOURNAMENT)
    except ValueError as error:
        raise UsageError(str(error)) from None
    except RuntimeError as error:
        raise PopplayError(str(error), getattr(error, "exit_code", 1)) from None
    if not dist.is_writer:
        return
    ratings = result.ratings(anchor=field.anchor)
    errors = result.rating_errors(ratings, anchor=field.anchor)
    names = [e.name for e in field.entrants]
    score = result.score
    payload: dict[str, Any] = {
        "agents": names,
        "agent_info": [e.as_dict() for e in field.entrants],
        "ratings": ratings.tolist(),
        "rating_se": errors.tolist(),
        "total_score": result.total.tolist(),
        "score": [[None if i == j else float(score[i, j]) for j in range(len(names))] for i in range(len(names))],
        "wins": result.wins.tolist(), "draws": result.draws.tolist(), "losses": result.losses.tolist(),
        "games": games, "seed": seed, "anchor": anchor.value if anchor is not None else None,
        "convention": CONVENTION, "game": describe_game(field.params), "turns": result.turns,
        "world_size": dist.world_size,
    }
    if json_output:
        print_json(payload)
        return
    _print_table(payload, runs)


def _print_table(payload: dict[str, Any], runs: list[Path]) -> None:
    names = payload["agents"]
    order = sorted(range(len(names)), key=lambda i: (-payload["ratings"][i], i))
    anchor = payload["anchor"]
    table = Table(title=f"{len(names)} players, {payload['games']} games per pair ({payload['game']})",
                  caption=f"Elo by maximum likelihood, 400 points = 10:1 odds; "
                          f"{'anchor ' + anchor + ' at 0' if anchor else 'mean 0'}. "
                          "± is the rating's standard error (Fisher information of the fit). "
                          "score = (wins + draws/2) / games over all games")
    for column in ("rank", "agent", "rating", "±", "score", "wins", "draws", "losses"):
        table.add_column(column, justify="left" if column == "agent" else "right")
    wins, draws, losses = (payload[k] for k in ("wins", "draws", "losses"))
    for rank, i in enumerate(order, 1):
        table.add_row(str(rank), names[i], f"{payload['ratings'][i]:+.0f}", f"{payload['rating_se'][i]:.0f}",
                      f"{payload['total_score'][i]:.3f}",
                      str(sum(wins[i])), str(sum(draws[i])), str(sum(losses[i])),
                      style="bold" if names[i] == anchor else None)
    Console().print(table)

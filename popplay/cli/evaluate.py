"""``popplay evaluate RUN.h5``: measure a stored population again."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from popplay.cli import app
from popplay.cli.common import CommandError, print_json


class Opponent(str, Enum):
    random = "random"
    greedy = "greedy"
    search = "search"


KNIGHTS_ONLY = ("--opponent", "--games", "--seed")


@app.command("evaluate")
def evaluate(
    run: Annotated[Path, typer.Argument(help="A run file written by `popplay train` (bandit, cartpole or knights).", metavar="RUN.h5",
        dir_okay=False)],
    opponent: Annotated[Optional[Opponent], typer.Option(
        help="knights: the benchmark opponent every agent plays (default greedy).")] = None,
    games: Annotated[Optional[int], typer.Option(
        min=2, help="knights: games per agent, half moving first (default 200; rounded up to even).")] = None,
    seed: Annotated[Optional[int], typer.Option(
        help="knights: seed of the evaluation games (default: the run's seed, as during training).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on the last line.")] = False,
    episodes: Annotated[Optional[int], typer.Option(
        min=1, help="dqn, reinforce: greedy episodes to play (default 100).")] = None,
) -> None:
    """Re-measure the population stored in a run file (bandit: block-estimate quality;
    cartpole: the shared greedy policy's balancing test; knights: every agent's quality
    against a benchmark opponent)."""
    from popplay.checkpoints.runfile import RunFileError, read_run
    from popplay.populations import registry
    from popplay.populations.base import Backend

    try:
        stored = read_run(run)
    except RunFileError as error:
        raise CommandError(str(error)) from None
    if stored.domain not in registry.DOMAINS:
        raise CommandError(f"{run}: unknown domain {stored.domain!r}")
    if stored.domain in registry.DEEP_DOMAINS:
        from popplay.cli.evaluate_deep import evaluate_deep

        evaluate_deep(run, stored, episodes or 100, seed, json_output)
        return
    if episodes is not None:
        raise CommandError(f"--episodes applies to dqn and reinforce runs only ({run} is a {stored.domain} run)")
    given = [name for name, value in zip(KNIGHTS_ONLY, (opponent, games, seed)) if value is not None]
    if stored.domain != "knights" and given:
        raise CommandError(f"{given[0]} applies to knights runs only ({run} is a {stored.domain} run)")
    try:
        params = registry.params_from_config(stored.domain, stored.config)
        experiment = registry.build(stored.domain, params, Backend("numba", "cpu"))
        state = experiment.restore(stored.state, stored.state_counters)
    except (TypeError, ValueError, KeyError) as error:
        raise CommandError(f"{run}: damaged run file ({error})") from None
    if stored.domain == "knights":
        _evaluate_knights(run, stored, params, state, opponent or Opponent.greedy, games or 200,
                          params.seed if seed is None else seed, json_output)
        return
    metrics = experiment.measure(state)
    payload = {"domain": stored.domain, "path": str(run), "complete": stored.complete,
               "agent_steps_per_trial": experiment.agent_steps(state),
               "agent_steps": experiment.total_agent_steps(state), **metrics}
    if json_output:
        print_json(payload)
    else:
        shown = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        print(f"{run}: {stored.domain} run, {payload['agent_steps_per_trial']:,} agent-steps per trial"
              f"{'' if stored.complete else ' (stopped early)'}: {shown}")


def _evaluate_knights(run: Path, stored: Any, params: Any, state: Any, opponent: Opponent, games: int, seed: int,
                      json_output: bool) -> None:
    """Every agent against one benchmark opponent; a table or one JSON object."""
    from popplay.opponents import quality

    from popplay.limits import MemoryLimitError, check_fits, knights_games_bytes

    games += games % 2
    try:  # the whole batch of games is allocated at once
        check_fits(knights_games_bytes(params.agents * games), f"--games {games} for {params.agents} agents")
    except MemoryLimitError as error:
        raise CommandError(str(error)) from None
    q = quality(state.networks, opponent.value, games, params=params, seed=seed)
    best = int(q.score.argmax())
    per_agent = [{"agent": i, "agent_id": int(state.agent_id[i]), "quality": float(q.score[i]),
                  "wins": int(q.wins[i]), "draws": int(q.draws[i]), "losses": int(q.losses[i])}
                 for i in range(len(q.score))]
    payload = {"domain": "knights", "path": str(run), "complete": stored.complete, "opponent": opponent.value,
               "games": games, "seed": seed, "episode": state.episode, "agent_steps": state.turns,
               "per_agent": per_agent, "best": float(q.score.max()), "best_agent": best,
               "mean": float(q.score.mean()), "worst": float(q.score.min()), "quality": float(q.score.max())}
    if json_output:
        print_json(payload)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{run}: {len(per_agent)} agents after {state.episode:,} episodes "
                        f"vs {opponent.value}, {games} games each")
    for column in ("agent", "quality", "wins", "draws", "losses"):
        table.add_column(column, justify="right")
    for row in sorted(per_agent, key=lambda r: -r["quality"]):
        table.add_row(str(row["agent"]), f"{row['quality']:.3f}", str(row["wins"]), str(row["draws"]),
                      str(row["losses"]))
    console = Console()
    console.print(table)
    console.print(f"best {payload['best']:.3f} (agent {best}), mean {payload['mean']:.3f}, "
                  f"worst {payload['worst']:.3f}")

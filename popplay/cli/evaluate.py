"""``popplay evaluate RUN.h5``: measure a stored population again."""
from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from popplay import stats
from popplay.checkpoints.runfile import RunFileError
from popplay.checkpoints.validation import load_run, params_from_config
from popplay.cli.app import app
from popplay.cli.common import print_json
from popplay.cli.evaluate_deep import evaluate_deep
from popplay.core import registry
from popplay.core.backend import Backend
from popplay.core.errors import UsageError
from popplay.core.limits import MemoryLimitError, check_fits
from popplay.games.knights import games_bytes
from popplay.games.knights.rules import MCTS_PLAYOUTS, unit_widths, unit_widths2

#: The knights benchmark players, weakest first (popplay.games.knights.opponents).
Opponent = Enum("Opponent", {name: name for name in
                             ("random", "noisy75", "noisy50", "noisy25", "greedy", "search1", "search",
                              "search2", "search3", "search4", *(f"mcts{n}" for n in MCTS_PLAYOUTS))}, type=str)


KNIGHTS_ONLY = ("--opponent", "--games", "--seed", "--ladder", "--lookahead", "--rungs")


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
    ladder: Annotated[bool, typer.Option(
        "--ladder", help="knights: every agent's Elo on the fixed ladder of benchmark players (random = 0), "
                         "from --games games against each rung, with a 95% interval.")] = False,
    rungs: Annotated[Optional[str], typer.Option(
        help="knights --ladder: the rungs, comma-separated, random among them (default: random, noisy75, noisy50, "
             "noisy25, greedy, search2, search3, search4; the tree searches mcts100 ... mcts6400 reach higher but "
             "cost seconds a game). A new set of rungs is rated once and cached.")] = None,
    lookahead: Annotated[Optional[int], typer.Option(
        min=1, max=2, help="knights: plies the agents' move chooser looks ahead in these games (default: the "
                           "run's own; 2: minimax over each agent's V).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on the last line.")] = False,
    episodes: Annotated[Optional[int], typer.Option(
        min=1, help="dqn, reinforce: greedy episodes to play (default 100).")] = None,
    member: Annotated[Optional[int], typer.Option(
        min=0, help="A deep population (--agents) or knights: only this member, or agent (default: every "
                    "one), e.g. to confirm a chosen agent's score on many fresh games.")] = None,
) -> None:
    """Re-measure the population stored in a run file (bandit: block-estimate quality;
    cartpole: the shared greedy policy's balancing test; knights: every agent's quality
    against a benchmark opponent, or on the ladder; deep populations and knights:
    ``--member K`` for one member or agent)."""

    try:
        stored = load_run(run)
    except RunFileError as error:
        raise UsageError(str(error)) from None
    if not registry.known(stored.domain):
        raise UsageError(f"{run}: unknown domain {stored.domain!r}")
    given = [name for name, value in zip(KNIGHTS_ONLY, (opponent, games, seed, ladder or None, lookahead, rungs))
             if value is not None]
    if registry.get(stored.domain).kind == registry.DEEP:
        ignored = [name for name in given if name != "--seed"]  # a deep run's episodes take a seed too
        if ignored:  # even in a two-player environment: its agents play each other, not the benchmark players
            raise UsageError(f"{ignored[0]} applies to `popplay train knights` runs only ({run} is a "
                             f"{stored.domain} run; it takes --episodes, --seed and --member)")
        evaluate_deep(run, stored, episodes or 100, seed, json_output, member)
        return
    if member is not None and stored.domain != "knights":
        raise UsageError(f"--member applies to deep populations and knights only ({run} is a {stored.domain} run)")
    if episodes is not None:
        raise UsageError(f"--episodes applies to the deep agents' runs only ({run} is a {stored.domain} run)")
    if ladder and opponent is not None:
        raise UsageError("--ladder plays every rung of the ladder; leave out --opponent")
    if rungs is not None and not ladder:
        raise UsageError("--rungs names the rungs of --ladder; add --ladder")
    if stored.domain != "knights" and given:
        raise UsageError(f"{given[0]} applies to knights runs only ({run} is a {stored.domain} run)")
    try:
        params = params_from_config(stored.domain, stored.config, run_options=False)
        if lookahead is not None:  # how the agents choose their moves, not what they learned (nor how)
            params = dataclasses.replace(params, lookahead=lookahead, td_leaf=params.td_leaf and lookahead == 2)
        experiment = registry.get(stored.domain).build(params, Backend("numba", "cpu"))
        state = experiment.restore(stored.state, stored.state_counters)
        if lookahead is not None:  # every agent, whatever depth it chose while learning
            state = state._replace(plies=np.full_like(state.plies, lookahead))
        agents = len(state.agent_id) if stored.domain == "knights" else 0
    except (TypeError, ValueError, KeyError) as error:
        raise UsageError(f"{run}: damaged run file ({error})") from None
    if member is not None:
        if member >= agents:
            raise UsageError(f"--member {member}: {run} holds agents 0 to {agents - 1}")
        state = _one_agent(state, member)
    if stored.domain == "knights" and ladder:
        _evaluate_ladder(run, stored, params, state, games or 200, params.seed if seed is None else seed,
                         json_output, rungs, member or 0)
        return
    if stored.domain == "knights":
        _evaluate_knights(run, stored, params, state, opponent or Opponent.greedy, games or 200,
                          params.seed if seed is None else seed, json_output, member or 0)
        return
    metrics = experiment.measure(state)
    interval = _quality_interval(stored.domain, experiment.results(state), metrics)
    payload = {"domain": stored.domain, "path": str(run), "complete": stored.complete,
               "agent_steps_per_trial": experiment.agent_steps(state),
               "agent_steps": experiment.total_agent_steps(state), **metrics, **interval}
    if json_output:
        print_json(payload)
    else:
        shown = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items() if not name.endswith("_se"))
        if interval:
            low, high = interval["quality_ci95"]
            shown += f" (quality 95% interval {low:.4g} to {high:.4g}, {interval['quality_ci_method']})"
        print(f"{run}: {stored.domain} run, {payload['agent_steps_per_trial']:,} agent-steps per trial"
              f"{'' if stored.complete else ' (stopped early)'}: {shown}")


def _quality_interval(domain: str, results: dict[str, Any], metrics: dict[str, float]) -> dict[str, Any]:
    """A 95 % interval of the quality over independent trials: Wilson for the bandit's
    rate of trials that pick the best arm, mean ± 1.96 standard errors otherwise."""

    per_trial = next(iter(results.values()), None) if results else None
    if per_trial is None or len(per_trial) < 2:
        return {}
    if domain == "bandit":
        low, high = stats.wilson_interval(float(per_trial.sum()), len(per_trial))
        method = f"Wilson over {len(per_trial)} trials"
    else:
        low, high = stats.normal_interval(metrics["quality"], metrics["quality_se"])
        method = f"mean ± 1.96 standard errors over {len(per_trial)} trials"
    return {"quality_ci95": [float(low), float(high)], "quality_ci_method": method}


def _evaluate_knights(run: Path, stored: Any, params: Any, state: Any, opponent: Opponent, games: int, seed: int,
                      json_output: bool, first: int = 0) -> None:
    """Every agent of ``state`` (the first is agent ``first``) against one benchmark
    opponent; a table or one JSON object."""
    from popplay.games.knights.opponents import quality  # defers numba


    games = _even_games_that_fit(len(state.agent_id), games)
    q = quality(state.networks, opponent.value, games, params=params, seed=seed)
    low, high = stats.wilson_score_interval(q.wins, q.draws, q.losses)
    # narrower where most games are drawn: a draw adds no spread (Wilson prices it as a coin flip)
    score_low, score_high = stats.score_interval(q.wins, q.draws, q.losses)
    per_agent = [{**who, "quality": float(q.score[i]),
                  "quality_ci95": [float(low[i]), float(high[i])],
                  "score_ci95": [float(score_low[i]), float(score_high[i])],
                  "wins": int(q.wins[i]), "draws": int(q.draws[i]), "losses": int(q.losses[i])}
                 for i, who in enumerate(_agents(state, first))]
    best, worst = int(q.score.argmax()), int(q.score.argmin())
    mean, error = stats.mean_and_error(q.score)
    # The population's quality is its mean agent's: the best of P agents is biased
    # upwards by its selection (its own interval does not correct for that).
    payload = {"domain": "knights", "path": str(run), "complete": stored.complete, "opponent": opponent.value,
               "games": games, "seed": seed, "lookahead": params.lookahead, "episode": state.episode,
               "agent_steps": state.turns, "per_agent": per_agent, "best": float(q.score.max()),
               "best_agent": per_agent[best]["agent"], "best_ci95": per_agent[best]["quality_ci95"],
               "mean": float(mean), "worst": float(q.score.min()), "worst_agent": per_agent[worst]["agent"],
               "worst_ci95": per_agent[worst]["quality_ci95"], "quality": float(mean)}
    if len(q.score) > 1:
        payload["quality_se"] = float(error)
        payload["quality_ci95"] = [float(v) for v in stats.normal_interval(mean, error)]
    if json_output:
        print_json(payload)
        return

    who = f"{len(per_agent)} agents" if len(per_agent) > 1 else f"agent {per_agent[0]['agent']}"
    table = Table(title=f"{run}: {who} after {state.episode:,} episodes vs {opponent.value}, {games} games each")
    table.caption = "quality = (wins + draws/2) / games; 95% interval: Wilson score interval"
    for column in ("agent", "quality", "95% interval", "wins", "draws", "losses"):
        table.add_column(column, justify="right")
    for row in sorted(per_agent, key=lambda r: -r["quality"]):
        a, b = row["quality_ci95"]
        table.add_row(str(row["agent"]), f"{row['quality']:.3f}", f"{a:.3f}-{b:.3f}", str(row["wins"]),
                      str(row["draws"]), str(row["losses"]))
    console = Console()
    console.print(table)
    spread = (f" ± {1.96 * payload['quality_se']:.3f} (95%, over agents)" if "quality_se" in payload else "")
    if len(per_agent) == 1:
        console.print(f"agent {per_agent[0]['agent']}: {payload['best']:.3f} over {games} games")
        return
    console.print(f"population quality (mean agent) {payload['mean']:.3f}{spread}; best {payload['best']:.3f} "
                  f"(agent {payload['best_agent']}, optimistic: selected), worst {payload['worst']:.3f} "
                  f"(agent {payload['worst_agent']})")


def _evaluate_ladder(run: Path, stored: Any, params: Any, state: Any, games: int, seed: int,
                     json_output: bool, rung_spec: str | None, first: int = 0) -> None:
    """Every agent against every rung of the ladder; its ladder Elo with a 95 % interval."""
    from popplay.games.knights.opponents import quality  # defers numba
    from popplay.tournaments.ladder import ladder, ladder_elo, parse_rungs  # defers numba

    try:
        names = parse_rungs(rung_spec)
    except ValueError as error:
        raise UsageError(f"--rungs: {error}") from None
    games = _even_games_that_fit(len(state.agent_id), games)
    rungs = ladder(params, rungs=names)
    results = {name: quality(state.networks, name, games, params=params, seed=seed) for name in names}
    elo = ladder_elo({name: (q.wins, q.draws, q.losses) for name, q in results.items()}, rungs)
    per_agent = [{**who, "elo": round(float(elo.elo[i]), 1),
                  "elo_ci95": [round(float(elo.low[i]), 1), round(float(elo.high[i]), 1)],
                  "scores": {name: float(q.score[i]) for name, q in results.items()}}
                 for i, who in enumerate(_agents(state, first))]
    best, worst = int(elo.elo.argmax()), int(elo.elo.argmin())
    payload = {"domain": "knights", "path": str(run), "complete": stored.complete, "ladder": rungs.as_dict(),
               "games_per_rung": games, "seed": seed, "lookahead": params.lookahead, "episode": state.episode,
               "agent_steps": state.turns,
               "per_agent": per_agent, **{f"elo_{k}": round(v, 1) for k, v in elo.summary().items()},
               "best_agent": per_agent[best]["agent"], "worst_agent": per_agent[worst]["agent"]}
    if json_output:
        print_json(payload)
        return
    who = f"{len(per_agent)} agents" if len(per_agent) > 1 else f"agent {per_agent[0]['agent']}"
    table = Table(title=f"{run}: {who} after {state.episode:,} episodes on the ladder, {games} games per rung")
    table.caption = ("ladder Elo: maximum likelihood against the rungs' fixed ratings (random = 0); "
                     "95% interval from the agent's own games; then the score against each rung")
    for column in ("agent", "elo", "95% CI"):
        table.add_column(column, justify="right", no_wrap=True)
    for name in names:  # short headers: the score against each rung
        table.add_column(name.replace("noisy", "n").replace("search", "s").replace("random", "rnd"), justify="right")
    for row in sorted(per_agent, key=lambda r: -r["elo"]):
        low, high = row["elo_ci95"]
        table.add_row(str(row["agent"]), f"{row['elo']:.0f}", f"{low:.0f}..{high:.0f}",
                      *(f"{row['scores'][name]:.2f}".removeprefix("0") for name in names))
    console = Console()
    console.print(table)
    console.print("rungs: " + ", ".join(f"{r['name']} {r['elo']:.0f} ± {1.96 * r['se']:.0f}"
                                        for r in payload["ladder"]["rungs"]))


def _one_agent(state: Any, slot: int) -> Any:
    """A knights state holding agent ``slot`` alone (the per-agent arrays cut to its
    row: its networks, depth, half-life, identity and learning parameters, all that an
    evaluation reads; the population's records, such as scores and lineage, stay whole);
    ``_agents(state, first=slot)`` names it by its slot."""
    per_agent = ("half_life", "agent_id", "alpha", "lam", "epsilon")
    cut = {name: getattr(state, name)[slot:slot + 1] for name in per_agent if getattr(state, name) is not None}
    return state.with_networks(state.networks.take([slot]), **cut)


def _agents(state: Any, first: int = 0) -> list[dict[str, Any]]:
    """Who each knights agent is: slot (``first`` for the state's first agent), lineage id,
    chooser depth, units on in each hidden layer (second: 0 without one) and step-size
    half-life (files written before per-agent half-lives: None)."""
    widths, widths2 = unit_widths(state.networks), unit_widths2(state.networks)
    half_lives = state.half_life if state.half_life is not None else [None] * len(widths)
    return [{"agent": first + i, "agent_id": int(state.agent_id[i]), "lookahead": int(state.plies[i]),
             "width": int(widths[i]), "width2": int(widths2[i]), "half_life": None if h is None else float(h)}
            for i, h in enumerate(half_lives)]


def _even_games_that_fit(agents: int, games: int) -> int:
    """``games`` rounded up to even (half moving first), refused in one line when one
    opponent's batch of games for ``agents`` agents (allocated at once) cannot fit."""
    games += games % 2
    try:
        check_fits(games_bytes(agents * games), f"--games {games} for {agents} agent{'s' * (agents != 1)}")
    except MemoryLimitError as error:
        raise UsageError(str(error)) from None
    return games

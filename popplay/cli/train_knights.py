"""``popplay train knights``: TD(λ) self-play populations on Bell's knights game (section 3)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from popplay.cli.app import train_app
from popplay.cli.common import (
    BackendName,
    BackendOption,
    CheckpointOption,
    ConfigOption,
    DeviceName,
    DeviceOption,
    DistTimeoutOption,
    JsonOption,
    LogDirOption,
    NprocOption,
    OutOption,
    OverwriteOption,
    ResumeOption,
    SeedOption,
    SeedsOption,
    given,
)
from popplay.cli.train import check_schedule, load_resume, resume_time_budget, resumed_params, run_training
from popplay.core.errors import UsageError
from popplay.games.knights.rules import KnightsParams

_D = KnightsParams()


@train_app.command("knights")
def train_knights(
    ctx: typer.Context,
    agents: Annotated[int, typer.Option(min=1, help="Agents in the population.")] = _D.agents,
    games_per_agent: Annotated[int, typer.Option(
        min=1, help="Games each agent plays at once per episode (copies of itself, each against a random "
                    "population member; half as X).")] = _D.games_per_agent,
    episodes: Annotated[int, typer.Option(min=1, help="Learning episodes (one game per copy each).")] = _D.episodes,
    time_budget: Annotated[Optional[float], typer.Option(
        help="Stop after this many seconds of learning (evaluations excluded).")] = None,
    hidden: Annotated[int, typer.Option(min=1, max=1024, help="Hidden sigmoid units of each value network.")] = _D.hidden,
    alpha: Annotated[float, typer.Option(help="TD(λ) step size per game copy (copies' changes are summed).")] = _D.alpha,
    lam: Annotated[float, typer.Option(min=0.0, max=1.0, help="Eligibility-trace decay λ.")] = _D.lam,
    epsilon: Annotated[float, typer.Option(min=0.0, max=1.0, help="Exploration: chance of a random move while learning.")] = _D.epsilon,
    max_turns: Annotated[int, typer.Option(
        min=1, max=100_000, help="Plies (single moves) after which a game is drawn.")] = _D.max_turns,
    rows: Annotated[int, typer.Option(min=1, max=26, help="Board rows.")] = _D.rows,
    cols: Annotated[int, typer.Option(min=1, max=26, help="Board columns.")] = _D.cols,
    pieces: Annotated[int, typer.Option(min=1, help="Pieces per side, placed at random.")] = _D.pieces,
    jumps: Annotated[str, typer.Option(
        help="Jump pattern: 'knight' or offsets 'dr,dc;dr,dc;...'.")] = _D.jumps,
    opponents_learn: Annotated[bool, typer.Option(
        help="Opponents also learn from the games they are drawn into.")] = _D.opponents_learn,
    init_scale: Annotated[float, typer.Option(min=0.0, help="Initial weights uniform on ±this.")] = _D.init_scale,
    eval_every: Annotated[int, typer.Option(
        min=1, help="Episodes between evaluations against the benchmark opponents.")] = _D.eval_every,
    eval_games: Annotated[int, typer.Option(min=2, help="Games per agent and opponent in an evaluation.")] = _D.eval_games,
    eval_opponents: Annotated[str, typer.Option(
        help="Benchmark opponents to evaluate against: some of random,greedy,search.")] = _D.eval_opponents,
    snapshot_every: Annotated[int, typer.Option(
        min=0, help="Episodes between snapshots of the population kept in the run file (0: none).")] = _D.snapshot_every,
    replicate_every: Annotated[int, typer.Option(
        min=0, help="Episodes between selective replications: rank the population, copy the best over the worst "
                    "(0: off).")] = _D.replicate_every,
    replicate_fraction: Annotated[float, typer.Option(
        help="Fraction of the population replaced at each replication, in (0, 0.5].")] = _D.replicate_fraction,
    mutate_weights: Annotated[float, typer.Option(
        help="Std of Gaussian noise added to every weight of a copy (0: exact copies).")] = _D.mutate_weights,
    mutate_params: Annotated[float, typer.Option(
        help="A copy's alpha, lambda, epsilon are multiplied by log-uniform factors in [1/S, S] (1: unchanged; "
             "lambda and epsilon stay in [0, 1]).")] = _D.mutate_params,
    tournament_games: Annotated[int, typer.Option(
        help="Games per pair in the ranking round robin (half moving first); 0 ranks by the mean learning "
             "score since the last replication instead (no extra games).")] = _D.tournament_games,
    seed: SeedOption = 0,
    backend: BackendOption = BackendName.auto,
    device: DeviceOption = DeviceName.auto,
    out: OutOption = None,
    overwrite: OverwriteOption = False,
    json_output: JsonOption = False,
    checkpoint_every: CheckpointOption = None,
    resume: ResumeOption = None,
    seeds: SeedsOption = 1,
    config: ConfigOption = None,
    nproc: NprocOption = 1,
    timeout: DistTimeoutOption = 60.0,
    log_dir: LogDirOption = None,
) -> None:
    """Train a knights population by TD(λ) self-play. Quality = the mean agent's
    (wins + draws/2)/games against the strongest benchmark opponent evaluated."""
    if resume is not None:
        stored = load_resume(ctx, "knights", resume)
        params = resumed_params("knights", stored, episodes=episodes if given(ctx, "episodes") else None)
        done = int(stored.state_counters.get("episode", 0))
        if params.episodes < done:
            raise UsageError(f"--episodes ({params.episodes}) is below what {resume} has already learned "
                               f"({done} episodes)")
        run_training("knights", params, log_dir=log_dir,
                     backend=backend.value if given(ctx, "backend") else stored.config["backend"],
                     device=device.value if given(ctx, "device") else stored.config["device"],
                     time_budget=resume_time_budget(ctx, stored, time_budget, "episodes"), out=None, overwrite=True,
                     json_output=json_output, checkpoint_every=checkpoint_every, resume=stored,
                     nproc=nproc, timeout=timeout)
        return
    params = KnightsParams(
        rows=rows, cols=cols, pieces=pieces, jumps=jumps, max_turns=max_turns, agents=agents,
        games_per_agent=games_per_agent, episodes=episodes, hidden=hidden, alpha=alpha, lam=lam,
        epsilon=epsilon, init_scale=init_scale, opponents_learn=opponents_learn, eval_every=eval_every,
        eval_games=eval_games, eval_opponents=eval_opponents, snapshot_every=snapshot_every, seed=seed,
        replicate_every=replicate_every, replicate_fraction=replicate_fraction, mutate_weights=mutate_weights,
        mutate_params=mutate_params, tournament_games=tournament_games,
    )
    try:
        params.validate()
    except ValueError as error:
        name, _, rest = str(error).partition(" ")
        raise UsageError(f"--{name.replace('_', '-')} {rest}") from None
    check_schedule(params, domain="knights", time_budget=time_budget)
    run_training("knights", params, log_dir=log_dir, backend=backend.value, device=device.value, time_budget=time_budget,
                 out=out, overwrite=overwrite, json_output=json_output, checkpoint_every=checkpoint_every,
                 seeds=seeds, nproc=nproc, timeout=timeout)


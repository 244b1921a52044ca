"""``popplay train gorila``: seed 002's actors, learners and sharded parameter server."""
from __future__ import annotations

import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from popplay.checkpoints.runfile import RunFileError, check_writable
from popplay.checkpoints.validation import load_run
from popplay.cli.app import train_app
from popplay.cli.common import (
    EVAL_HELP,
    EnvOption,
    GammaOption,
    JsonOption,
    OutOption,
    OverwriteOption,
    RankTimeoutOption,
    ResumeOption,
    SeedOption,
    default_out,
    given,
    parse_hidden,
    print_json,
)
from popplay.core.errors import PopplayError, UsageError
from popplay.training.job import stop_on_signals


class Replay(str, Enum):
    local = "local"
    global_ = "global"


# What a resumed run may change: the budget, the layout and how long waits may take.
RESUME_ALLOWED = {"resume", "episodes", "env_steps", "actors", "learners", "shards", "replay", "timeout",
                  "json_output", "out", "overwrite"}


@train_app.command("gorila")
def train_gorila(
    ctx: typer.Context,
    env: EnvOption = "CartPole-v1",
    actors: Annotated[int, typer.Option(min=1, help="Actor processes (own environment, own Q-network copy).")] = 2,
    learners: Annotated[int, typer.Option(
        min=1, help="Learner processes (see --replay).")] = 1,
    shards: Annotated[int, typer.Option(min=1, help="Parameter-server shards (AdaGrad on a slice each).")] = 1,
    replay: Annotated[Replay, typer.Option(
        help="local: actor a feeds learner a mod L, which samples only that memory (Gorila's bundles); "
             "global: one memory distributed over the learners (each holds its actors' part) and every "
             "minibatch drawn from all of it.")] = Replay.local,
    episodes: Annotated[int, typer.Option(min=0, help="Budget: episodes over all actors (0: none).")] = 0,
    env_steps: Annotated[int, typer.Option(min=0, help="Budget: environment steps over all actors (0: none).")] = 0,
    hidden: Annotated[str, typer.Option(help="Hidden layer widths of the Q network, comma separated.")] = "64,64",
    lr: Annotated[float, typer.Option(help="AdaGrad learning rate (on the shards).")] = 0.01,
    gamma: GammaOption = 0.99,
    batch_size: Annotated[int, typer.Option(min=1, help="Minibatch of each learner update.")] = 64,
    replay_capacity: Annotated[int, typer.Option(min=1, help="Replay capacity of each learner (its part, with global replay).")] = 50_000,
    learning_starts: Annotated[int, typer.Option(min=0, help="Transitions in replay before learning (global: over all parts).")] = 500,
    update_ratio: Annotated[float, typer.Option(help="Learner updates per transition received.")] = 0.25,
    target_every: Annotated[int, typer.Option(min=1, help="G: server updates between target refreshes.")] = 200,
    epsilon_updates: Annotated[int, typer.Option(min=1, help="Server updates over which ε falls to 0.05.")] = 4_000,
    actor_sync: Annotated[int, typer.Option(min=1, help="N: actor steps between parameter refreshes.")] = 100,
    learner_sync: Annotated[int, typer.Option(min=1, help="Learner updates between parameter refreshes.")] = 4,
    max_staleness: Annotated[int, typer.Option(
        min=0, help="Drop a gradient computed from parameters more than this many shard updates old.")] = 20,
    outlier_k: Annotated[float, typer.Option(
        help="Drop gradients whose norm is over mean + k·std of the last --outlier-window norms.")] = 6.0,
    outlier_window: Annotated[int, typer.Option(min=2, help="Norms in the outlier guard's window.")] = 100,
    eval_episodes: Annotated[int, typer.Option(min=1, help=EVAL_HELP)] = 100,
    timeout: RankTimeoutOption = 30.0,
    seed: SeedOption = 0,
    out: OutOption = None,
    overwrite: OverwriteOption = False,
    json_output: JsonOption = False,
    resume: ResumeOption = None,
) -> None:
    """Train DQN the Gorila way: actors and learners as processes around a sharded
    AdaGrad parameter server; stale and outlier gradients are dropped; a lost actor or
    learner does not stop the run, a lost shard stops it with its checkpoint. Under
    torchrun (world size = shards + learners + actors) every worker is one rank, and a
    lost rank ends the attempt (--max-restarts continues from the last checkpoint)."""
    from popplay.deep.topologies import gorila_torchrun  # defers gymnasium, torch

    torchrun = gorila_torchrun.under_torchrun()
    try:
        _train(ctx, torchrun=torchrun, env=env, actors=actors, learners=learners, shards=shards, replay=replay,
               episodes=episodes, env_steps=env_steps, hidden=hidden, lr=lr, gamma=gamma, batch_size=batch_size,
               replay_capacity=replay_capacity, learning_starts=learning_starts, update_ratio=update_ratio,
               target_every=target_every, epsilon_updates=epsilon_updates, actor_sync=actor_sync,
               learner_sync=learner_sync, max_staleness=max_staleness, outlier_k=outlier_k,
               outlier_window=outlier_window, eval_episodes=eval_episodes, timeout=timeout,
               seed=seed, out=out,
               overwrite=overwrite, json_output=json_output, resume=resume)
    except PopplayError as error:
        if torchrun and gorila_torchrun.rank() != 0:
            # Every worker finds the same problem; rank 0 alone says it (one line). Its
            # line must come first: once any worker exits, torchrun stops the others,
            # and a quiet rank that exits at once can stop rank 0 before it prints (CI
            # saw no line). Rank 0 exits within a second or two; torchrun then ends this one.

            time.sleep(10)
            raise typer.Exit(error.exit_code) from None
        raise


def _train(ctx: typer.Context, *, torchrun: bool, env: str, actors: int, learners: int, shards: int, replay: Replay,
           episodes: int, env_steps: int, hidden: str, lr: float, gamma: float, batch_size: int,
           replay_capacity: int, learning_starts: int, update_ratio: float, target_every: int, epsilon_updates: int,
           actor_sync: int, learner_sync: int, max_staleness: int, outlier_k: float, outlier_window: int,
           eval_episodes: int, timeout: float, seed: int,
           out: Path | None, overwrite: bool, json_output: bool, resume: Path | None) -> None:
    from popplay.deep.topologies import gorila_torchrun  # defers gymnasium, torch
    from popplay.deep.topologies.gorila import GorilaConfig, GorilaJobLost, summary_text  # defers gymnasium, torch
    from popplay.deep.topologies.gorila import train_gorila as run  # defers gymnasium, torch

    resume_state = None
    if resume is not None:
        stored = _load_resume(ctx, resume)
        base = {k: v for k, v in stored.config.items()}
        chosen = {"episodes": episodes, "env_steps": env_steps, "actors": actors, "learners": learners,
                  "shards": shards, "replay": replay.value, "timeout": timeout}
        base.update({name: value for name, value in chosen.items() if given(ctx, name)})
        if not (given(ctx, "episodes") or given(ctx, "env_steps")):
            raise UsageError("--resume needs a new budget: --episodes or --env-steps")
        base["eval_episodes"] = base.get("eval_episodes", eval_episodes)
        config = GorilaConfig.from_dict(base)
        resume_state = {**stored.state, "version": stored.state_counters["version"]}
    else:
        widths = parse_hidden(hidden, "64,64")
        config = GorilaConfig(
            env=env, actors=actors, learners=learners, shards=shards, replay=replay.value, episodes=episodes,
            env_steps=env_steps,
            seed=seed, hidden=widths, lr=lr, gamma=gamma, batch_size=batch_size, replay_capacity=replay_capacity,
            learning_starts=learning_starts, update_ratio=update_ratio, target_every=target_every,
            epsilon_updates=epsilon_updates, actor_sync=actor_sync, learner_sync=learner_sync,
            max_staleness=max_staleness, outlier_k=outlier_k, outlier_window=outlier_window,
            outlier_min_samples=min(20, outlier_window), eval_episodes=eval_episodes, timeout=timeout)
    try:
        config.validate()
    except ValueError as error:
        raise UsageError(_option_message(str(error))) from None
    if torchrun:
        problem = gorila_torchrun.layout_problem(config)  # before anything waits for a peer
        if problem is not None:
            raise UsageError(problem)
    try:
        _check_env(config.env)
    except ValueError as error:
        raise UsageError(_option_message(str(error))) from None
    # A resumed run goes on in its own file unless told otherwise (as train dqn's does).
    target = out if out is not None else (resume if resume is not None else default_out("gorila"))

    def check_out(path: Path) -> None:
        if path.exists() and not overwrite and resume is None:
            raise UsageError(f"--out {path}: file exists (pass --overwrite to replace it)")
        _check_writable(path, overwrite=overwrite, resume=resume is not None)

    progress = 0.0 if json_output and not sys.stderr.isatty() else 2.0
    if torchrun:
        # Rank 0 checks --out (unless this is a restart of the job), prepares the
        # attempt; then this process becomes its rank (exec) and does not return.
        gorila_torchrun.start(config, target, json_output=json_output, progress_every=progress,
                              resume_state=resume_state, check_out=check_out)
    check_out(target)
    try:
        with stop_on_signals() as should_stop:
            summary = run(config, target, resume_state=resume_state, should_stop=should_stop, log=sys.stderr,
                          progress_every=progress)
    except GorilaJobLost as error:
        raise PopplayError(f"{error}: resume with --resume {target}", 3) from None
    summary.pop("started_at", None)
    if json_output:
        print_json(summary)
    else:
        print(summary_text(summary, config))
        for line in summary["lost"]:
            print(f"Lost during the run: {line}", file=sys.stderr)
    if summary["lost"] and not should_stop():
        return  # the run went on without them: a result, not a failure
    if not summary["complete"]:
        print(f"Stopped early; the run file {summary['out']} holds the state so far.", file=sys.stderr)
        raise typer.Exit(130)


def _load_resume(ctx: typer.Context, path: Path) -> Any:
    for param in ctx.command.params:
        if param.name not in RESUME_ALLOWED and given(ctx, param.name):
            raise UsageError(f"{param.opts[0]}: settings come from {path} when resuming; only the budget, "
                               "the layout (--actors, --learners, --shards, --replay), --timeout and --json may be given")
    try:
        return load_run(path, expected_domain="gorila")
    except RunFileError as error:
        raise UsageError(str(error)) from None


def _check_env(env_id: str) -> None:
    from popplay.deep import envs  # defers gymnasium

    vec = envs.make_vector(env_id, 1)
    try:
        envs.require_discrete(envs.describe(vec, env_id), "gorila (DQN)")
    finally:
        vec.close()


def _check_writable(path: Path, *, overwrite: bool, resume: bool) -> None:
    try:
        check_writable(path, overwrite=overwrite, resume=resume)
    except RunFileError as error:
        raise UsageError(str(error)) from None


def _option_message(message: str) -> str:
    return message.replace("env_steps", "--env-steps").replace("episodes or", "--episodes or")

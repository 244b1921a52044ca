"""``popplay train dqn``: Double DQN with a learner and simulators (seed 003)."""
from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from popplay.checkpoints.validation import params_from_config
from popplay.cli.app import train_app
from popplay.cli.common import (
    ENV_HELP,
    EVAL_HELP,
    TIMEOUT_HELP,
    CheckpointOption,
    DeviceName,
    DeviceOption,
    EnvOption,
    EvalEpisodesOption,
    GammaOption,
    JsonOption,
    OutOption,
    OverwriteOption,
    RankTimeoutOption,
    ResumeOption,
    SeedOption,
    given,
    parse_hidden,
)
from popplay.core.errors import UsageError
from popplay.cli.train import load_resume, run_training


class Topology(str, Enum):
    sequential = "sequential"
    pipelined = "pipelined"
    collective = "collective"
    async_ = "async"


EPISODES_HELP = "Budget: episodes summed over all simulators (0: none; with --env-steps, whichever comes first)."
ENV_STEPS_HELP = "Budget: environment steps summed over all simulators (0: none)."
__all__ = ["ENV_HELP", "EVAL_HELP", "TIMEOUT_HELP"]  # re-exported: train_exarl and train_gorila import them here
# Options a resumed run may still be given: the new budget and how (not what) to run.
DEEP_RESUME_ALLOWED = {"resume", "episodes", "env_steps", "checkpoint_every", "device", "json_output", "timeout"}


@train_app.command("dqn")
def train_dqn(
    ctx: typer.Context,
    env: EnvOption = "CartPole-v1",
    topology: Annotated[Topology, typer.Option(
        help="sequential: simulate an episode, then train (one process); pipelined: one simulator and the "
             "learner in two processes; collective: N simulators, transitions gathered and weights broadcast "
             "every --sync-every episodes; async: simulators and learner never wait for each other.")
    ] = Topology.sequential,
    simulators: Annotated[int, typer.Option(min=1, help="Simulator ranks (collective, async).")] = 1,
    sync_every: Annotated[int, typer.Option(min=1, help="Episodes per simulator between exchanges.")] = 1,
    episodes: Annotated[int, typer.Option(min=0, help=EPISODES_HELP)] = 0,
    env_steps: Annotated[int, typer.Option(min=0, help=ENV_STEPS_HELP)] = 0,
    hidden: Annotated[str, typer.Option(help="Hidden layer widths of the Q network, comma separated.")] = "128,128",
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 1e-3,
    lr_end: Annotated[float, typer.Option(min=0.0, help="Learning rate after --lr-updates.")] = 0.0,
    lr_updates: Annotated[int, typer.Option(
        min=0, help="Learner updates over which the learning rate falls linearly to --lr-end (0: constant).")] = 0,
    gamma: GammaOption = 0.99,
    batch_size: Annotated[int, typer.Option(min=1, help="Minibatch of each update.")] = 64,
    replay: Annotated[int, typer.Option(min=1, help="Replay capacity in transitions.")] = 50_000,
    learning_starts: Annotated[int, typer.Option(min=0, help="Transitions stored before the first update.")] = 1_000,
    update_ratio: Annotated[float, typer.Option(help="Gradient updates per environment step received.")] = 0.25,
    train_every: Annotated[int, typer.Option(
        min=0, help="Sequential: train every this many env-steps of the run (mid-episode too), running the "
                    "updates owed, --update-ratio per step (SB3's train_freq K with gradient_steps G is "
                    "--train-every K --update-ratio G/K); 0: after each episode (seed 003 Algorithm 1).")] = 0,
    target_every: Annotated[int, typer.Option(min=1, help="Updates between target-network refreshes.")] = 250,
    epsilon_start: Annotated[float, typer.Option(min=0.0, max=1.0, help="ε before any update.")] = 1.0,
    epsilon_end: Annotated[float, typer.Option(min=0.0, max=1.0, help="ε after --epsilon-updates.")] = 0.05,
    epsilon_updates: Annotated[int, typer.Option(
        min=1, help="Learner updates over which ε falls linearly (ε follows training, not simulation).")] = 5_000,
    max_grad_norm: Annotated[float, typer.Option(help="Gradients are clipped to this norm.")] = 10.0,
    eval_episodes: EvalEpisodesOption = 100,
    timeout: RankTimeoutOption = 60.0,
    seed: SeedOption = 0,
    device: DeviceOption = DeviceName.auto,
    out: OutOption = None,
    overwrite: OverwriteOption = False,
    json_output: JsonOption = False,
    checkpoint_every: CheckpointOption = None,
    resume: ResumeOption = None,
) -> None:
    """Train Double DQN: the online network picks the next action and the target network
    values it (seed 003 eq. 1), uniform replay, Huber loss, ε-greedy simulators."""
    from popplay.deep.topologies.dqn import DQNParams  # defers gymnasium, torch

    if resume is not None:
        resume_deep(ctx, "dqn", resume, episodes=episodes, env_steps=env_steps, json_output=json_output,
                    device=device, checkpoint_every=checkpoint_every)
        return
    params = DQNParams(
        env=env, topology=topology.value, simulators=simulators, sync_every=sync_every, episodes=episodes,
        env_steps=env_steps, seed=seed, hidden=parse_hidden(hidden, "128,128"), lr=lr, lr_end=lr_end,
        lr_updates=lr_updates, gamma=gamma, batch_size=batch_size,
        replay_capacity=replay, learning_starts=learning_starts, update_ratio=update_ratio,
        train_every=train_every, target_every=target_every, epsilon_start=epsilon_start, epsilon_end=epsilon_end,
        epsilon_updates=epsilon_updates, max_grad_norm=max_grad_norm, eval_episodes=eval_episodes, timeout=timeout)
    run_deep("dqn", params, out=out, overwrite=overwrite, json_output=json_output, device=device,
             checkpoint_every=checkpoint_every)


_OPTION_NAMES = {"replay_capacity": "--replay", "episodes": "--episodes"}


def option_message(message: str) -> str:
    """A params error in the user's terms: the field name becomes the option name."""
    field, _, rest = message.partition(" ")
    if field == "episodes":
        return "--episodes or --env-steps must be positive (a budget is needed)"
    option = _OPTION_NAMES.get(field, "--" + field.replace("_", "-"))
    return f"{option} {rest}"


def load_deep_resume(ctx: typer.Context, domain: str, path: Path) -> Any:
    """The run file to resume, locked before it is read (as for the populations)."""
    for param in ctx.command.params:
        if param.name not in DEEP_RESUME_ALLOWED and given(ctx, param.name):
            raise UsageError(f"{param.opts[0]}: settings come from {path} when resuming; only --episodes, "
                               "--env-steps, --checkpoint-every, --device, --timeout and --json may be given")
    return load_resume(ctx, domain, path)


def resume_deep(ctx: typer.Context, domain: str, path: Path, *, episodes: int, env_steps: int, json_output: bool,
                device: DeviceName, checkpoint_every: Optional[str]) -> None:
    """`train dqn|reinforce|... --resume`: continue the run file in place up to the new budget."""
    stored = load_deep_resume(ctx, domain, path)
    params = resumed_deep_params(domain, stored, ctx, episodes=episodes, env_steps=env_steps)
    if not given(ctx, "device"):  # the run continues where it ran
        device = DeviceName(stored.config.get("device", "cpu"))
    run_deep(domain, params, out=stored.path, overwrite=True, json_output=json_output, device=device,
             checkpoint_every=checkpoint_every, resume=stored)


def resumed_deep_params(domain: str, stored: Any, ctx: typer.Context, **budget: int) -> Any:
    try:
        params = params_from_config(domain, stored.config, run_options=False)
    except (TypeError, ValueError) as error:
        raise UsageError(f"{stored.path}: damaged config ({error})") from None
    new = {k: v for k, v in budget.items() if given(ctx, k)}
    if not new:
        raise UsageError("--resume needs a new budget: --episodes or --env-steps")
    return dataclasses.replace(params, **new)


def run_deep(domain: str, params: Any, *, out: Optional[Path], overwrite: bool, json_output: bool,
             device: DeviceName, checkpoint_every: Optional[str], resume: Any = None) -> None:
    """Shared tail of the deep agents' commands: validate, then the one pipeline
    (:func:`popplay.cli.train.run_training`)."""
    from popplay.deep.envs import EnvError  # defers gymnasium

    try:
        params.validate()
    except EnvError as error:
        raise UsageError(str(error)) from None
    except ValueError as error:
        raise UsageError(option_message(str(error))) from None
    run_training(domain, params, backend="auto", device=device.value, time_budget=None, out=out,
                 overwrite=overwrite, json_output=json_output, checkpoint_every=checkpoint_every, resume=resume,
                 timeout=float(getattr(params, "timeout", 60.0)))

"""``popplay train dqn``: Double DQN with a learner and simulators (seed 003)."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from popplay.cli.common import (ENV_HELP, EVAL_HELP, TIMEOUT_HELP, CheckpointOption, CommandError, DeviceName,
                                DeviceOption, EnvOption, EvalEpisodesOption, GammaOption, JsonOption, OutOption,
                                OverwriteOption, RankTimeoutOption, ResumeOption, SeedOption, given, parse_hidden)
from popplay.cli.train import train_app


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
    slow_simulator: Annotated[float, typer.Option(hidden=True, help="Test hook: seconds of sleep per episode.")] = 0.0,
    slow_learner: Annotated[float, typer.Option(hidden=True, help="Test hook: seconds of sleep per update.")] = 0.0,
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
    from popplay.topologies.dqn import DQNParams

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
        epsilon_updates=epsilon_updates, max_grad_norm=max_grad_norm, eval_episodes=eval_episodes, timeout=timeout,
        slow_simulator=slow_simulator, slow_learner=slow_learner)
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
    from popplay.checkpoints.runfile import RunFileError, read_run

    for param in ctx.command.params:
        if param.name not in DEEP_RESUME_ALLOWED and given(ctx, param.name):
            raise CommandError(f"{param.opts[0]}: settings come from {path} when resuming; only --episodes, "
                               "--env-steps, --checkpoint-every, --device, --timeout and --json may be given")
    try:
        return read_run(path, expected_domain=domain)
    except RunFileError as error:
        raise CommandError(str(error)) from None


def resume_deep(ctx: typer.Context, domain: str, path: Path, *, episodes: int, env_steps: int, json_output: bool,
                device: DeviceName, checkpoint_every: Optional[str]) -> None:
    """`train dqn|reinforce|... --resume`: continue the run file in place up to the new budget."""
    stored = load_deep_resume(ctx, domain, path)
    params = resumed_deep_params(domain, stored, ctx, episodes=episodes, env_steps=env_steps)
    if not given(ctx, "device"):  # the run continues where it ran
        device = DeviceName(stored.config.get("device", "cpu"))
    run_deep(domain, params, out=path, overwrite=True, json_output=json_output, device=device,
             checkpoint_every=checkpoint_every, resume=stored)


def resumed_deep_params(domain: str, stored: Any, ctx: typer.Context, **budget: int) -> Any:
    import dataclasses

    from popplay.populations import registry

    try:
        params = registry.params_from_config(domain, stored.config)
    except (TypeError, ValueError) as error:
        raise CommandError(f"{stored.path}: damaged config ({error})") from None
    new = {k: v for k, v in budget.items() if given(ctx, k)}
    if not new:
        raise CommandError("--resume needs a new budget: --episodes or --env-steps")
    return dataclasses.replace(params, **new)


def run_deep(domain: str, params: Any, *, out: Optional[Path], overwrite: bool, json_output: bool,
             device: DeviceName, checkpoint_every: Optional[str], resume: Any = None) -> None:
    """Shared tail of `train dqn` and `train reinforce`: validate, run, report."""
    import sys

    from popplay.cli.common import default_out, print_json, stop_on_signals
    from popplay.console import reporter_for
    from popplay.envs import EnvError
    from popplay.topologies.run import DeepRunError, deep_device, train_deep

    try:
        params.validate()
        resolved_device = deep_device(domain, device.value)
    except ValueError as error:
        raise CommandError(option_message(str(error))) from None
    except EnvError as error:
        raise CommandError(str(error)) from None
    except DeepRunError as error:
        raise CommandError(str(error), error.exit_code) from None
    target = out if out is not None else default_out(domain)
    if params.ranks > 1:
        from popplay.distributed.launch import in_rank

        if not in_rank():
            _launch(domain, params, target, overwrite, json_output, checkpoint_every, resume, resolved_device)
            return
    # Progress on stderr, as for the populations: stdout carries only the results.
    reporter = reporter_for(sys.stderr, quiet=json_output and not sys.stderr.isatty())
    try:
        with stop_on_signals() as should_stop:
            summary = train_deep(domain, params, out=target, overwrite=overwrite, checkpoint_every=checkpoint_every,
                                 resume=resume, reporter=reporter, should_stop=should_stop, device=device.value)
    except DeepRunError as error:
        raise CommandError(str(error), error.exit_code) from None
    finally:
        reporter.close()
    if summary is None:
        return  # not rank 0
    if json_output:
        print_json(summary)
    else:
        quality = "not measured" if summary["quality"] is None else f"{summary['quality']:.1f}"
        extra = f", running reward {summary['running_reward']:.1f}" if "running_reward" in summary else ""
        print(f"{domain} on {summary['env']} ({summary['topology']}, {summary['ranks']} rank(s)): quality "
              f"{quality} (mean of {summary['eval_episodes']} greedy episodes){extra} after {summary['episodes']:,} "
              f"episodes, {summary['env_steps']:,} env-steps in {summary['seconds']:.1f}s "
              f"({summary['env_steps_per_second']:,.0f} env-steps/s); wrote {summary['out']}")
    if not summary["complete"]:
        print(f"Stopped early; the run file {summary['out']} holds the state so far.", file=sys.stderr)
        raise typer.Exit(130)


def _launch(domain: str, params: Any, out: Path, overwrite: bool, json_output: bool, checkpoint_every: Optional[str],
            resume: Any, device: str) -> None:
    """Run this command as ``params.ranks`` local processes (rank 0 prints the results)."""
    from popplay.checkpoints.runfile import RunFileError, check_writable
    from popplay.topologies.launch import launch

    if resume is None and Path(out).exists() and not overwrite:
        raise CommandError(f"--out {out}: file exists (pass --overwrite to replace it)")
    try:
        check_writable(Path(out), overwrite=overwrite, resume=resume is not None)
    except RunFileError as error:
        raise CommandError(str(error)) from None
    code = launch(domain, params, out=Path(out), overwrite=overwrite, checkpoint_every=checkpoint_every,
                  json_output=json_output, resume=resume.path if resume is not None else None, device=device)
    if code:
        raise typer.Exit(code)

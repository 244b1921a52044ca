"""``popplay train reinforce``: REINFORCE with a synchronous parameter server (seed 001)."""
from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from popplay.cli.common import (CheckpointOption, CommandError, DeviceName, DeviceOption, JsonOption, OutOption,
                                OverwriteOption, ResumeOption, SeedOption)
from popplay.cli.train import train_app
from popplay.cli.train_dqn import ENV_HELP, EVAL_HELP, TIMEOUT_HELP, load_deep_resume, resumed_deep_params, run_deep


class ServerTopology(str, Enum):
    server = "server"
    local = "local"


@train_app.command("reinforce")
def train_reinforce(
    ctx: typer.Context,
    env: Annotated[str, typer.Option(help=ENV_HELP)] = "CartPole-v1",
    workers: Annotated[int, typer.Option(min=1, help="Worker ranks; each plays one episode per update.")] = 1,
    topology: Annotated[ServerTopology, typer.Option(
        help="server: rank 0 is the parameter server, ranks 1..N the workers (real processes); local: the "
             "same workers one after another in this process (same episodes, same summed gradient).")
    ] = ServerTopology.server,
    episodes: Annotated[int, typer.Option(
        min=0, help="Budget: server updates (every worker plays one episode per update; 0: none).")] = 200,
    env_steps: Annotated[int, typer.Option(min=0, help="Budget: environment steps summed over workers (0: none).")] = 0,
    hidden: Annotated[str, typer.Option(help="Hidden layer widths of the policy, comma separated.")] = "128",
    lr: Annotated[float, typer.Option(help="Adam learning rate at the server.")] = 1e-2,
    gamma: Annotated[float, typer.Option(min=0.0, max=1.0, help="Discount γ.")] = 0.99,
    max_steps: Annotated[int, typer.Option(min=1, help="Steps per episode at most.")] = 10_000,
    eval_episodes: Annotated[int, typer.Option(min=0, help=EVAL_HELP)] = 100,
    timeout: Annotated[float, typer.Option(help=TIMEOUT_HELP)] = 60.0,
    seed: SeedOption = 0,
    device: DeviceOption = DeviceName.auto,
    out: OutOption = None,
    overwrite: OverwriteOption = False,
    json_output: JsonOption = False,
    checkpoint_every: CheckpointOption = None,
    resume: ResumeOption = None,
) -> None:
    """Train a policy with REINFORCE: normalised discounted returns, loss −Σ log π·G per
    episode; the server sums the workers' gradients and steps Adam (seed 001)."""
    from popplay.topologies.reinforce import ReinforceParams

    if resume is not None:
        stored = load_deep_resume(ctx, "reinforce", resume)
        params = resumed_deep_params("reinforce", stored, ctx, episodes=episodes, env_steps=env_steps)
        run_deep("reinforce", params, out=resume, overwrite=True, json_output=json_output, device=device,
                 checkpoint_every=checkpoint_every, resume=stored)
        return
    try:
        widths = tuple(int(v) for v in hidden.split(","))
    except ValueError:
        raise CommandError(f"--hidden: expected comma-separated widths such as 128 (got {hidden!r})") from None
    params = ReinforceParams(env=env, topology=topology.value, workers=workers, episodes=episodes,
                             env_steps=env_steps, seed=seed, hidden=widths, lr=lr, gamma=gamma, max_steps=max_steps,
                             eval_episodes=eval_episodes, timeout=timeout)
    run_deep("reinforce", params, out=out, overwrite=overwrite, json_output=json_output, device=device,
             checkpoint_every=checkpoint_every)

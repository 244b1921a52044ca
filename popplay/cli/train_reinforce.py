"""``popplay train reinforce``: REINFORCE with a synchronous parameter server (seed 001)."""
from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from popplay.cli.app import train_app
from popplay.cli.common import (
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
    parse_hidden,
)
from popplay.cli.train_dqn import resume_deep, run_deep


class ServerTopology(str, Enum):
    server = "server"
    local = "local"


@train_app.command("reinforce")
def train_reinforce(
    ctx: typer.Context,
    env: EnvOption = "CartPole-v1",
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
    gamma: GammaOption = 0.99,
    max_steps: Annotated[int, typer.Option(min=1, help="Steps per episode at most.")] = 10_000,
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
    """Train a policy with REINFORCE: normalised discounted returns, loss −Σ log π·G per
    episode; the server sums the workers' gradients and steps Adam (seed 001)."""
    from popplay.deep.topologies.reinforce import ReinforceParams  # defers gymnasium, torch

    if resume is not None:
        resume_deep(ctx, "reinforce", resume, episodes=episodes, env_steps=env_steps, json_output=json_output,
                    device=device, checkpoint_every=checkpoint_every)
        return
    params = ReinforceParams(env=env, topology=topology.value, workers=workers, episodes=episodes,
                             env_steps=env_steps, seed=seed, hidden=parse_hidden(hidden, "128"), lr=lr, gamma=gamma, max_steps=max_steps,
                             eval_episodes=eval_episodes, timeout=timeout)
    run_deep("reinforce", params, out=out, overwrite=overwrite, json_output=json_output, device=device,
             checkpoint_every=checkpoint_every)

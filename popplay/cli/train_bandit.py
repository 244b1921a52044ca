"""``popplay train bandit``: Bell's N-armed bandit populations (section 1)."""
from __future__ import annotations

from enum import Enum
from typing import Annotated

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
    TimeBudgetOption,
    given,
)
from popplay.cli.train import check_schedule, load_resume, resume_time_budget, resumed_params, run_training
from popplay.core.errors import UsageError
from popplay.games.bandit.rules import BanditParams


class Differentiation(str, Enum):
    none = "none"
    partition = "partition"
    bias = "bias"
    explorers = "explorers"
    top2 = "top2"
    top4 = "top4"


@train_app.command("bandit")
def train_bandit(
    ctx: typer.Context,
    arms: Annotated[int, typer.Option(min=2, help="Arms per bandit.")] = 100,
    agents: Annotated[int, typer.Option(min=1, help="Agents per trial (they share with each other).")] = 256,
    trials: Annotated[int, typer.Option(min=1, help="Independent trials (each with its own bandit).")] = 1024,
    agent_steps: Annotated[int, typer.Option(
        min=1, help="Agent-time steps per trial, split evenly over the agents (Bell's x-axis).")] = 131072,
    share_every: Annotated[int, typer.Option(min=1, help="Steps per agent between sharing points.")] = 16,
    epsilon: Annotated[float, typer.Option(min=0.0, max=1.0, help="Exploration probability.")] = 0.1,
    differentiation: Annotated[Differentiation, typer.Option(
        help="partition: each agent explores only its own arms; bias: a random per-agent bias on greedy "
             "values; explorers: some agents explore at --explorer-epsilon; top2/top4: some agents pick "
             "at random among their best 2 or 4 arms.")] = Differentiation.none,
    bias_scale: Annotated[float, typer.Option(min=0.0, help="Largest bias for --differentiation bias.")] = 0.1,
    explorer_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Fraction of explorer agents.")] = 0.125,
    explorer_epsilon: Annotated[float, typer.Option(min=0.0, max=1.0, help="Epsilon of explorer agents.")] = 0.5,
    topk_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Fraction of top2/top4 agents.")] = 0.5,
    time_budget: TimeBudgetOption = None,
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
    """Train bandit populations: ε-greedy sample averages with count-weighted sharing,
    equations (1)–(4). Quality = fraction of trials whose block estimate picks the best arm."""

    if resume is not None:
        stored = load_resume(ctx, "bandit", resume)
        stored_agents = int(stored.config.get("agents", 1))
        steps_per_agent = agent_steps // stored_agents if given(ctx, "agent_steps") else None
        params = resumed_params("bandit", stored, steps_per_agent=steps_per_agent)
        done = int(stored.state_counters.get("step", 0))
        if params.steps_per_agent < done:
            raise UsageError(f"--agent-steps ({agent_steps}) is below what {resume} has already learned "
                               f"({done * stored_agents} agent-steps per trial)")
        check_schedule(params, domain="bandit", time_budget=stored.config.get("time_budget"),
                       agent_steps=agent_steps if given(ctx, "agent_steps") else None)
        run_training("bandit", params, log_dir=log_dir, backend=backend.value if given(ctx, "backend") else stored.config["backend"],
                     device=device.value if given(ctx, "device") else stored.config["device"],
                     time_budget=resume_time_budget(ctx, stored, time_budget, "agent_steps"), out=None, overwrite=True,
                     json_output=json_output, checkpoint_every=checkpoint_every, resume=stored,
                     nproc=nproc, timeout=timeout)
        return
    if agent_steps < agents:
        raise UsageError(f"--agent-steps ({agent_steps}) must be at least --agents ({agents}): "
                           "every agent needs at least one step")
    params = BanditParams(
        arms=arms, agents=agents, trials=trials, steps_per_agent=agent_steps // agents,
        share_every=share_every, epsilon=epsilon, differentiation=differentiation.value,
        bias_scale=bias_scale, explorer_fraction=explorer_fraction, explorer_epsilon=explorer_epsilon,
        topk_fraction=topk_fraction, seed=seed,
    )
    check_schedule(params, domain="bandit", time_budget=time_budget, agent_steps=agent_steps)
    run_training("bandit", params, log_dir=log_dir, backend=backend.value, device=device.value, time_budget=time_budget,
                 out=out, overwrite=overwrite, json_output=json_output, checkpoint_every=checkpoint_every,
                 seeds=seeds, nproc=nproc, timeout=timeout)


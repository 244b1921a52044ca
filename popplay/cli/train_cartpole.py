"""``popplay train cartpole``: Bell's cart-pole populations (section 2)."""
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
from popplay.games.cartpole.rules import CartPolePopulationParams


class Trace(str, Enum):
    replacing = "replacing"
    accumulating = "accumulating"


class Algorithm(str, Enum):
    sarsa = "sarsa"
    q = "q"


@train_app.command("cartpole")
def train_cartpole(
    ctx: typer.Context,
    agents: Annotated[int, typer.Option(min=1, help="Agents per trial (they share with each other).")] = 256,
    trials: Annotated[int, typer.Option(
        min=1, help="Independent trials; quality is averaged over them.")] = 1024,
    agent_steps: Annotated[int, typer.Option(
        min=1, help="Agent-time steps per trial, split evenly over the agents (Bell's x-axis).")] = 262144,
    share_every: Annotated[int, typer.Option(
        min=1, help="Steps per agent between sharing points (each is followed by a test).")] = 64,
    alpha: Annotated[float, typer.Option(min=0.0, max=1.0, help="Learning rate α (> 0).")] = 0.3,
    gamma: Annotated[float, typer.Option(min=0.0, max=1.0, help="Discount γ.")] = 0.999,
    lam: Annotated[float, typer.Option(min=0.0, max=1.0, help="Trace decay λ.")] = 0.99,
    epsilon: Annotated[float, typer.Option(min=0.0, max=1.0, help="Exploration probability ε.")] = 0.001,
    trace: Annotated[Trace, typer.Option(help="Eligibility traces: set to 1 or incremented on a visit.")] = Trace.replacing,
    algorithm: Annotated[Algorithm, typer.Option(
        help="sarsa: Sarsa(λ); q: Watkins' Q(λ) (traces cut after exploratory actions).")] = Algorithm.sarsa,
    bias: Annotated[float, typer.Option(
        min=0.0, help="Initial max bias of differentiation, equation (9); 0 turns it off (a single agent is never differentiated).")] = 0.1,
    bias_decay: Annotated[float, typer.Option(
        min=1.0, help="Divides the max bias at every share, equation (10).")] = 1.2,
    initial_weight: Annotated[float, typer.Option(
        min=0.0, help="Sharing weight every agent restarts from, equation (8).")] = 0.01,
    failure_reward: Annotated[float, typer.Option(max=0.0, help="Reward on failure (negative); 0 otherwise.")] = -1.0,
    trace_cutoff: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Traces below this become 0 (only live traces cost time).")] = 0.03,
    position_boundary: Annotated[float, typer.Option(
        min=0.0, help="Cart position box boundary ±b in m (3 ranges).")] = 1.0,
    angle_boundary: Annotated[float, typer.Option(
        min=0.0, help="Pole angle box boundary ±b in degrees (3 ranges).")] = 2.0,
    start_range: Annotated[float, typer.Option(
        min=0.0, help="Random starts are uniform in [-r, r) on x, ẋ, θ and θ̇.")] = 0.05,
    cart_friction: Annotated[float, typer.Option(min=0.0, help="Cart friction μ_c (Barto: 0.0005).")] = 0.0005,
    pole_friction: Annotated[float, typer.Option(min=0.0, help="Pole friction μ_p (Barto: 0.000002).")] = 0.000002,
    test_steps: Annotated[int, typer.Option(
        min=1, help="Steps of each greedy test; the quality ceiling (§2.5).")] = 8192,
    test_starts: Annotated[int, typer.Option(min=1, help="Random test starts per trial.")] = 1,
    replicate_every: Annotated[int, typer.Option(
        help="Shares between selective replications: just before that share, within each trial, the agents "
             "that failed least since the last replication are copied over those that failed most (0: off).")] = 0,
    replicate_fraction: Annotated[float, typer.Option(
        help="Fraction of each trial's agents replaced at a replication, in (0, 0.5].")] = 0.25,
    mutate_q: Annotated[float, typer.Option(
        help="Std of Gaussian noise added to every Q value of a copy (0: exact copies).")] = 0.0,
    mutate_params: Annotated[float, typer.Option(
        help="A copy's alpha, lambda, epsilon are multiplied by log-uniform factors in [1/S, S] (1: unchanged; "
             "all three stay in [0, 1]).")] = 1.0,
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
    """Train cart-pole populations: tabular Sarsa(λ)/Q(λ) over 36 boxes with weighted
    sharing, equations (5)–(8), optional differentiation, (9)–(10), and optional
    selective replication with variation before a share (--replicate-every). Quality =
    mean steps the shared greedy policy balances from random starts (ceiling --test-steps)."""

    if resume is not None:
        stored = load_resume(ctx, "cartpole", resume)
        stored_agents = int(stored.config.get("agents", 1))
        steps_per_agent = agent_steps // stored_agents if given(ctx, "agent_steps") else None
        params = resumed_params("cartpole", stored, steps_per_agent=steps_per_agent)
        done = int(stored.state_counters.get("step", 0))
        if params.steps_per_agent < done:
            raise UsageError(f"--agent-steps ({agent_steps}) is below what {resume} has already learned "
                               f"({done * stored_agents} agent-steps per trial)")
        check_schedule(params, domain="cartpole", time_budget=stored.config.get("time_budget"),
                       agent_steps=agent_steps if given(ctx, "agent_steps") else None)
        run_training("cartpole", params, log_dir=log_dir,
                     backend=backend.value if given(ctx, "backend") else stored.config["backend"],
                     device=device.value if given(ctx, "device") else stored.config["device"],
                     time_budget=resume_time_budget(ctx, stored, time_budget, "agent_steps"), out=None, overwrite=True,
                     json_output=json_output, checkpoint_every=checkpoint_every, resume=stored,
                     nproc=nproc, timeout=timeout)
        return
    if agent_steps < agents:
        raise UsageError(f"--agent-steps ({agent_steps}) must be at least --agents ({agents}): "
                           "every agent needs at least one step")
    if alpha <= 0.0:
        raise UsageError(f"--alpha must be positive (got {alpha})")
    if failure_reward >= 0.0:
        raise UsageError(f"--failure-reward must be negative (got {failure_reward})")
    if trace_cutoff >= 1.0:
        raise UsageError(f"--trace-cutoff must be below 1 (got {trace_cutoff})")
    params = CartPolePopulationParams(
        agents=agents, trials=trials, steps_per_agent=agent_steps // agents, share_every=share_every,
        algorithm=algorithm.value, trace=trace.value, alpha=alpha, gamma=gamma, lam=lam, epsilon=epsilon,
        failure_reward=failure_reward, trace_cutoff=trace_cutoff, initial_weight=initial_weight, bias=bias,
        bias_decay=bias_decay, position_boundary=position_boundary, angle_boundary_degrees=angle_boundary,
        start_range=start_range, test_steps=test_steps, test_starts=test_starts, seed=seed,
        cart_friction=cart_friction, pole_friction=pole_friction, replicate_every=replicate_every,
        replicate_fraction=replicate_fraction, mutate_q=mutate_q, mutate_params=mutate_params,
    )
    try:
        params.validate()
    except ValueError as error:
        raise UsageError(_option_message(str(error))) from None
    check_schedule(params, domain="cartpole", time_budget=time_budget, agent_steps=agent_steps)
    run_training("cartpole", params, log_dir=log_dir, backend=backend.value, device=device.value, time_budget=time_budget,
                 out=out, overwrite=overwrite, json_output=json_output, checkpoint_every=checkpoint_every,
                 seeds=seeds, nproc=nproc, timeout=timeout)


_OPTIONS = {"angle_boundary_degrees": "--angle-boundary", "steps_per_agent": "--agent-steps"}


def _option_message(message: str) -> str:
    """A params error in the user's terms: the field name becomes the option name."""
    field, _, rest = message.partition(" ")
    option = _OPTIONS.get(field, "--" + field.replace("_", "-"))
    return f"{option} {rest}"

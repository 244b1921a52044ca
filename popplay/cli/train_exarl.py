"""``popplay train a2c|td3|ddpg``: EXARL's agents (issue 16) and their workflows."""
from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import typer

from popplay.cli.app import train_app
from popplay.cli.common import (
    CheckpointOption,
    DeviceName,
    DeviceOption,
    JsonOption,
    OutOption,
    OverwriteOption,
    ResumeOption,
    SeedOption,
    given,
)
from popplay.cli.train_dqn import (
    ENV_HELP,
    ENV_STEPS_HELP,
    EPISODES_HELP,
    EVAL_HELP,
    load_deep_resume,
    resumed_deep_params,
    run_deep,
)
from popplay.core.errors import UsageError


class Workflow(str, Enum):
    sequential = "sequential"
    multi_learner = "multi-learner"
    master_learner = "master-learner"
    central_inference = "central-inference"


class Selection(str, Enum):
    range = "range"
    random = "random"


WORKFLOW_HELP = ("sequential: the actor plays, then the learner trains, in one process. multi-learner: actors' "
                 "queues read by data-parallel learners; master-learner: actors send to learner 0, which hands "
                 "batches out; central-inference: one rank holds the model and acts for every actor.")

# The multi-process workflows' layout, the same for every agent.
LearnersOption = Annotated[int, typer.Option(min=1, help="multi-learner, master-learner: learner ranks.")]
ActorsOption = Annotated[int, typer.Option(min=1, help="Multi-process workflows: actor ranks.")]
SelectionOption = Annotated[Selection, typer.Option(
    help="multi-learner: range (each learner pops its own block of actors' queues) or random "
         "(any actor's newest trajectory, read without removing it).")]
QueueCapacityOption = Annotated[int, typer.Option(
    min=1, help="multi-learner, range: trajectories an actor keeps unread at most.")]
TimeoutOption = Annotated[float, typer.Option(help="Seconds any wait for another rank may take.")]


def _widths(hidden: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in hidden.split(","))
    except ValueError:
        raise UsageError(f"--hidden: expected comma-separated widths such as 256,256 (got {hidden!r})") from None


def _run(ctx: typer.Context, domain: str, make_params: Any, *, episodes: int, env_steps: int, resume: Any,
         out: Any, overwrite: bool, json_output: bool, device: DeviceName, checkpoint_every: Any) -> None:

    if resume is not None:
        stored = load_deep_resume(ctx, domain, resume)
        if stored.config.get("workflow", "sequential") != "sequential":
            raise UsageError(f"--resume: a {stored.config['workflow']} run cannot be resumed in this version "
                               "(only sequential runs)")
        params = resumed_deep_params(domain, stored, ctx, episodes=episodes, env_steps=env_steps)
        run_deep(domain, params, out=resume, overwrite=True, json_output=json_output, device=device,
                 checkpoint_every=checkpoint_every, resume=stored)
        return
    run_deep(domain, make_params(), out=out, overwrite=overwrite, json_output=json_output, device=device,
             checkpoint_every=checkpoint_every)


@train_app.command("a2c")
def train_a2c(
    ctx: typer.Context,
    env: Annotated[str, typer.Option(help=ENV_HELP)] = "CartPole-v1",
    workflow: Annotated[Workflow, typer.Option(help=WORKFLOW_HELP)] = Workflow.sequential,
    vtrace: Annotated[bool, typer.Option(
        "--vtrace/--no-vtrace", help="Correct for the actor's stale policy with V-trace (IMPALA).")] = True,
    rho_bar: Annotated[float, typer.Option(help="V-trace: truncation of the ratios in targets and advantages.")] = 1.0,
    c_bar: Annotated[float, typer.Option(help="V-trace: truncation of the ratios in the traces.")] = 1.0,
    copies: Annotated[int, typer.Option(min=1, help="Environment copies; one episode each per phase.")] = 8,
    n_steps: Annotated[int, typer.Option(min=1, help="Rows of each learning segment (one update each).")] = 16,
    sync_every: Annotated[int, typer.Option(
        min=1, help="Phases between refreshes of the actor's copy of the policy.")] = 1,
    episodes: Annotated[int, typer.Option(min=0, help=EPISODES_HELP)] = 0,
    env_steps: Annotated[int, typer.Option(min=0, help=ENV_STEPS_HELP)] = 0,
    hidden: Annotated[str, typer.Option(help="Hidden widths of the policy and value networks.")] = "64,64",
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 1e-3,
    gamma: Annotated[float, typer.Option(min=0.0, max=1.0, help="Discount γ.")] = 0.99,
    value_coef: Annotated[float, typer.Option(help="Weight of the value loss.")] = 0.5,
    entropy_coef: Annotated[float, typer.Option(help="Weight of the entropy bonus.")] = 0.01,
    max_grad_norm: Annotated[float, typer.Option(help="Gradient norm clip.")] = 0.5,
    eval_episodes: Annotated[int, typer.Option(min=0, help=EVAL_HELP)] = 20,
    learners: LearnersOption = 2,
    actors: ActorsOption = 2,
    selection: SelectionOption = Selection.range,
    queue_capacity: QueueCapacityOption = 4,
    timeout: TimeoutOption = 60.0,
    seed: SeedOption = 0,
    device: DeviceOption = DeviceName.auto,
    out: OutOption = None,
    overwrite: OverwriteOption = False,
    json_output: JsonOption = False,
    checkpoint_every: CheckpointOption = None,
    resume: ResumeOption = None,
) -> None:
    """Train A2C (policy gradient with a learned baseline and an entropy bonus), with or
    without V-trace's off-policy correction."""
    from popplay.deep.topologies.exarl import A2CParams  # defers gymnasium, torch

    def make() -> Any:
        return A2CParams(env=env, workflow=workflow.value, copies=copies, n_steps=n_steps, sync_every=sync_every,
                         episodes=episodes, env_steps=env_steps, seed=seed, hidden=_widths(hidden), lr=lr,
                         gamma=gamma, value_coef=value_coef, entropy_coef=entropy_coef, max_grad_norm=max_grad_norm,
                         vtrace=vtrace, rho_bar=rho_bar, c_bar=c_bar, eval_episodes=eval_episodes,
                         learners=learners, actors=actors, selection=selection.value,
                         queue_capacity=queue_capacity, timeout=timeout)

    _run(ctx, "a2c", make, episodes=episodes, env_steps=env_steps, resume=resume, out=out, overwrite=overwrite,
         json_output=json_output, device=device, checkpoint_every=checkpoint_every)


def _continuous_command(domain: str, doc: str) -> Any:
    td3 = domain == "td3"

    def command(
        ctx: typer.Context,
        env: Annotated[str, typer.Option(help="A gymnasium id with continuous actions (Pendulum-v1, ...).")
                       ] = "Pendulum-v1",
        workflow: Annotated[Workflow, typer.Option(help=WORKFLOW_HELP)] = Workflow.sequential,
        per: Annotated[bool, typer.Option("--per/--no-per", help="Prioritised experience replay (sum-tree).")] = False,
        per_alpha: Annotated[float, typer.Option(help="--per: priority exponent α.")] = 0.6,
        per_beta0: Annotated[float, typer.Option(help="--per: importance-weight exponent β at the start.")] = 0.4,
        per_beta_updates: Annotated[int, typer.Option(
            min=1, help="--per: updates over which β rises to 1.")] = 20_000,
        clipped_double_q: Annotated[bool, typer.Option(
            "--clipped-double-q/--no-clipped-double-q", help="td3: target from the smaller of two critics.")] = True,
        policy_delay: Annotated[int, typer.Option(min=1, help="td3: critic steps per actor step.")] = 2,
        target_smoothing: Annotated[bool, typer.Option(
            "--target-smoothing/--no-target-smoothing", help="td3: clipped noise on the target action.")] = True,
        target_noise: Annotated[float, typer.Option(help="td3: smoothing noise, in action half-ranges.")] = 0.2,
        noise_clip: Annotated[float, typer.Option(help="td3: smoothing noise clip, in action half-ranges.")] = 0.5,
        sync_every: Annotated[int, typer.Option(min=1, help="Episodes per phase.")] = 1,
        episodes: Annotated[int, typer.Option(min=0, help=EPISODES_HELP)] = 0,
        env_steps: Annotated[int, typer.Option(min=0, help=ENV_STEPS_HELP)] = 0,
        hidden: Annotated[str, typer.Option(help="Hidden widths of the actor and critics.")] = "256,256",
        actor_lr: Annotated[float, typer.Option(help="Adam learning rate of the actor.")] = 1e-3,
        critic_lr: Annotated[float, typer.Option(help="Adam learning rate of the critics.")] = 1e-3,
        gamma: Annotated[float, typer.Option(min=0.0, max=1.0, help="Discount γ.")] = 0.99,
        tau: Annotated[float, typer.Option(min=0.0, max=1.0, help="Polyak rate of the target networks.")] = 0.005,
        batch_size: Annotated[int, typer.Option(min=1, help="Minibatch of each update.")] = 256,
        replay: Annotated[int, typer.Option(min=1, help="Replay capacity in transitions.")] = 200_000,
        learning_starts: Annotated[int, typer.Option(
            min=0, help="Transitions stored (uniform random actions) before the first update.")] = 1_000,
        update_ratio: Annotated[float, typer.Option(help="Gradient updates per environment step.")] = 1.0,
        exploration_noise: Annotated[float, typer.Option(help="Acting noise, in action half-ranges.")] = 0.1,
        eval_episodes: Annotated[int, typer.Option(min=0, help=EVAL_HELP)] = 10,
        learners: LearnersOption = 2,
        actors: ActorsOption = 2,
        selection: SelectionOption = Selection.range,
        queue_capacity: QueueCapacityOption = 4,
        timeout: TimeoutOption = 60.0,
        seed: SeedOption = 0,
        device: DeviceOption = DeviceName.auto,
        out: OutOption = None,
        overwrite: OverwriteOption = False,
        json_output: JsonOption = False,
        checkpoint_every: CheckpointOption = None,
        resume: ResumeOption = None,
    ) -> None:
        from popplay.deep.topologies.exarl import DDPGParams, TD3Params  # defers gymnasium, torch

        def make() -> Any:
            common = dict(env=env, workflow=workflow.value, sync_every=sync_every, episodes=episodes,
                          env_steps=env_steps, seed=seed, hidden=_widths(hidden), actor_lr=actor_lr,
                          critic_lr=critic_lr, gamma=gamma, tau=tau, batch_size=batch_size, replay_capacity=replay,
                          learning_starts=learning_starts, update_ratio=update_ratio,
                          exploration_noise=exploration_noise, per=per, per_alpha=per_alpha, per_beta0=per_beta0,
                          per_beta_updates=per_beta_updates, eval_episodes=eval_episodes, learners=learners,
                          actors=actors, selection=selection.value, queue_capacity=queue_capacity, timeout=timeout)
            if td3:
                return TD3Params(clipped_double_q=clipped_double_q, policy_delay=policy_delay,
                                 target_smoothing=target_smoothing, target_noise=target_noise, noise_clip=noise_clip,
                                 **common)

            for name in ("clipped_double_q", "policy_delay", "target_smoothing", "target_noise", "noise_clip"):
                if given(ctx, name):
                    raise UsageError(f"--{name.replace('_', '-')} applies to td3 only")
            return DDPGParams(**common)

        _run(ctx, domain, make, episodes=episodes, env_steps=env_steps, resume=resume, out=out,
             overwrite=overwrite, json_output=json_output, device=device, checkpoint_every=checkpoint_every)

    command.__doc__ = doc
    return command


train_app.command("td3")(_continuous_command(
    "td3", "Train TD3: DDPG with clipped double Q, delayed policy updates and target policy smoothing, "
           "each of which can be switched off."))
train_app.command("ddpg")(_continuous_command(
    "ddpg", "Train DDPG (deterministic actor, Q critic, soft target updates), optionally with "
            "prioritised experience replay."))

"""EXARL's agents (issue 16) in one process: ``train td3``, ``train ddpg``, ``train a2c``.

The ``sequential`` workflow lives here: one actor and the learner take turns in
one process, like Grandio's Algorithm 1 (:mod:`popplay.deep.topologies.dqn`). A2C's
multi-process workflows (``multi-learner``, ``master-learner``, ``central-inference``,
for all three agents) are :mod:`popplay.deep.topologies.exarl_ranks`; rank 0's side runs
through the experiments here (:meth:`_Experiment._topology_phase`).

- **TD3, DDPG**: one phase plays ``sync_every`` episodes with the explorer (uniform
  actions until the learner's first update, then ``mu(s)`` plus Gaussian noise),
  stores them and runs the ``update_ratio`` updates per transition the learner owes.
- **A2C**: one phase plays one episode on each of ``copies`` environment copies with
  the actor's copy of the policy, then cuts the padded ``(T, copies)`` trajectory
  into ``n_steps``-row segments and learns from them in time order. The actor's copy
  is refreshed from the learner every ``sync_every`` phases, so every segment after
  the first is played by a policy that lags the learner's — the staleness EXARL's
  actors have, which V-trace corrects and plain A2C ignores.

A phase depends only on the state and the run's seed (episode seeds come from
:func:`popplay.deep.envs.rollout.episode_seed`), so ``--resume`` continues exactly.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from popplay.core.errors import UsageError
from popplay.core.options import option
from popplay.core.registry import DEEP, DomainSpec, register
from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.a2c import A2C, A2CConfig, SampledPolicy, Trajectory, greedy_policy, trajectory_from_episodes
from popplay.deep.agents.ddpg import DDPG, DDPGConfig, deterministic_policy
from popplay.deep.agents.replay import Batch
from popplay.deep.agents.td3 import TD3, TD3Config
from popplay.deep.envs import EnvError
from popplay.deep.envs.rollout import episode_seed, play_episodes
from popplay.deep.topologies.base import (
    ENV_HELP,
    ENV_STEPS_HELP,
    EPISODES_HELP,
    EVAL_HELP,
    GAMMA_HELP,
    SEED_HELP,
    DeepParams,
    check_at_least_one,
    check_evaluation_and_timeout,
    check_finite_arrays,
    config_from,
    count_episodes,
    curve_arrays,
    restore_progress,
    topology_counters,
)
from popplay.deep.topologies.common import check_budget, greedy_quality, recent_mean
from popplay.deep.topologies.families import RankedExperiment
from popplay.deep.topologies.population_params import agent_memory_bytes
from popplay.deep.topologies.workflow_params import (  # noqa: F401  (SELECTIONS, WORKFLOWS re-exported)
    REPLAY_TOPOLOGIES,
    SELECTIONS,
    WORKFLOWS,
    WorkflowParams,
)


@dataclass(frozen=True)
class DDPGParams(WorkflowParams, DeepParams):
    """Train DDPG (deterministic actor, Q critic, soft target updates), optionally with
    prioritised experience replay."""

    workflow: str = option(
        "sequential", "sequential: the actor plays, then the learner trains, in one process. multi-learner: actors' "
                      "queues read by data-parallel learners; master-learner: actors send to learner 0, which hands "
                      "batches out; central-inference: one rank holds the model and acts for every actor. Grandio's "
                      "topologies (see train dqn --help): pipelined (one actor), collective, async, with --actors "
                      "simulators.",
        choices=REPLAY_TOPOLOGIES)
    env: str = option("Pendulum-v1", "A gymnasium id with continuous actions (Pendulum-v1, ...).")
    sync_every: int = option(1, "Episodes per phase (per simulator between exchanges in Grandio's MPI DQN topologies).",
                             min=1)
    episodes: int = option(0, EPISODES_HELP, min=0, budget=True)
    env_steps: int = option(0, ENV_STEPS_HELP, min=0, budget=True)
    seed: int = option(0, SEED_HELP)
    hidden: tuple[int, ...] = option((256, 256), "Hidden widths of the actor and critics.")
    actor_lr: float = option(1e-3, "Adam learning rate of the actor.")
    critic_lr: float = option(1e-3, "Adam learning rate of the critics.")
    gamma: float = option(0.99, GAMMA_HELP, min=0.0, max=1.0)
    tau: float = option(0.005, "Polyak rate of the target networks.", min=0.0, max=1.0)
    batch_size: int = option(256, "Minibatch of each update.", min=1)
    replay_capacity: int = option(200_000, "Replay capacity in transitions.", min=1, name="--replay")
    learning_starts: int = option(1_000, "Transitions stored (uniform random actions) before the first update.",
                                  min=0)
    update_ratio: float = option(1.0, "Gradient updates per environment step.")
    exploration_noise: float = option(0.1, "Acting noise, in action half-ranges.")
    per: bool = option(False, "Prioritised experience replay (sum-tree).")
    per_alpha: float = option(0.6, "--per: priority exponent α.")
    per_beta0: float = option(0.4, "--per: importance-weight exponent β at the start.")
    per_beta_updates: int = option(20_000, "--per: updates over which β rises to 1.", min=1)
    eval_episodes: int = option(10, EVAL_HELP, min=0)

    def _config_type(self) -> type:
        return DDPGConfig

    def agent_config(self) -> Any:
        return config_from(self, self._config_type())

    def validate(self) -> None:
        self._validate_layout(REPLAY_TOPOLOGIES)
        if self.workflow == "pipelined" and self.actors != 1:
            raise ValueError("actors: the pipelined topology has exactly one simulator")
        check_evaluation_and_timeout(self.eval_episodes)
        check_budget(self.episodes, self.env_steps)
        self.agent_config().validate()

    # Grandio's topologies read the layout under their own names.
    @property
    def simulators(self) -> int:
        return self.actors

    def new_learner(self, info: Any) -> Any:
        return DDPG(self.agent_config(), info.obs_dim, info.action_low, info.action_high, self.seed)


@dataclass(frozen=True)
class TD3Params(DDPGParams):
    """Train TD3: DDPG with clipped double Q, delayed policy updates and target policy
    smoothing, each of which can be switched off."""

    clipped_double_q: bool = option(True, "Target from the smaller of two critics.")
    policy_delay: int = option(2, "Critic steps per actor step.", min=1)
    target_smoothing: bool = option(True, "Clipped noise on the target action.")
    target_noise: float = option(0.2, "Smoothing noise, in action half-ranges.")
    noise_clip: float = option(0.5, "Smoothing noise clip, in action half-ranges.")

    def _config_type(self) -> type:
        return TD3Config

    def new_learner(self, info: Any) -> Any:
        return TD3(self.agent_config(), info.obs_dim, info.action_low, info.action_high, self.seed)


@dataclass(frozen=True)
class A2CParams(WorkflowParams, DeepParams):
    """Train A2C (policy gradient with a learned baseline and an entropy bonus), with or
    without V-trace's off-policy correction."""

    env: str = option("CartPole-v1", ENV_HELP)
    copies: int = option(8, "Environment copies; one episode each per phase.", min=1)
    n_steps: int = option(16, "Rows of each learning segment (one update each).", min=1)
    sync_every: int = option(1, "Phases between refreshes of the actor's copy of the policy.", min=1)
    episodes: int = option(0, EPISODES_HELP, min=0, budget=True)
    env_steps: int = option(0, ENV_STEPS_HELP, min=0, budget=True)
    seed: int = option(0, SEED_HELP)
    hidden: tuple[int, ...] = option((64, 64), "Hidden widths of the policy and value networks.")
    lr: float = option(1e-3, "Adam learning rate.")
    gamma: float = option(0.99, GAMMA_HELP, min=0.0, max=1.0)
    value_coef: float = option(0.5, "Weight of the value loss.")
    entropy_coef: float = option(0.01, "Weight of the entropy bonus.")
    max_grad_norm: float = option(0.5, "Gradient norm clip.")
    vtrace: bool = option(True, "Correct for the actor's stale policy with V-trace (IMPALA).")
    rho_bar: float = option(1.0, "V-trace: truncation of the ratios in targets and advantages.")
    c_bar: float = option(1.0, "V-trace: truncation of the ratios in the traces.")
    eval_episodes: int = option(20, EVAL_HELP, min=0)

    def agent_config(self) -> Any:
        return config_from(self, A2CConfig)

    def validate(self) -> None:
        self._validate_layout()
        check_at_least_one(copies=self.copies, n_steps=self.n_steps)
        check_evaluation_and_timeout(self.eval_episodes)
        check_budget(self.episodes, self.env_steps)
        self.agent_config().validate()

    def new_learner(self, info: Any) -> Any:
        return A2C(self.agent_config(), info.obs_dim, int(info.actions), self.seed)


@dataclass
class ExarlState:
    agent: Any  # DDPG, TD3 or A2C learner
    explore: Any  # torch.Generator of the actor's draws
    actor: Any = None  # A2C: the actor's (possibly stale) copy of the policy
    phases: int = 0
    episodes: int = 0
    env_steps: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # multi-process workflows' totals


class _Experiment(RankedExperiment):
    """What the three experiments share beyond :class:`RankedExperiment`: curves and the
    run file's arrays."""

    domain = ""

    def __init__(self, params: Any, backend: Any) -> None:
        self._open(params, backend, getattr(params, "copies", 1))
        self._check_env()
        self._attach_topology()

    def _topology_phase(self, state: ExarlState) -> ExarlState | None:
        """One round of a multi-process topology (counted as a phase); None in a
        sequential run (the caller plays its phase)."""
        ran = self._topology_round(state)
        if ran is not None:
            ran.phases += 1
        return ran

    def _check_env(self) -> None:
        raise NotImplementedError

    def measure(self, state: ExarlState) -> dict[str, float]:
        return {"return": recent_mean(state.returns), "updates": float(state.agent.updates)}

    def state_arrays(self, state: ExarlState) -> dict[str, Any]:
        self._note(state)
        out = {**state.agent.arrays(), "rng.explore": networks.generator_array(state.explore), **curve_arrays(state)}
        if state.actor is not None:
            out.update(networks.module_arrays(state.actor, "actor_copy"))
        return out

    def state_counters(self, state: ExarlState) -> dict[str, Any]:
        return {**state.agent.counters(), "phases": state.phases, "episodes": state.episodes,
                "env_steps": state.env_steps, **topology_counters(state.extra)}

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> ExarlState:
        check_finite_arrays(arrays)
        state = self.initial_state()
        state.agent.load(arrays, counters)
        networks.load_generator(state.explore, arrays["rng.explore"])
        if state.actor is not None:
            networks.load_module_arrays(state.actor, "actor_copy", arrays)
        restore_progress(state, arrays, counters)
        self._note(state)
        return state

    def summary_extras(self, state: ExarlState) -> dict[str, Any]:
        return {"return": recent_mean(state.returns), "updates": state.agent.updates,
                **{f"topology_{k}": v for k, v in state.extra.items()}}

    def _greedy(self, state: ExarlState) -> Any:
        raise NotImplementedError

    def quality(self, state: ExarlState, episodes: int | None = None) -> float:
        """Mean return of noiseless episodes (default ``eval_episodes``); NaN for 0."""

        n = self.params.eval_episodes if episodes is None else episodes
        if n == 0:
            return float("nan")
        return greedy_quality(self.params.env, self._greedy(state), n, self.params.seed)[0]

    def returns_of_greedy(self, state: ExarlState, episodes: int, seed: int) -> np.ndarray:
        return greedy_quality(self.params.env, self._greedy(state), episodes, seed)[1]


class _ContinuousExperiment(_Experiment):
    agent_name = ""

    def _check_env(self) -> None:
        if self.info.discrete:
            raise EnvError(f"--env {self.params.env}: {self.agent_name} needs continuous actions "
                           "(this environment's are discrete)")

    def initial_state(self) -> ExarlState:
        return ExarlState(agent=self.params.new_learner(self.info),
                          explore=networks.generator(self.params.seed * 7919 + 3))

    def phase(self, state: ExarlState, *, time_left: float | None) -> ExarlState:
        ran = self._topology_phase(state)
        if ran is not None:
            return ran
        agent = state.agent
        explorer = agent.explorer(agent.policy, state.explore)
        for _ in range(self.params.sync_every):
            if self.finished(state, time_mode=False):
                break
            explorer.exploration = agent.exploration_at(agent.updates)
            episodes = play_episodes(self._env, explorer, [episode_seed(self.params.seed, 0, state.episodes)])
            agent.receive(Batch(torch.as_tensor(episodes.obs),
                                torch.as_tensor(episodes.action, dtype=torch.float32).reshape(episodes.steps, -1),
                                torch.as_tensor(episodes.reward), torch.as_tensor(episodes.next_obs),
                                torch.as_tensor(episodes.terminated).float()))
            count_episodes(state, episodes.returns, episodes.lengths, episodes.steps)
            agent.train()
        state.phases += 1
        return state

    def _greedy(self, state: ExarlState) -> Any:
        return deterministic_policy(state.agent.actor)


class DDPGExperiment(_ContinuousExperiment):
    domain = "ddpg"
    agent_name = "ddpg"


class TD3Experiment(_ContinuousExperiment):
    domain = "td3"
    agent_name = "td3"


class A2CExperiment(_Experiment):
    """``sequential`` here; the other workflows run rank 0's side of
    :mod:`popplay.deep.topologies.exarl_ranks` (one learner round, or a few inference steps,
    per phase)."""

    domain = "a2c"

    def _check_env(self) -> None:
        envs.require_discrete(self.info, "a2c")

    def initial_state(self) -> ExarlState:
        agent = self.params.new_learner(self.info)
        return ExarlState(agent=agent, explore=networks.generator(self.params.seed * 7919 + 4),
                          actor=copy.deepcopy(agent.policy))

    def phase(self, state: ExarlState, *, time_left: float | None) -> ExarlState:
        p = self.params
        ran = self._topology_phase(state)
        if ran is not None:
            return ran
        if state.phases % p.sync_every == 0:
            state.actor.load_state_dict(state.agent.policy.state_dict())
        seeds = [episode_seed(p.seed, copy, state.phases) for copy in range(p.copies)]
        episodes = play_episodes(self._env, SampledPolicy(state.actor, state.explore), seeds)
        traj = trajectory_from_episodes(episodes, state.actor)
        for start in range(0, traj.reward.shape[0], p.n_steps):
            segment = Trajectory(*(t[start:start + p.n_steps] for t in traj))
            if float(segment.mask.sum()) > 0:
                state.agent.learn(segment)
        count_episodes(state, episodes.returns, episodes.lengths, episodes.steps)
        state.phases += 1
        return state

    def summary_extras(self, state: ExarlState) -> dict[str, Any]:
        rho = state.agent.last_mean_rho  # mean pi/mu of the last segment learned from (1: on policy)
        return {**super().summary_extras(state), "mean_rho": None if rho != rho else rho}

    def _greedy(self, state: ExarlState) -> Any:
        return greedy_policy(state.agent.policy)


class OnPolicyWorkflowExperiment(_Experiment):
    """Rank 0 of any on-policy agent's multi-process workflow (PPO's
    ``--workflow multi-learner``): one learner round per phase, the agent learning
    through ``learn_shared`` (:meth:`exarl_ranks.Learners.round`)."""

    def __init__(self, params: Any, backend: Any) -> None:
        self.domain = params.domain
        super().__init__(params, backend)

    def _check_env(self) -> None:
        envs.require_discrete(self.info, self.domain)

    def initial_state(self) -> ExarlState:
        return ExarlState(agent=self.params.new_learner(self.info),
                          explore=networks.generator(self.params.seed * 7919 + 4))

    def phase(self, state: ExarlState, *, time_left: float | None) -> ExarlState:
        ran = self._topology_phase(state)
        if ran is None:
            raise UsageError(f"{self.domain}'s sequential runs are not a workflow")
        return ran

    def _greedy(self, state: ExarlState) -> Any:
        return greedy_policy(state.agent.policy)


for _spec in (DomainSpec(name="a2c", params=A2CParams, experiment=A2CExperiment, kind=DEEP,
                         steps_label="environment steps", memory=agent_memory_bytes,
                         summary="A2C with or without V-trace, in EXARL's workflows."),
              DomainSpec(name="td3", params=TD3Params, experiment=TD3Experiment, kind=DEEP,
                         steps_label="environment steps", memory=agent_memory_bytes,
                         summary="TD3 in EXARL's workflows."),
              DomainSpec(name="ddpg", params=DDPGParams, experiment=DDPGExperiment, kind=DEEP,
                         steps_label="environment steps", memory=agent_memory_bytes,
                         summary="DDPG, optionally with prioritised replay, in EXARL's workflows.")):
    register(_spec)

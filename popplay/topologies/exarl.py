"""EXARL's agents (issue 16) in one process: ``train td3``, ``train ddpg``, ``train a2c``.

The ``sequential`` workflow lives here: one actor and the learner take turns in
one process, like seed 003's Algorithm 1 (:mod:`popplay.topologies.dqn`). A2C's
multi-process workflows (``multi-learner``, ``master-learner``, ``central-inference``,
for all three agents) are :mod:`popplay.topologies.exarl_ranks`; rank 0's side runs
through the experiments here (:meth:`_Experiment._workflow_phase`).

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
:func:`popplay.envs.rollout.episode_seed`), so ``--resume`` continues exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from popplay.topologies.base import (DeepExperiment, DeepParams, check_at_least_one, check_evaluation_and_timeout,
                                     config_from, count_episodes, curve_arrays, restore_curves, topology_counters)
from popplay.topologies.common import check_budget, recent_mean

WORKFLOWS = ("sequential", "multi-learner", "master-learner", "central-inference")
SELECTIONS = ("range", "random")


def _check_workflow(workflow: str) -> None:
    if workflow not in WORKFLOWS:
        raise ValueError(f"workflow must be one of {', '.join(WORKFLOWS)} (got {workflow!r})")




@dataclass(frozen=True)
class WorkflowParams(DeepParams):
    """The multi-process workflows' layout (:mod:`popplay.topologies.exarl_ranks`),
    shared by every EXARL agent's parameters."""

    workflow: str = "sequential"
    learners: int = 2  # multi-learner, master-learner
    actors: int = 2
    selection: str = "range"  # multi-learner: range (each learner its block of actors) or random
    queue_capacity: int = 4  # multi-learner, range: trajectories an actor keeps unread at most
    timeout: float = 60.0  # seconds any wait for another rank may take

    def _validate_layout(self) -> None:
        _check_workflow(self.workflow)
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)} (got {self.selection!r})")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive (got {self.timeout})")
        check_at_least_one(sync_every=self.sync_every, learners=self.learners, actors=self.actors,  # type: ignore[attr-defined]
                           queue_capacity=self.queue_capacity)

    @property
    def topology(self) -> str:
        return self.workflow

    @property
    def ranks(self) -> int:
        if self.workflow == "sequential":
            return 1
        if self.workflow == "central-inference":
            return 1 + self.actors
        return self.learners + self.actors

    def new_learner(self, info: Any) -> Any:
        """The learner of this run (same seed, same initial networks on every rank)."""
        raise NotImplementedError


@dataclass(frozen=True)
class DDPGParams(WorkflowParams):
    """Everything a DDPG run depends on (stored in the run file's config)."""

    env: str = "Pendulum-v1"
    sync_every: int = 1  # episodes per phase
    episodes: int = 0
    env_steps: int = 0
    seed: int = 0
    hidden: tuple[int, ...] = (256, 256)
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    replay_capacity: int = 200_000
    learning_starts: int = 1_000
    update_ratio: float = 1.0
    exploration_noise: float = 0.1
    per: bool = False
    per_alpha: float = 0.6
    per_beta0: float = 0.4
    per_beta_updates: int = 20_000
    eval_episodes: int = 10

    def _config_type(self) -> type:
        from popplay.agents.ddpg import DDPGConfig

        return DDPGConfig

    def agent_config(self) -> Any:
        return config_from(self, self._config_type())

    def validate(self) -> None:
        self._validate_layout()
        check_evaluation_and_timeout(self.eval_episodes)
        check_budget(self.episodes, self.env_steps)
        self.agent_config().validate()

    def new_learner(self, info: Any) -> Any:
        from popplay.agents.ddpg import DDPG

        return DDPG(self.agent_config(), info.obs_dim, info.action_low, info.action_high, self.seed)


@dataclass(frozen=True)
class TD3Params(DDPGParams):
    clipped_double_q: bool = True
    policy_delay: int = 2
    target_smoothing: bool = True
    target_noise: float = 0.2
    noise_clip: float = 0.5

    def _config_type(self) -> type:
        from popplay.agents.td3 import TD3Config

        return TD3Config

    def new_learner(self, info: Any) -> Any:
        from popplay.agents.td3 import TD3

        return TD3(self.agent_config(), info.obs_dim, info.action_low, info.action_high, self.seed)


@dataclass(frozen=True)
class A2CParams(WorkflowParams):
    env: str = "CartPole-v1"
    copies: int = 8  # environment copies, one episode each per phase
    n_steps: int = 16  # rows of a learning segment
    sync_every: int = 1  # phases between refreshes of the actor's copy of the policy
    episodes: int = 0
    env_steps: int = 0
    seed: int = 0
    hidden: tuple[int, ...] = (64, 64)
    lr: float = 1e-3
    gamma: float = 0.99
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    vtrace: bool = True
    rho_bar: float = 1.0
    c_bar: float = 1.0
    eval_episodes: int = 20

    def agent_config(self) -> Any:
        from popplay.agents.a2c import A2CConfig

        return config_from(self, A2CConfig)

    def validate(self) -> None:
        self._validate_layout()
        check_at_least_one(copies=self.copies, n_steps=self.n_steps)
        check_evaluation_and_timeout(self.eval_episodes)
        check_budget(self.episodes, self.env_steps)
        self.agent_config().validate()

    def new_learner(self, info: Any) -> Any:
        from popplay.agents.a2c import A2C

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


class _Experiment(DeepExperiment):
    """What the three experiments share beyond :class:`DeepExperiment`: curves and the
    run file's arrays."""

    domain = ""

    def __init__(self, params: Any, backend: Any) -> None:
        self._open(params, backend, getattr(params, "copies", 1))
        self._check_env()
        self._flow: Any = None  # rank 0's side of a multi-process workflow
        self._no_ranks: Any = None
        if params.workflow != "sequential":
            from popplay.distributed.group import current
            from popplay.runner import UsageProblem
            from popplay.topologies import exarl_ranks

            dist = current()
            if not dist.distributed:
                # One process may still read the run file (evaluate); training needs the ranks.
                self._no_ranks = UsageProblem(f"--workflow {params.workflow} runs on {params.ranks} ranks "
                                              "(launched by popplay)")
                return
            if params.workflow == "central-inference":
                self._flow = exarl_ranks.CentralServer(dist, params, self.info)
            else:
                group = exarl_ranks.learner_group(dist, params)
                self._flow = exarl_ranks.Learners(dist, params, group, self.info.obs_dim)

    def finished(self, state: ExarlState, *, time_mode: bool) -> bool:
        if self._flow is not None:
            return self._flow.done
        return super().finished(state, time_mode=time_mode)

    def close(self, state: ExarlState) -> None:
        """Stop the other ranks if the run ended early (Ctrl-C, a time limit)."""
        flow = self._flow
        if flow is None:
            return
        if not flow.done:
            if self.params.workflow != "central-inference":
                flow.round(state.agent, stop=True)
            flow.finish(state.agent, stopped=True)
        from popplay.topologies.exarl_ranks import last_barrier

        last_barrier(flow.dist)

    def _workflow_phase(self, state: ExarlState) -> ExarlState | None:
        """One learner round (or a few inference steps) of a multi-process workflow;
        None in a sequential run (the caller plays its phase)."""
        flow = self._flow
        if flow is None:
            if self._no_ranks is not None:
                raise self._no_ranks
            return None
        if self.params.workflow == "central-inference":
            r = flow.steps(state.agent, state.explore, 32)
        else:
            r = flow.round(state.agent)
        state.episodes += len(r.returns)
        state.env_steps += r.steps
        state.returns.extend(r.returns)
        state.lengths.extend(r.lengths)
        if r.all_finished or r.stop:
            state.extra.update(flow.finish(state.agent, stopped=r.stop) or {})
        state.phases += 1
        return state

    def _check_env(self) -> None:
        raise NotImplementedError

    def measure(self, state: ExarlState) -> dict[str, float]:
        return {"return": recent_mean(state.returns), "updates": float(state.agent.updates)}

    def state_arrays(self, state: ExarlState) -> dict[str, Any]:
        from popplay.agents import networks

        self._note(state)
        out = {**state.agent.arrays(), "rng.explore": networks.generator_array(state.explore), **curve_arrays(state)}
        if state.actor is not None:
            out.update(networks.module_arrays(state.actor, "actor_copy"))
        return out

    def state_counters(self, state: ExarlState) -> dict[str, Any]:
        return {**state.agent.counters(), "phases": state.phases, "episodes": state.episodes,
                "env_steps": state.env_steps, **topology_counters(state.extra)}

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> ExarlState:
        from popplay.agents import networks

        state = self.initial_state()
        state.agent.load(arrays, counters)
        networks.load_generator(state.explore, arrays["rng.explore"])
        if state.actor is not None:
            networks.load_module_arrays(state.actor, "actor_copy", arrays)
        state.phases = int(counters["phases"])
        state.episodes = int(counters["episodes"])
        state.env_steps = int(counters["env_steps"])
        restore_curves(state, arrays)
        if len(state.returns) != state.episodes:
            raise ValueError(f"{len(state.returns)} episode returns stored for {state.episodes} episodes")
        self._note(state)
        return state

    def summary_extras(self, state: ExarlState) -> dict[str, Any]:
        return {"return": recent_mean(state.returns), "updates": state.agent.updates,
                **{f"topology_{k}": v for k, v in state.extra.items()}}

    def _greedy(self, state: ExarlState) -> Any:
        raise NotImplementedError

    def quality(self, state: ExarlState, episodes: int | None = None) -> float:
        """Mean return of noiseless episodes (default ``eval_episodes``); NaN for 0."""
        from popplay.topologies.common import greedy_quality

        n = self.params.eval_episodes if episodes is None else episodes
        if n == 0:
            return float("nan")
        return greedy_quality(self.params.env, self._greedy(state), n, self.params.seed)[0]

    def returns_of_greedy(self, state: ExarlState, episodes: int, seed: int) -> np.ndarray:
        from popplay.topologies.common import greedy_quality

        return greedy_quality(self.params.env, self._greedy(state), episodes, seed)[1]


class _ContinuousExperiment(_Experiment):
    agent_name = ""

    def _check_env(self) -> None:
        from popplay.envs import EnvError

        if self.info.discrete:
            raise EnvError(f"--env {self.params.env}: {self.agent_name} needs continuous actions "
                           "(this environment's are discrete)")

    def initial_state(self) -> ExarlState:
        from popplay.agents import networks

        return ExarlState(agent=self.params.new_learner(self.info),
                          explore=networks.generator(self.params.seed * 7919 + 3))

    def phase(self, state: ExarlState, *, time_left: float | None) -> ExarlState:
        import torch

        from popplay.agents.ddpg import GaussianExplorer
        from popplay.agents.replay import Batch
        from popplay.envs.rollout import episode_seed, play_episodes

        ran = self._workflow_phase(state)
        if ran is not None:
            return ran
        agent = state.agent
        explorer = GaussianExplorer(agent.actor, self.config.exploration_noise, state.explore)
        for _ in range(self.params.sync_every):
            if self.finished(state, time_mode=False):
                break
            explorer.uniform = agent.updates == 0
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
        from popplay.agents.ddpg import deterministic_policy

        return deterministic_policy(state.agent.actor)


class DDPGExperiment(_ContinuousExperiment):
    domain = "ddpg"
    agent_name = "ddpg"


class TD3Experiment(_ContinuousExperiment):
    domain = "td3"
    agent_name = "td3"


class A2CExperiment(_Experiment):
    """``sequential`` here; the other workflows run rank 0's side of
    :mod:`popplay.topologies.exarl_ranks` (one learner round, or a few inference steps,
    per phase)."""

    domain = "a2c"

    def _check_env(self) -> None:
        from popplay import envs

        envs.require_discrete(self.info, "a2c")

    def initial_state(self) -> ExarlState:
        import copy

        from popplay.agents import networks

        agent = self.params.new_learner(self.info)
        return ExarlState(agent=agent, explore=networks.generator(self.params.seed * 7919 + 4),
                          actor=copy.deepcopy(agent.policy))

    def phase(self, state: ExarlState, *, time_left: float | None) -> ExarlState:
        from popplay.agents.a2c import SampledPolicy, Trajectory, trajectory_from_episodes
        from popplay.envs.rollout import episode_seed, play_episodes

        p = self.params
        ran = self._workflow_phase(state)
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
        from popplay.agents.a2c import greedy_policy

        return greedy_policy(state.agent.policy)

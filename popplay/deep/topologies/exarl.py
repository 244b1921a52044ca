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
from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.a2c import SampledPolicy, Trajectory, greedy_policy, trajectory_from_episodes
from popplay.deep.agents.a2c_members import A2CMembers
from popplay.deep.agents.continuous_members import ContinuousMembers
from popplay.deep.agents.ddpg import deterministic_policy
from popplay.deep.agents.replay import Batch
from popplay.deep.envs import EnvError
from popplay.deep.envs.rollout import episode_seed, play_episodes
from popplay.deep.topologies.base import (
    check_finite_arrays,
    count_episodes,
    curve_arrays,
    restore_progress,
    topology_counters,
)
from popplay.deep.topologies.common import greedy_quality, recent_mean
from popplay.deep.topologies.exarl_params import (  # noqa: F401  (registered there)
    A2C_HYPER_BOUNDS,
    CONTINUOUS_HYPER_BOUNDS,
    A2CParams,
    DDPGParams,
    TD3Params,
)
from popplay.deep.topologies.families import RankedExperiment
from popplay.deep.topologies.population import ActorCriticPopulation, PopulationExperiment
from popplay.deep.topologies.workflow_params import (  # noqa: F401  (SELECTIONS, WORKFLOWS re-exported)
    REPLAY_TOPOLOGIES,
    SELECTIONS,
    WORKFLOWS,
    WorkflowParams,
)


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
    """With ``--agents`` P > 1, a :class:`ContinuousPopulation` instead."""

    domain = "ddpg"
    agent_name = "ddpg"

    def __new__(cls, params: Any, backend: Any) -> Any:
        if cls in (DDPGExperiment, TD3Experiment) and params.agents > 1:
            return ContinuousPopulation(params, backend)
        return super().__new__(cls)


class TD3Experiment(DDPGExperiment):
    domain = "td3"
    agent_name = "td3"


class ContinuousPopulation(PopulationExperiment):
    """``--agents`` P DDPG or TD3 learners batched in one process, one environment each
    (:mod:`popplay.deep.agents.continuous_members`)."""

    hyper_bounds = CONTINUOUS_HYPER_BOUNDS

    def __init__(self, params: Any, backend: Any, members: np.ndarray | None = None) -> None:
        self.domain = params.domain
        super().__init__(params, backend, members)
        if self.info.discrete:
            raise EnvError(f"--env {params.env}: {self.domain} needs continuous actions (this environment's are "
                           "discrete)")

    def new_learner(self, members: np.ndarray, hypers: dict[str, np.ndarray]) -> ContinuousMembers:
        return ContinuousMembers(self.params.agent_config(), self.info.obs_dim, self.info.action_low,
                                 self.info.action_high, self.params.seed, members, hypers, device=self.device,
                                 init_from=self.initial_networks(members))


class A2CExperiment(_Experiment):
    """``sequential`` here; the other workflows run rank 0's side of
    :mod:`popplay.deep.topologies.exarl_ranks` (one learner round, or a few inference steps,
    per phase); with ``--agents`` P > 1, an :class:`A2CPopulation` instead."""

    domain = "a2c"

    def __new__(cls, params: A2CParams, backend: Any) -> Any:
        if cls is A2CExperiment and params.agents > 1:
            return A2CPopulation(params, backend)
        return super().__new__(cls)

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



class A2CPopulation(ActorCriticPopulation):
    """``--agents`` P synchronous A2C learners batched in one process, ``--copies``
    environments each (:mod:`popplay.deep.agents.a2c_members`)."""

    domain = "a2c"
    hyper_bounds = A2C_HYPER_BOUNDS
    learner_class = A2CMembers

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

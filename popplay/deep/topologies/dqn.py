"""Double DQN over simulators and a learner (Grandio's MPI DQN).

``sequential`` is Algorithm 1: play an episode, store it, train, repeat; with
``train_every`` K it trains every K environment steps instead, mid-episode too (the
schedule of stable-baselines3's ``train_freq``). The other
topologies run the learner on rank 0 and simulators on the other ranks: Grandio's
(``pipelined``, ``collective``, ``async``: :mod:`popplay.deep.topologies.dqn_ranks`) and
EXARL's workflows (``multi-learner``, ``master-learner``, ``central-inference``:
:mod:`popplay.deep.topologies.exarl_ranks`), any replay agent in any of them. In every topology the
learner owes ``update_ratio`` gradient updates per transition it receives (Grandio
§III-C: it trains as much as the simulators produced), ε falls with learner updates,
and one phase of the experiment is ``sync_every`` episodes per simulator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.dqn import DoubleDQN, EpsilonGreedy, greedy_policy
from popplay.deep.agents.dqn_members import DQNMembers
from popplay.deep.agents.replay import Batch
from popplay.deep.envs.rollout import Episodes, episode_seed, play_episodes
from popplay.deep.topologies.base import (
    check_finite_arrays,
    count_episodes,
    curve_arrays,
    restore_curves,
    topology_counters,
    topology_extra,
)
from popplay.deep.topologies.common import greedy_quality, recent_mean
from popplay.deep.topologies.dqn_params import HYPER_BOUNDS, SPEC, DQNParams  # noqa: F401  (SPEC: registered)
from popplay.deep.topologies.families import RankedExperiment
from popplay.deep.topologies.population import PopulationExperiment


@dataclass
class DQNState:
    """The learner's view: the agent, its explorer's generator, counters and curves."""

    agent: Any  # popplay.deep.agents.dqn.DoubleDQN
    explore: Any  # torch.Generator of the (sequential) simulator's ε-greedy draws
    episodes: int = 0
    env_steps: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # topology counters (e.g. checksums)


class DQNExperiment(RankedExperiment):
    """The runner's view of a DQN run (:class:`popplay.core.experiment.Experiment`);
    with ``--agents`` P > 1, a :class:`DQNPopulation` instead."""

    domain = "dqn"

    def __new__(cls, params: DQNParams, backend: Any) -> Any:
        if cls is DQNExperiment and params.agents > 1:
            return DQNPopulation(params, backend)
        return super().__new__(cls)

    def __init__(self, params: DQNParams, backend: Any) -> None:
        self._open(params, backend)
        envs.require_discrete(self.info, "dqn")
        self._attach_topology()

    def initial_state(self) -> DQNState:
        agent = DoubleDQN(self.config, self.info.obs_dim, int(self.info.actions), self.params.seed,
                          device=self.backend.device if self.backend is not None else "cpu")
        return DQNState(agent=agent, explore=networks.generator(self.params.seed * 7919 + 2))

    def phase(self, state: DQNState, *, time_left: float | None) -> DQNState:
        ran = self._topology_round(state)
        return ran if ran is not None else self._sequential_round(state)

    def _sequential_round(self, state: DQNState) -> DQNState:
        """Grandio's Algorithm 1, ``sync_every`` times: an episode, then training; with
        ``train_every`` K, training whenever the run's env-step count reaches a
        multiple of K, mid-episode too (the actor acts on the trained network at once)."""

        agent = state.agent
        actor = EpsilonGreedy(agent.q_values, agent.actions, state.explore)
        every = self.params.train_every

        def train_on(piece: Episodes) -> None:
            self.learn(state, piece)
            agent.train()
            actor.epsilon = agent.epsilon

        for _ in range(self.params.sync_every):
            if self.finished(state, time_mode=False):
                break
            actor.epsilon = agent.epsilon
            seeds = [episode_seed(self.params.seed, 0, state.episodes)]
            if every:
                # Only phase ends are stored, so the schedule depends on counters alone.
                rest = play_episodes(self._env, actor, seeds, hand_over=train_on,
                                     first=every - state.env_steps % every, every=every)
                self.learn(state, rest)  # trained on at the next multiple of K
            else:
                train_on(play_episodes(self._env, actor, seeds))
        return state

    def learn(self, state: DQNState, episodes: Any) -> None:
        """Hand a batch of episodes to the learner and count them."""
        state.agent.receive(to_batch(episodes))
        count_episodes(state, episodes.returns, episodes.lengths, episodes.steps)

    # --- measurements and the run file ------------------------------------------------
    def measure(self, state: DQNState) -> dict[str, float]:
        return {"return": recent_mean(state.returns), "epsilon": state.agent.epsilon,
                "updates": float(state.agent.updates)}

    def state_arrays(self, state: DQNState) -> dict[str, Any]:
        self._note(state)
        return {**state.agent.arrays(), "rng.explore": networks.generator_array(state.explore), **curve_arrays(state)}

    def state_counters(self, state: DQNState) -> dict[str, Any]:
        return {**state.agent.counters(), "episodes": state.episodes, "env_steps": state.env_steps,
                **topology_counters(state.extra)}

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> DQNState:
        check_finite_arrays(arrays)
        state = self.initial_state()
        state.agent.load(arrays, counters)
        networks.load_generator(state.explore, arrays["rng.explore"])
        state.episodes = int(counters["episodes"])
        state.env_steps = int(counters["env_steps"])
        restore_curves(state, arrays)
        if len(state.returns) != state.episodes:
            raise ValueError(f"{len(state.returns)} episode returns stored for {state.episodes} episodes")
        state.extra = topology_extra(counters)
        self._note(state)
        return state

    def summary_extras(self, state: DQNState) -> dict[str, Any]:
        """What a DQN run adds to the summary every deep run prints."""
        return {"return": recent_mean(state.returns), "updates": state.agent.updates,
                "epsilon": state.agent.epsilon, **topology_counters(state.extra)}

    # --- evaluation -------------------------------------------------------------------
    def quality(self, state: DQNState, episodes: int | None = None) -> float:
        """Mean return of greedy episodes (default ``eval_episodes``); NaN for 0."""

        n = self.params.eval_episodes if episodes is None else episodes
        if n == 0:
            return float("nan")
        return greedy_quality(self.params.env, greedy_policy(state.agent.q_values), n, self.params.seed)[0]

    def returns_of_greedy(self, state: DQNState, episodes: int, seed: int) -> np.ndarray:
        return greedy_quality(self.params.env, greedy_policy(state.agent.q_values), episodes, seed)[1]


class DQNPopulation(PopulationExperiment):
    """``--agents`` P Double DQN learners batched in one process (:mod:`popplay.deep.topologies.population`)."""

    domain = "dqn"
    hyper_bounds = HYPER_BOUNDS

    def __init__(self, params: DQNParams, backend: Any, members: np.ndarray | None = None) -> None:
        super().__init__(params, backend, members)
        envs.require_discrete(self.info, "dqn")

    def new_learner(self, members: np.ndarray, hypers: dict[str, np.ndarray]) -> DQNMembers:
        return DQNMembers(self.params.agent_config(), self.info.obs_dim, int(self.info.actions), self.params.seed,
                          members, hypers, device=self.device, init_from=self.initial_networks(members))

    def greedy(self, state: Any) -> Any:
        learner = state.learner

        def act(obs: np.ndarray) -> np.ndarray:
            return learner.q_values(torch.as_tensor(obs).unsqueeze(1))[:, 0].argmax(dim=1).cpu().numpy()
        return act


def to_batch(episodes: Any) -> Any:
    return Batch(torch.as_tensor(episodes.obs), torch.as_tensor(episodes.action).long(),
                 torch.as_tensor(episodes.reward), torch.as_tensor(episodes.next_obs),
                 torch.as_tensor(episodes.terminated).float())

"""Double DQN over simulators and a learner (seed 003).

``sequential`` is Algorithm 1: play an episode, store it, train, repeat; with
``train_every`` K it trains every K environment steps instead, mid-episode too (the
schedule of stable-baselines3's ``train_freq``). The other
topologies (``pipelined``, ``collective``, ``async``) run the learner on rank 0 and the
simulators on ranks 1..N (:mod:`popplay.topologies.dqn_ranks`). In every topology the
learner owes ``update_ratio`` gradient updates per transition it receives (seed 003
§III-C: it trains as much as the simulators produced), ε falls with learner updates,
and one phase of the experiment is ``sync_every`` episodes per simulator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from popplay.topologies import DQN_TOPOLOGIES
from popplay.topologies.base import (DeepExperiment, DeepParams, check_at_least_one, check_evaluation_and_timeout,
                                     config_from, count_episodes, curve_arrays, restore_curves, topology_counters,
                                     topology_extra)
from popplay.topologies.common import check_budget, recent_mean


@dataclass(frozen=True)
class DQNParams(DeepParams):
    """Everything a DQN run depends on (stored in the run file's config)."""

    env: str = "CartPole-v1"
    topology: str = "sequential"
    simulators: int = 1
    sync_every: int = 1  # episodes per simulator between exchanges (one phase)
    episodes: int = 0  # budget: episodes summed over simulators (0: none)
    env_steps: int = 0  # budget: environment steps summed over simulators (0: none)
    seed: int = 0
    hidden: tuple[int, ...] = (128, 128)
    lr: float = 1e-3
    gamma: float = 0.99
    batch_size: int = 64
    replay_capacity: int = 50_000
    learning_starts: int = 1_000
    update_ratio: float = 0.25
    train_every: int = 0  # sequential: env steps between trainings (0: after each episode)
    target_every: int = 250
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_updates: int = 5_000
    max_grad_norm: float = 10.0
    lr_end: float = 0.0
    lr_updates: int = 0
    eval_episodes: int = 100
    timeout: float = 60.0  # seconds any wait for another rank may take
    slow_simulator: float = 0.0  # test hook: seconds a simulator sleeps per episode
    slow_learner: float = 0.0  # test hook: seconds the learner sleeps per update

    def agent_config(self) -> Any:
        from popplay.agents.dqn import DQNConfig

        return config_from(self, DQNConfig)

    def validate(self) -> None:
        if self.topology not in DQN_TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(DQN_TOPOLOGIES)} (got {self.topology!r})")
        check_at_least_one(simulators=self.simulators)
        if self.topology in ("sequential", "pipelined") and self.simulators != 1:
            raise ValueError(f"simulators: the {self.topology} topology has exactly one simulator")
        check_at_least_one(sync_every=self.sync_every)
        if self.train_every < 0:
            raise ValueError(f"train_every must be non-negative (got {self.train_every})")
        if self.train_every and self.topology != "sequential":
            raise ValueError(f"train_every: only the sequential topology trains on a step schedule "
                             f"(got {self.topology!r})")
        check_evaluation_and_timeout(self.eval_episodes, self.timeout)
        check_budget(self.episodes, self.env_steps)
        self.agent_config().validate()

    @property
    def ranks(self) -> int:
        return 1 if self.topology == "sequential" else 1 + self.simulators


@dataclass
class DQNState:
    """The learner's view: the agent, its explorer's generator, counters and curves."""

    agent: Any  # popplay.agents.dqn.DoubleDQN
    explore: Any  # torch.Generator of the (sequential) simulator's ε-greedy draws
    episodes: int = 0
    env_steps: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # topology counters (e.g. checksums)


class DQNExperiment(DeepExperiment):
    """The runner's view of a DQN run (:class:`popplay.runner.Experiment`)."""

    domain = "dqn"

    def __init__(self, params: DQNParams, backend: Any) -> None:
        from popplay import envs

        self._open(params, backend)
        envs.require_discrete(self.info, "dqn")
        self._topology: Any = None  # rank 0's side of a multi-rank topology
        if params.topology != "sequential":
            from popplay.distributed.group import current

            if current().distributed:
                from popplay.topologies.dqn_ranks import Learner

                self._topology = Learner(current(), params, self.info.obs_dim)

    def close(self, state: DQNState) -> None:
        """Stop the simulators (once; nothing to do in one process)."""
        if self._topology is not None:
            self._topology.close(self, state)

    def initial_state(self) -> DQNState:
        from popplay.agents import networks
        from popplay.agents.dqn import DoubleDQN

        agent = DoubleDQN(self.config, self.info.obs_dim, int(self.info.actions), self.params.seed,
                          device=self.backend.device if self.backend is not None else "cpu")
        return DQNState(agent=agent, explore=networks.generator(self.params.seed * 7919 + 2))

    def phase(self, state: DQNState, *, time_left: float | None) -> DQNState:
        if self._topology is not None:
            return self._topology.round(self, state)
        return self._sequential_round(state)

    def _sequential_round(self, state: DQNState) -> DQNState:
        """Seed 003 Algorithm 1, ``sync_every`` times: an episode, then training; with
        ``train_every`` K, training whenever the run's env-step count reaches a
        multiple of K, mid-episode too (the actor acts on the trained network at once)."""
        from popplay.agents.dqn import EpsilonGreedy
        from popplay.envs.rollout import Episodes, episode_seed, play_episodes

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

    def learn_rows(self, state: DQNState, rows: np.ndarray, returns: np.ndarray, lengths: np.ndarray) -> None:
        """Hand packed transitions (:mod:`popplay.topologies.wire`) to the learner."""
        from popplay.topologies.wire import rows_to_batch

        state.agent.receive(rows_to_batch(rows, self.info.obs_dim))
        count_episodes(state, returns, lengths, int(rows.shape[0]))

    def learn(self, state: DQNState, episodes: Any) -> None:
        """Hand a batch of episodes to the learner and count them."""
        state.agent.receive(to_batch(episodes))
        count_episodes(state, episodes.returns, episodes.lengths, episodes.steps)

    # --- measurements and the run file ------------------------------------------------
    def measure(self, state: DQNState) -> dict[str, float]:
        return {"return": recent_mean(state.returns), "epsilon": state.agent.epsilon,
                "updates": float(state.agent.updates)}

    def state_arrays(self, state: DQNState) -> dict[str, Any]:
        from popplay.agents import networks

        self._note(state)
        return {**state.agent.arrays(), "rng.explore": networks.generator_array(state.explore), **curve_arrays(state)}

    def state_counters(self, state: DQNState) -> dict[str, Any]:
        return {**state.agent.counters(), "episodes": state.episodes, "env_steps": state.env_steps,
                **topology_counters(state.extra)}

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> DQNState:
        from popplay.agents import networks

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
                "epsilon": state.agent.epsilon}

    # --- evaluation -------------------------------------------------------------------
    def quality(self, state: DQNState, episodes: int | None = None) -> float:
        """Mean return of greedy episodes (default ``eval_episodes``); NaN for 0."""
        from popplay.agents.dqn import greedy_policy
        from popplay.topologies.common import greedy_quality

        n = self.params.eval_episodes if episodes is None else episodes
        if n == 0:
            return float("nan")
        return greedy_quality(self.params.env, greedy_policy(state.agent.q_values), n, self.params.seed)[0]

    def returns_of_greedy(self, state: DQNState, episodes: int, seed: int) -> np.ndarray:
        from popplay.agents.dqn import greedy_policy
        from popplay.topologies.common import greedy_quality

        return greedy_quality(self.params.env, greedy_policy(state.agent.q_values), episodes, seed)[1]


def to_batch(episodes: Any) -> Any:
    import torch

    from popplay.agents.replay import Batch

    return Batch(torch.as_tensor(episodes.obs), torch.as_tensor(episodes.action).long(),
                 torch.as_tensor(episodes.reward), torch.as_tensor(episodes.next_obs),
                 torch.as_tensor(episodes.terminated).float())


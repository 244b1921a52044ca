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

from popplay.core.options import option
from popplay.core.registry import DEEP, DomainSpec, register
from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.dqn import DoubleDQN, DQNConfig, EpsilonGreedy, greedy_policy
from popplay.deep.agents.dqn_members import HYPER_BOUNDS, DQNMembers
from popplay.deep.agents.replay import Batch
from popplay.deep.envs.rollout import Episodes, episode_seed, play_episodes
from popplay.deep.topologies.base import (
    ENV_HELP,
    ENV_STEPS_HELP,
    EPISODES_HELP,
    EVAL_HELP,
    GAMMA_HELP,
    SEED_HELP,
    TIMEOUT_HELP,
    DeepParams,
    check_at_least_one,
    check_evaluation_and_timeout,
    check_finite_arrays,
    config_from,
    count_episodes,
    curve_arrays,
    restore_curves,
    topology_counters,
    topology_extra,
)
from popplay.deep.topologies.common import check_budget, greedy_quality, recent_mean
from popplay.deep.topologies.families import RankedExperiment
from popplay.deep.topologies.population import PopulationExperiment
from popplay.deep.topologies.population_params import (
    OBS_DIM_ESTIMATE,
    PopulationLayout,
    mlp_parameters,
    population_bytes,
)
from popplay.deep.topologies.workflow_params import (
    REPLAY_TOPOLOGIES,
    ExarlLayout,
    learners_option,
    queue_capacity_option,
    ranks_of,
    selection_option,
)


@dataclass(frozen=True)
class DQNParams(PopulationLayout, ExarlLayout, DeepParams):
    """Train Double DQN: the online network picks the next action and the target network
    values it (Grandio's MPI Deep Q-Learning, eq. 1), uniform replay, Huber loss, ε-greedy simulators."""

    env: str = option("CartPole-v1", ENV_HELP)
    topology: str = option(
        "sequential", "sequential: simulate an episode, then train (one process); pipelined: one simulator and the "
                      "learner in two processes; collective: N simulators, transitions gathered and weights broadcast "
                      "every --sync-every episodes; async: simulators and learner never wait for each other; "
                      "multi-learner, master-learner, central-inference: EXARL's workflows (see train td3 --help).",
        choices=REPLAY_TOPOLOGIES)
    simulators: int = option(1, "Simulator ranks (collective, async; the actors of EXARL's workflows).", min=1)
    sync_every: int = option(1, "Episodes per simulator between exchanges.", min=1)  # one phase
    episodes: int = option(0, EPISODES_HELP, min=0, budget=True)
    env_steps: int = option(0, ENV_STEPS_HELP, min=0, budget=True)
    seed: int = option(0, SEED_HELP)
    hidden: tuple[int, ...] = option((128, 128), "Hidden layer widths of the Q network, comma separated.")
    lr: float = option(1e-3, "Adam learning rate.")
    gamma: float = option(0.99, GAMMA_HELP, min=0.0, max=1.0)
    batch_size: int = option(64, "Minibatch of each update.", min=1)
    replay_capacity: int = option(50_000, "Replay capacity in transitions.", min=1, name="--replay")
    learning_starts: int = option(1_000, "Transitions stored before the first update.", min=0)
    update_ratio: float = option(0.25, "Gradient updates per environment step received.")
    train_every: int = option(
        0, "Sequential: train every this many env-steps of the run (mid-episode too), running the updates owed, "
           "--update-ratio per step (SB3's train_freq K with gradient_steps G is --train-every K --update-ratio "
           "G/K); 0: after each episode (Grandio's MPI Deep Q-Learning, Algorithm 1).", min=0)
    target_every: int = option(250, "Updates between target-network refreshes.", min=1)
    epsilon_start: float = option(1.0, "ε before any update.", min=0.0, max=1.0)
    epsilon_end: float = option(0.05, "ε after --epsilon-updates.", min=0.0, max=1.0)
    epsilon_updates: int = option(5_000, "Learner updates over which ε falls linearly (ε follows training, not "
                                         "simulation).", min=1)
    max_grad_norm: float = option(10.0, "Gradients are clipped to this norm.")
    lr_end: float = option(0.0, "Learning rate after --lr-updates.", min=0.0)
    lr_updates: int = option(0, "Learner updates over which the learning rate falls linearly to --lr-end "
                                "(0: constant).", min=0)
    eval_episodes: int = option(100, EVAL_HELP, min=0)
    timeout: float = option(60.0, TIMEOUT_HELP, on_resume=True)
    learners: int = learners_option()
    selection: str = selection_option()
    queue_capacity: int = queue_capacity_option()

    def agent_config(self) -> Any:
        return config_from(self, DQNConfig)

    def new_learner(self, info: Any) -> DoubleDQN:
        """The learner of this run on the CPU (same seed, same initial network on every rank)."""
        return DoubleDQN(self.agent_config(), info.obs_dim, int(info.actions), self.seed)

    @property
    def actors(self) -> int:  # EXARL's workflows' name for them
        return self.simulators

    def validate(self) -> None:
        if self.topology not in REPLAY_TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(REPLAY_TOPOLOGIES)} (got {self.topology!r})")
        self._check_learner_layout()
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
        self._check_population(HYPER_BOUNDS, self.topology)
        if self.agents > 1 and self.lr_updates:
            raise ValueError("lr_updates: a population's learning rates are per member (--hp lr=...), not a schedule")

    @property
    def ranks(self) -> int:
        return ranks_of(self.topology, self.simulators, self.learners)


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

    def member_network(self, state: Any, member: int) -> Any:
        return state.learner.member_module(member)


def memory_bytes(params: DQNParams, world: int = 1, local: int = 1) -> int:
    """A population's replay memories (they dominate), networks and environments."""
    obs = OBS_DIM_ESTIMATE
    row = 4 * (2 * obs + 2) + 8  # obs, next_obs, reward, terminated (float32) and the action (int64)
    # online, target, their gradient, Adam's two moments and its scratch
    return population_bytes(params.agents, mlp_parameters(obs, 4, params.hidden), 6, params.replay_capacity, row, 1)


def to_batch(episodes: Any) -> Any:
    return Batch(torch.as_tensor(episodes.obs), torch.as_tensor(episodes.action).long(),
                 torch.as_tensor(episodes.reward), torch.as_tensor(episodes.next_obs),
                 torch.as_tensor(episodes.terminated).float())


SPEC = register(DomainSpec(name="dqn", params=DQNParams, experiment=DQNExperiment, kind=DEEP,
                           steps_label="environment steps", devices=("cpu", "cuda"), memory=memory_bytes,
                           lineage_parameters=tuple(HYPER_BOUNDS),
                           summary="Double DQN with a learner and simulators (Grandio's MPI Deep Q-Learning)."))

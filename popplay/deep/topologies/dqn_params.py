"""The parameters of ``popplay train dqn`` (every option and a run file's config come
from :class:`DQNParams`' fields), its memory estimate and its registration. It imports
no torch: the command line builds, checks and refuses before torch loads; the runner is
:mod:`popplay.deep.topologies.dqn`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from popplay.core.options import option
from popplay.core.registry import DEEP, DomainSpec, register
from popplay.deep.agents.config import DQNConfig, check_at_least_one
from popplay.deep.topologies.common import check_budget
from popplay.deep.topologies.deep_params import (
    ENV_HELP,
    ENV_STEPS_HELP,
    EPISODES_HELP,
    EVAL_HELP,
    GAMMA_HELP,
    SEED_HELP,
    TIMEOUT_HELP,
    DeepParams,
    check_evaluation_and_timeout,
    config_from,
)
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
from popplay.operators.hyper import Bounds

#: The hyper-parameters a DQN population may set per member (``--hp``), and their bounds.
HYPER_BOUNDS = {
    "lr": Bounds(0.0, low_open=True),
    "gamma": Bounds(0.0, 1.0),
    "epsilon_start": Bounds(0.0, 1.0),
    "epsilon_end": Bounds(0.0, 1.0),
    "epsilon_updates": Bounds(1.0, integer=True),
    "target_every": Bounds(1.0, integer=True),
    "max_grad_norm": Bounds(0.0, low_open=True),
}



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

    def new_learner(self, info: Any) -> Any:
        """The learner of this run on the CPU (same seed, same initial network on every rank)."""
        from popplay.deep.agents.dqn import DoubleDQN  # defers torch

        return DoubleDQN(self.agent_config(), info.obs_dim, int(info.actions), self.seed)

    #: The parameter-server topology (Gorila) runs this agent on environments with discrete actions.
    discrete_actions: ClassVar[bool] = True

    def server_agent(self, info: Any) -> Any:
        """This agent as a parameter-server topology runs it (:class:`~popplay.deep.agents.protocol.ServerAgent`)."""
        from popplay.deep.agents.dqn import DQNServer  # defers torch

        return DQNServer(self.agent_config(), info.obs_dim, int(info.actions), self.seed)

    def server_shapes(self, info: Any) -> list[tuple[int, int]]:
        """The (inputs, outputs) of the networks in :meth:`server_agent`'s vector, in order."""
        return [(info.obs_dim, int(info.actions))]

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


def memory_bytes(params: DQNParams, world: int = 1, local: int = 1) -> int:
    """A population's replay memories (they dominate), networks and environments."""
    obs = OBS_DIM_ESTIMATE
    # obs, next_obs, reward, terminated (float32) and the action: int64 in one agent's
    # replay, float32 in a population's packed rows (the larger counted)
    row = 4 * (2 * obs + 2) + 8
    # online, target, their gradient, Adam's two moments and its scratch
    return population_bytes(params.agents, mlp_parameters(obs, 4, params.hidden), 6, params.replay_capacity, row, 1)


SPEC = register(DomainSpec(name="dqn", params=DQNParams, experiment="popplay.deep.topologies.dqn:DQNExperiment",
                           kind=DEEP, steps_label="environment steps", devices=("cpu", "cuda"), memory=memory_bytes,
                           lineage_parameters=tuple(HYPER_BOUNDS),
                           summary="Double DQN with a learner and simulators (Grandio's MPI Deep Q-Learning)."))

"""The parameters of ``popplay train a2c``, ``td3`` and ``ddpg`` (every option and a run
file's config come from their fields) and their registrations. It imports no torch: the
command line builds, checks and refuses before torch loads; the runners are
:mod:`popplay.deep.topologies.exarl` and :mod:`popplay.deep.topologies.exarl_ranks`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from popplay.core.options import option
from popplay.core.registry import DEEP, DomainSpec, register
from popplay.deep.agents.config import A2CConfig, DDPGConfig, TD3Config, check_at_least_one
from popplay.deep.topologies.common import check_budget
from popplay.deep.topologies.deep_params import (
    ENV_HELP,
    ENV_STEPS_HELP,
    EPISODES_HELP,
    EVAL_HELP,
    GAMMA_HELP,
    SEED_HELP,
    DeepParams,
    check_evaluation_and_timeout,
    config_from,
)
from popplay.deep.topologies.population_params import (
    PopulationLayout,
    agent_memory_bytes,
    rollout_population_bytes,
)
from popplay.deep.topologies.workflow_params import REPLAY_TOPOLOGIES, WorkflowParams
from popplay.operators.hyper import Bounds

#: The hyper-parameters a DDPG or TD3 population may set per member (``--hp``), and their bounds.
CONTINUOUS_HYPER_BOUNDS = {
    "actor_lr": Bounds(0.0, low_open=True),
    "critic_lr": Bounds(0.0, low_open=True),
    "gamma": Bounds(0.0, 1.0),
    "tau": Bounds(0.0, 1.0),
    "exploration_noise": Bounds(0.0),
}

#: The hyper-parameters an A2C population may set per member (``--hp``), and their bounds.
A2C_HYPER_BOUNDS = {
    "lr": Bounds(0.0, low_open=True),
    "gamma": Bounds(0.0, 1.0),
    "entropy_coef": Bounds(0.0),
    "value_coef": Bounds(0.0),
    "max_grad_norm": Bounds(0.0, low_open=True),
}


def exploration_noise_option() -> Any:
    return option(0.1, "Acting noise, in action half-ranges.")


@dataclass(frozen=True)
class DDPGParams(PopulationLayout, WorkflowParams, DeepParams):
    """Train DDPG (deterministic actor, Q critic, soft target updates), optionally with
    prioritised experience replay. With --agents P, P members learn at once in one
    process, in lockstep (:mod:`popplay.deep.agents.continuous_members`)."""

    domain: ClassVar[str] = "ddpg"

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
    exploration_noise: float = exploration_noise_option()
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
        self._check_population(CONTINUOUS_HYPER_BOUNDS, self.workflow, "--workflow")
        if self.agents > 1 and self.per:
            raise ValueError("per: a population's members keep uniform replay (prioritised replay is one agent's)")

    # Grandio's topologies read the layout under their own names.
    @property
    def simulators(self) -> int:
        return self.actors

    def new_learner(self, info: Any) -> Any:
        from popplay.deep.agents.ddpg import DDPG  # defers torch

        return DDPG(self.agent_config(), info.obs_dim, info.action_low, info.action_high, self.seed)

    #: The parameter-server topology (Gorila) runs this agent on environments with continuous actions.
    discrete_actions: ClassVar[bool] = False
    critic_count: ClassVar[int] = 1

    def server_agent(self, info: Any) -> Any:
        """This agent as a parameter-server topology runs it (:class:`~popplay.deep.agents.protocol.ServerAgent`)."""
        from popplay.deep.agents.ddpg import ContinuousServer  # defers torch

        return ContinuousServer(self.new_learner(info), self.exploration_noise)

    def server_shapes(self, info: Any) -> list[tuple[int, int]]:
        """The (inputs, outputs) of the networks in :meth:`server_agent`'s vector: the
        actor, then the critics."""
        action_dim = len(info.action_low)
        return [(info.obs_dim, action_dim)] + [(info.obs_dim + action_dim, 1)] * self.critic_count


@dataclass(frozen=True)
class TD3Switches:
    """TD3's three fixes of DDPG (and their noise), wherever TD3 runs."""

    clipped_double_q: bool = option(True, "Target from the smaller of two critics.")
    policy_delay: int = option(2, "Critic steps per actor step.", min=1)
    target_smoothing: bool = option(True, "Clipped noise on the target action.")
    target_noise: float = option(0.2, "Smoothing noise, in action half-ranges.")
    noise_clip: float = option(0.5, "Smoothing noise clip, in action half-ranges.")


@dataclass(frozen=True)
class TD3Params(TD3Switches, DDPGParams):
    """Train TD3: DDPG with clipped double Q, delayed policy updates and target policy
    smoothing, each of which can be switched off."""

    domain: ClassVar[str] = "td3"
    critic_count: ClassVar[int] = 2

    def _config_type(self) -> type:
        return TD3Config

    def new_learner(self, info: Any) -> Any:
        from popplay.deep.agents.td3 import TD3  # defers torch

        return TD3(self.agent_config(), info.obs_dim, info.action_low, info.action_high, self.seed)


@dataclass(frozen=True)
class A2CParams(PopulationLayout, WorkflowParams, DeepParams):
    """Train A2C (policy gradient with a learned baseline and an entropy bonus), with or
    without V-trace's off-policy correction. With --agents P, P members learn at once
    from fixed-length rollouts of their --copies environments, one update each per
    --n-steps (synchronous A2C; :mod:`popplay.deep.agents.a2c_members`)."""

    members_keep_replay: ClassVar[bool] = False  # they learn from their own rollouts or episodes
    env: str = option("CartPole-v1", ENV_HELP)
    copies: int = option(8, "Environment copies; one episode each per phase (a population: each member's copies, "
                            "stepped in lockstep).", min=1)
    n_steps: int = option(16, "Rows of each learning segment, one update each (a population: the steps of each "
                              "copy per rollout, one update each).", min=1)
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
        self._check_population(A2C_HYPER_BOUNDS, self.workflow, "--workflow")

    def new_learner(self, info: Any) -> Any:
        from popplay.deep.agents.a2c import A2C  # defers torch

        return A2C(self.agent_config(), info.obs_dim, int(info.actions), self.seed)


def continuous_memory_bytes(params: DDPGParams, world: int = 1, local: int = 1) -> int:
    """One DDPG or TD3 agent's memory (networks and replay), or a population's: P of them."""
    return max(1, params.agents) * agent_memory_bytes(params, world, local)


def a2c_memory_bytes(params: A2CParams, world: int = 1, local: int = 1) -> int:
    """One A2C agent's memory, or a population's: networks, rollouts and environments."""
    if params.agents == 1:
        return agent_memory_bytes(params, world, local)
    return rollout_population_bytes(params.agents, params.hidden, params.copies, params.n_steps)


for _spec in (DomainSpec(name="a2c", params=A2CParams, kind=DEEP,
                         experiment="popplay.deep.topologies.exarl:A2CExperiment",
                         steps_label="environment steps", memory=a2c_memory_bytes,
                         lineage_parameters=tuple(A2C_HYPER_BOUNDS),
                         summary="A2C with or without V-trace, in EXARL's workflows."),
              DomainSpec(name="td3", params=TD3Params, kind=DEEP,
                         experiment="popplay.deep.topologies.exarl:TD3Experiment",
                         steps_label="environment steps", memory=continuous_memory_bytes,
                         lineage_parameters=tuple(CONTINUOUS_HYPER_BOUNDS),
                         summary="TD3 in EXARL's workflows."),
              DomainSpec(name="ddpg", params=DDPGParams, kind=DEEP,
                         experiment="popplay.deep.topologies.exarl:DDPGExperiment",
                         steps_label="environment steps", memory=continuous_memory_bytes,
                         lineage_parameters=tuple(CONTINUOUS_HYPER_BOUNDS),
                         summary="DDPG, optionally with prioritised replay, in EXARL's workflows.")):
    register(_spec)

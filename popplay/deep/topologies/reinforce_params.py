"""The parameters of ``popplay train reinforce`` (every option and a run file's config
come from :class:`ReinforceParams`' fields) and its registration. It imports no torch:
the command line builds, checks and refuses before torch loads; the runner is
:mod:`popplay.deep.topologies.reinforce`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from popplay.core.options import option
from popplay.core.registry import DEEP, DomainSpec, register
from popplay.deep.agents.config import ReinforceConfig, check_at_least_one
from popplay.deep.topologies.common import check_budget
from popplay.deep.topologies.deep_params import (
    ENV_HELP,
    EVAL_HELP,
    GAMMA_HELP,
    SEED_HELP,
    TIMEOUT_HELP,
    DeepParams,
    check_evaluation_and_timeout,
)
from popplay.deep.topologies.population_params import (
    OBS_DIM_ESTIMATE,
    PopulationLayout,
    agent_memory_bytes,
    mlp_parameters,
    population_bytes,
)
from popplay.deep.topologies.workflow_params import (
    ON_POLICY_WORKFLOWS,
    ExarlLayout,
    learners_option,
    queue_capacity_option,
    ranks_of,
    selection_option,
)
from popplay.operators.hyper import Bounds

REINFORCE_TOPOLOGIES = ("server", "local", *ON_POLICY_WORKFLOWS[1:])

#: The hyper-parameters a REINFORCE population may set per member (``--hp``), and their bounds.
REINFORCE_HYPER_BOUNDS = {"lr": Bounds(0.0, low_open=True), "gamma": Bounds(0.0, 1.0)}


@dataclass(frozen=True)
class ReinforceParams(PopulationLayout, ExarlLayout, DeepParams):
    """Train a policy with REINFORCE: normalised discounted returns, loss −Σ log π·G per
    episode; the server sums the workers' gradients and steps Adam (as in the
    'Distributed Reinforcement Learning: A draft' post). With --agents P, P members learn
    at once in one process (or over --nproc ranks), each from its own episodes, one Adam
    step at the end of each (:mod:`popplay.deep.agents.reinforce_members`)."""

    members_keep_replay: ClassVar[bool] = False  # they learn from their own rollouts or episodes
    domain: ClassVar[str] = "reinforce"

    env: str = option("CartPole-v1", ENV_HELP)
    topology: str = option(
        "server", "server: rank 0 is the parameter server, ranks 1..N the workers (real processes); local: the "
                  "same workers one after another in this process (same episodes, same summed gradient); "
                  "multi-learner, master-learner, central-inference: EXARL's workflows with --workers actors "
                  "(see train a2c --help); REINFORCE has no correction for their actors' lag, so give them a "
                  "smaller --lr (1e-3 reached 500 on CartPole-v1 within 2000 episodes; 1e-2 collapses).",
        choices=REINFORCE_TOPOLOGIES)
    workers: int = option(1, "Worker ranks; each plays one episode per update (the actors of EXARL's workflows).",
                          min=1)
    episodes: int = option(200, "Budget: server updates (every worker plays one episode per update; in EXARL's "
                                "workflows: episodes over all actors; 0: none).", min=0, budget=True)
    env_steps: int = option(0, "Budget: environment steps summed over workers (0: none).", min=0, budget=True)
    seed: int = option(0, SEED_HELP)
    hidden: tuple[int, ...] = option((128,), "Hidden layer widths of the policy, comma separated.")
    lr: float = option(1e-2, "Adam learning rate at the server.")
    gamma: float = option(0.99, GAMMA_HELP, min=0.0, max=1.0)
    max_steps: int = option(10_000, "Steps per episode at most.", min=1)  # the parameter-server draft's max_iters
    eval_episodes: int = option(100, EVAL_HELP, min=0)
    timeout: float = option(60.0, TIMEOUT_HELP, on_resume=True)
    learners: int = learners_option()
    selection: str = selection_option()
    queue_capacity: int = queue_capacity_option()

    def agent_config(self) -> Any:
        return ReinforceConfig(hidden=self.hidden, lr=self.lr, gamma=self.gamma)

    def new_learner(self, info: Any) -> Any:
        """REINFORCE as an on-policy agent, for EXARL's workflows."""
        from popplay.deep.agents.reinforce import Reinforce  # defers torch

        return Reinforce(self.agent_config(), info.obs_dim, int(info.actions), self.seed)

    @property
    def actors(self) -> int:  # EXARL's workflows' name for them
        return self.workers

    def validate(self) -> None:
        if self.topology not in REINFORCE_TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(REINFORCE_TOPOLOGIES)} (got {self.topology!r})")
        self._check_learner_layout()
        check_at_least_one(workers=self.workers, max_steps=self.max_steps)
        check_evaluation_and_timeout(self.eval_episodes, self.timeout)
        check_budget(self.episodes, self.env_steps)
        self.agent_config().validate()
        # a population is its own layout: the server's and the local workers' topologies do not apply to it
        alone = self.agents > 1 and self.topology in ("server", "local")
        self._check_population(REINFORCE_HYPER_BOUNDS, "sequential" if alone else self.topology, "--topology")
        if self.agents > 1 and self.workers != 1:
            raise ValueError(f"workers: each member of a population plays its own environment; give --workers 1 "
                             f"(got {self.workers})")

    @property
    def ranks(self) -> int:
        return ranks_of(self.topology, self.workers, self.learners, alone="local")


def memory_bytes(params: ReinforceParams, world: int = 1, local: int = 1) -> int:
    """One agent's memory, or a population's: policies, their gradient, Adam's two moments and
    scratch, and an episode buffer of --max-steps rows per member."""
    if params.agents == 1:
        return agent_memory_bytes(params, world, local)
    obs = OBS_DIM_ESTIMATE
    return population_bytes(params.agents, mlp_parameters(obs, 4, params.hidden), 5, params.max_steps,
                            4 * (obs + 3), 1)


SPEC = register(DomainSpec(name="reinforce", params=ReinforceParams, kind=DEEP,
                           experiment="popplay.deep.topologies.reinforce:ReinforceExperiment",
                           steps_label="environment steps", memory=memory_bytes,
                           lineage_parameters=tuple(REINFORCE_HYPER_BOUNDS),
                           summary="REINFORCE with a synchronous parameter server (as in the 'Distributed "
                                   "Reinforcement Learning: A draft' post)."))

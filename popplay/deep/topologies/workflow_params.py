"""The layout of EXARL's multi-process workflows (:mod:`popplay.deep.topologies.exarl_ranks`),
as parameter fields every agent that runs in them shares. Light on purpose (no torch):
agents' parameter modules that the command line lists import it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from popplay.core.options import option
from popplay.deep.agents.config import check_at_least_one

WORKFLOWS = ("sequential", "multi-learner", "master-learner", "central-inference")
#: Where a replay agent (DQN, TD3, DDPG) runs: one process, Grandio's simulators and
#: learner, or EXARL's workflows (:mod:`popplay.deep.topologies.families`).
REPLAY_TOPOLOGIES = ("sequential", "pipelined", "collective", "async", *WORKFLOWS[1:])
#: Where an on-policy agent (A2C, PPO) runs: one process, EXARL's workflows, or the
#: parameter-server draft's synchronous server (:mod:`popplay.deep.topologies.server_ranks`).
ON_POLICY_WORKFLOWS = (*WORKFLOWS, "parameter-server")
SELECTIONS = ("range", "random")


def learners_option() -> Any:
    return option(2, "multi-learner, master-learner: learner ranks.", min=1)


def selection_option() -> Any:
    return option("range", "multi-learner: range (each learner pops its own block of actors' queues) or random "
                           "(any actor's newest episode, read without removing it).", choices=SELECTIONS)


def queue_capacity_option() -> Any:
    return option(4, "multi-learner, range: episodes an actor keeps unread at most.", min=1)


def ranks_of(topology: str, actors: int, learners: int, alone: str = "sequential") -> int:
    """Processes of a job: one for the one-process topology ``alone``, learners and
    actors for a data-parallel workflow, else one learner (or server) and its actors."""
    if topology == alone:
        return 1
    return learners + actors if topology in ("multi-learner", "master-learner") else 1 + actors


class ExarlLayout:
    """For parameters whose ``topology`` field may name one of EXARL's workflows (DQN's,
    REINFORCE's): the learner fields (declared with the options above), the name the
    workflows read, and their checks. Each gives ``actors`` (its simulators, its workers)."""

    topology: str
    learners: int
    selection: str
    queue_capacity: int

    @property
    def workflow(self) -> str:
        return self.topology

    def _check_learner_layout(self) -> None:
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)} (got {self.selection!r})")
        check_at_least_one(learners=self.learners, queue_capacity=self.queue_capacity)



def check_workflow(workflow: str, allowed: tuple[str, ...] = WORKFLOWS) -> None:
    if workflow not in allowed:
        raise ValueError(f"workflow must be one of {', '.join(allowed)} (got {workflow!r})")


@dataclass(frozen=True)
class WorkflowParams:
    """The multi-process workflows' layout, shared by every EXARL agent's parameters."""

    workflow: str = option(
        "sequential", "sequential: the actor plays, then the learner trains, in one process. multi-learner: actors' "
                      "queues read by data-parallel learners; master-learner: actors send to learner 0, which hands "
                      "batches out; central-inference: one rank holds the model and acts for every actor; "
                      "parameter-server: the parameter-server draft's synchronous server sums the gradients of "
                      "--actors workers, one episode each per update.",
        choices=ON_POLICY_WORKFLOWS)
    learners: int = learners_option()
    actors: int = option(2, "Multi-process workflows: actor ranks.", min=1)
    selection: str = selection_option()
    queue_capacity: int = queue_capacity_option()
    timeout: float = option(60.0, "Seconds any wait for another rank may take.", on_resume=True)

    def _validate_layout(self, allowed: tuple[str, ...] = ON_POLICY_WORKFLOWS) -> None:
        check_workflow(self.workflow, allowed)
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)} (got {self.selection!r})")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive (got {self.timeout})")
        check_at_least_one(sync_every=getattr(self, "sync_every", 1), learners=self.learners, actors=self.actors,
                           queue_capacity=self.queue_capacity)

    @property
    def topology(self) -> str:
        return self.workflow

    @property
    def ranks(self) -> int:
        return ranks_of(self.workflow, self.actors, self.learners)

    def new_learner(self, info: Any) -> Any:
        """The learner of this run (same seed, same initial networks on every rank)."""
        raise NotImplementedError

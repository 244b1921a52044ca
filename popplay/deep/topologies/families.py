"""The multi-process topologies by name, and the experiment side every agent shares.

A topology family is a module's class with ``names`` (the ``--topology`` /
``--workflow`` values it runs), ``rank0(dist, params, info)`` (rank 0's side: ``round(exp,
state)`` once per phase, ``close(exp, state)``, ``done``: None while the budget decides),
``serve(dist, params, resume)`` (every other rank), ``role(params, rank)`` (what ``ps``
shows) and ``resume_problem(params)``. An experiment never names a topology: it looks
its family up here by the value its parameters hold, so a replay agent runs in seed
003's topologies and EXARL's workflows alike, and an on-policy agent in the workflows and
the parameter-server draft's synchronous server.
"""
from __future__ import annotations

from typing import Any

from popplay.core.errors import UsageError
from popplay.deep.agents.replay import rows_batch
from popplay.deep.topologies.base import DeepExperiment, count_episodes
from popplay.deep.topologies.dqn_ranks import Simulators
from popplay.deep.topologies.exarl_ranks import Workflows
from popplay.deep.topologies.server_ranks import ParameterServer
from popplay.distributed.group import current

FAMILIES: dict[str, Any] = {name: family for family in (Simulators, Workflows, ParameterServer)
                            for name in family.names}


def family_of(params: Any) -> Any | None:
    """The family running ``params.topology`` (None: sequential, one process)."""
    return FAMILIES.get(params.topology)


class RankedExperiment(DeepExperiment):
    """A deep experiment whose rank 0 may drive a multi-process topology: one round of
    it per phase (:meth:`_topology_round`); its other ranks serve."""

    _topology: Any = None  # rank 0's side of the family's topology
    _no_ranks: UsageError | None = None

    def _attach_topology(self) -> None:
        family = family_of(self.params)
        if family is None:
            return
        dist = current()
        if not dist.distributed:
            # One process may still read the run file (evaluate); training needs the ranks.
            self._no_ranks = UsageError(f"the {self.params.topology} topology runs on {self.params.ranks} ranks "
                                        "(launched by popplay)")
            return
        self._topology = family.rank0(dist, self.params, self.info)

    @staticmethod
    def role(params: Any, rank: int) -> str:
        family = family_of(params)
        return family.role(params, rank) if family is not None else DeepExperiment.role(params, rank)

    @staticmethod
    def serve(dist: Any, params: Any, resume: Any) -> None:
        family_of(params).serve(dist, params, resume)

    @staticmethod
    def resume_problem(params: Any) -> str | None:
        """Why a run of ``params`` cannot be resumed (None: it can)."""
        family = family_of(params)
        return family.resume_problem(params) if family is not None else None

    def finished(self, state: Any, *, time_mode: bool) -> bool:
        if self.diverged is not None:
            return True  # close() then stops the other ranks
        done = self._topology.done if self._topology is not None else None
        return done if done is not None else super().finished(state, time_mode=time_mode)

    def close(self, state: Any) -> None:
        """Stop the other ranks (once; nothing to do in one process)."""
        if self._topology is not None:
            self._topology.close(self, state)

    def _topology_round(self, state: Any) -> Any | None:
        """One round of the multi-process topology; None in a one-process run (the
        experiment plays its own phase)."""
        if self._no_ranks is not None:
            raise self._no_ranks
        if self._topology is None:
            return None
        return self._topology.round(self, state)

    def learn_rows(self, state: Any, rows: Any, returns: Any, lengths: Any) -> None:
        """Hand transition rows a topology received to the replay agent, and count them."""
        agent = state.agent
        agent.receive(rows_batch(rows, self.info.obs_dim, agent.discrete))
        count_episodes(state, returns, lengths, int(rows.shape[0]))

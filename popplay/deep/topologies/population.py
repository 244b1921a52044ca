"""Populations of deep agents: ``--agents P`` members learning at once, in one process
or split over ``--nproc`` ranks.

The members are batched over a leading member axis by the agent's population learner
(DQN's: :class:`popplay.deep.agents.dqn_members.DQNMembers`), one environment each
(:class:`popplay.deep.envs.members.MemberEnvs`), stepping in lockstep. Between phases
(``--phase-steps`` env-steps per member) popplay's population operators act on them:

- **selective replication with variation** = PBT's exploit and explore
  (``--replicate-every``): members ranked by the mean return of their last
  ``--window`` episodes; the worst ``--replicate-fraction`` become copies of the best
  (:func:`popplay.operators.evolution.select_replacements`): weights, target network,
  Adam state and hyper-parameters, and the replay memory with ``--copy-replay`` (by
  default a copy keeps its own: the parent's experience is already in its weights);
  then their hyper-parameters with an ``--hp`` spec are explored
  (:func:`popplay.operators.hyper.explore`). Every copy and mutation is a lineage
  record (``popplay lineage``);
- **experience-weighted sharing** (``--share-every``), Bell's equations (1)–(4) with
  the network parameters as the values and each member's env-steps since the last
  share as its weight (:func:`popplay.operators.sharing.share_weighted`), in groups of
  ``--share-group`` consecutive members, optionally followed by differentiation,
  Bell's (9)–(10) (:func:`popplay.operators.sharing.differentiate`). Members step in
  lockstep, so their weights are equal today and the share is the plain mean. Sharing
  members start from one initial network (:meth:`PopulationExperiment.initial_networks`);
- the budgets count the whole population: ``--env-steps`` is summed over members.

With the operators off, member ``k`` is exactly what a population holding member ``k``
alone computes: its streams, networks and environment depend on (seed, k) only.

Over ``--nproc`` N ranks (gloo, every rank running the phases: as Bell's populations),
each rank holds a contiguous block of P/N members. The operators see the whole
population: scores, hyper-parameters and windows are gathered (small), a copy moves
its parent's rows to the child's rank, a share gathers its groups' parameters and
averages them in the one-process order; every rank keeps the same lineage. A run on N
ranks is bit-identical to one process, and resumes on any N that divides P.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from popplay import rng
from popplay.core.errors import UsageError
from popplay.core.limits import cores_per_process
from popplay.deep.envs import require_discrete
from popplay.deep.envs.members import MemberEnvs
from popplay.deep.topologies.base import DeepExperiment, check_finite_arrays
from popplay.distributed import collectives
from popplay.distributed.group import current
from popplay.operators import hyper
from popplay.operators.evolution import Lineage, initial_ids, select_replacements, significant, window_means
from popplay.tournaments.ratings import elo_ratings, elo_standard_errors

TAG_SHARE = 12
TAG_EVALUATION = 13
TAG_RANKING = 14


@dataclass
class PopulationState:
    learner: Any  # the agent's population learner (DQNMembers, PPOMembers): this rank's members
    envs: MemberEnvs  # this rank's members' environments
    ids: np.ndarray  # (P,) lineage id of the member in each slot, the whole population
    lineage: Lineage  # the whole population's (every rank keeps the same)
    recent: np.ndarray  # (members here, --window) their last returns, newest last, NaN before any
    member_steps: int = 0  # steps of each member's environments (they step in lockstep)
    episodes: int = 0  # finished episodes, all members (all ranks: counted at phase ends)
    shares: int = 0
    max_bias: float = 0.0
    replications: int = 0
    last_share_step: int = 0
    # every finished episode of this rank's members, in order: member slot, return,
    # length, population env-steps at its end
    episode_member: list[int] = field(default_factory=list)
    episode_return: list[float] = field(default_factory=list)
    episode_length: list[int] = field(default_factory=list)
    episode_step: list[int] = field(default_factory=list)
    copies: int = 1  # environments per member
    agents: int = 0  # members of the whole population
    ranking_env_steps: int = 0  # env-steps of the greedy episodes --rank-by greedy played (not learning's)

    @property
    def member_env_steps(self) -> int:
        """Env-steps of each member (over its copies): the operators' clock."""
        return self.member_steps * self.copies

    @property
    def env_steps(self) -> int:
        """Env-steps of the whole population (its members step in lockstep)."""
        return self.member_env_steps * (self.agents or len(self.ids))


class PopulationExperiment(DeepExperiment):
    """The runner's view of a deep population (:class:`popplay.core.experiment.Experiment`).

    An agent's population plugs in with :meth:`new_learner` (its batched learner for
    the member slots given), :meth:`greedy` and :meth:`member_network`; the learner
    gives ``act``, ``receive``, ``train``, ``hypers`` and ``set_hypers`` (this rank's
    members), ``member_tables`` (every array a PBT copy moves, member axis first),
    ``parameter_tables`` (what sharing averages), ``arrays`` (member axis first),
    ``counters``, ``load`` and ``updates``.
    """

    domain = "deep"
    hyper_bounds: dict[str, hyper.Bounds] = {}

    #: Environments per member (PPO's --copies; one for DQN).
    copies_field: str | None = None

    def __init__(self, params: Any, backend: Any, members: np.ndarray | None = None) -> None:
        """``members``: the member slots this process runs, as a population of its own
        (default: all ``--agents``, or this rank's block of them on several ranks)."""
        # A population's batched products are large enough for every core this process
        # may use (64 DQN members of 64-64 networks on 2 cores: about 1.3-1.6x the
        # env-steps/s with two threads), unlike one agent's tiny ones; a run's bits do not
        # depend on the count (tests/test_deep_population.py checks one against two).
        torch.set_num_threads(cores_per_process())
        params.validate()
        self.params = params
        self.backend = backend
        self.device = backend.device if backend is not None else "cpu"
        self.dist = current()
        self.sharded = self.dist.distributed and members is None
        if self.sharded:
            try:  # the launcher checked it already; a rank started by hand (torchrun) checks here
                params.check_ranks(self.dist.world_size)
            except ValueError as error:
                raise UsageError(str(error)) from None
            self.slots = np.arange(params.agents, dtype=np.int64)[collectives.shard(params.agents, self.dist)]
        else:
            self.slots = (np.arange(params.agents, dtype=np.int64) if members is None
                          else np.asarray(members, dtype=np.int64).reshape(-1))
        # the population the operators act on, and where this process's rows start in it
        self.whole_slots = np.arange(params.agents, dtype=np.int64) if self.sharded else self.slots
        self.offset = int(self.slots[0]) if self.sharded else 0
        self.collective_save = self.sharded  # every rank takes part in a save: its members are gathered
        self.specs = params.hyper_specs(self.hyper_bounds)
        # The lineage records the hyper-parameters that vary (an --hp spec); the others are the run's config.
        self.tracked = tuple(spec.name for spec in self.specs)
        self.copies = int(getattr(params, self.copies_field)) if self.copies_field else 1
        probe = MemberEnvs(params.env, params.seed, self.slots[:1])
        self.info = probe.info
        # A two-player environment ranks members by playing them against each other.
        self.arena = getattr(probe.envs[0].unwrapped, "round_robin", None)
        probe.close()
        if params.rank_by == "tournament" and self.arena is None:
            raise UsageError(f"--rank-by tournament: --env {params.env} is not a two-player game the members can "
                             f"play each other in (popplay/Knights-v0 is)")
        self._qualities: np.ndarray | None = None

    def _whole(self, local: Any) -> Any:
        """This rank's member-major array as the whole population's (rank order = slot order)."""
        return collectives.all_gather_axis(local, axis=0, dist=self.dist) if self.sharded else local

    def _mine(self, whole: Any) -> Any:
        """This rank's rows of a whole-population member-major array."""
        return whole[self.offset:self.offset + len(self.slots)]

    # --- hooks of the agent ----------------------------------------------------------
    def hyper_defaults(self) -> dict[str, float]:
        return {name: float(getattr(self.params, name)) for name in self.hyper_bounds}

    def new_learner(self, members: np.ndarray, hypers: dict[str, np.ndarray]) -> Any:
        """The agent's batched learner of the member slots ``members``, starting from
        the initial networks of :meth:`initial_networks`."""
        raise NotImplementedError

    def initial_networks(self, members: np.ndarray) -> np.ndarray:
        """Whose initial networks each member starts from: its own, or, where the
        members share, member 0's for all. Bell's agents all start from the same
        (zero) tables; averages of independently initialised networks mix unrelated
        hidden units (any permutation of them computes the same function) into noise,
        so sharing members start alike and differ by their experience."""
        return np.zeros_like(members) if self.params.share_every else members

    def greedy(self, state: PopulationState) -> Any:
        """A function from one observation per member (P, obs_dim) to greedy actions
        (P, ...): by default the learner's ``greedy_actions``."""
        return state.learner.greedy_actions

    def member_network(self, state: PopulationState, member: int) -> Any:
        """Member ``member``'s acting network as a plain module (a copy): by default the
        learner's ``member_module``."""
        return state.learner.member_module(member)

    # --- the run (budgets, progress and step counts: DeepExperiment's) -------------------
    def initial_state(self) -> PopulationState:
        p = self.params
        hypers = hyper.sample(self.specs, p.seed, self.slots, self.hyper_defaults())
        whole = hyper.sample(self.specs, p.seed, self.whole_slots, self.hyper_defaults())
        ids = initial_ids((len(self.whole_slots),))
        lineage = Lineage.start(ids, self.tracked, values={name: whole[name] for name in self.tracked})
        return PopulationState(learner=self.new_learner(self.slots, hypers),
                               envs=MemberEnvs(p.env, p.seed, self.slots, self.copies), ids=ids, lineage=lineage,
                               recent=np.full((len(self.slots), p.window), np.nan), copies=self.copies,
                               agents=len(self.whole_slots), max_bias=float(p.differentiation))

    def phase(self, state: PopulationState, *, time_left: float | None) -> PopulationState:
        p = self.params
        learner, member_envs = state.learner, state.envs
        every = max(1, getattr(p, "train_every", 0))
        before = state.episodes
        for _ in range(p.phase_steps):
            if self.finished(state, time_mode=False):
                break
            actions = learner.act(member_envs.obs, state.member_steps)
            step = member_envs.step(actions)
            learner.receive(step.obs, step.action, step.reward, step.successor, step.terminated, step.truncated)
            state.member_steps += 1
            if state.member_steps % every == 0:  # schedules run on each member's share of the budget
                learner.train(state.member_env_steps * p.agents / p.env_steps if p.env_steps else 0.0)
            if step.ended.size:
                self._record_episodes(state, step)
            state.episodes += len(step.ended)
            # at the step a mark is passed, not at the phase's end: where a phase ends
            # depends on budgets (a resumed run's phases fall elsewhere), the marks do not
            self._operators(state)
        if self.sharded:  # the other ranks' episodes of this phase
            state.episodes = before + collectives.sum_int(state.episodes - before, dist=self.dist)
        return state

    def _record_episodes(self, state: PopulationState, step: Any) -> None:
        """The episodes ``step`` ended, in environment order: into the run's episode
        lists and each member's window of recent returns."""
        rows = step.ended // self.copies
        returns = step.returns.tolist()
        state.episode_member.extend(self.slots[rows].tolist())
        state.episode_return.extend(returns)
        state.episode_length.extend(step.lengths.tolist())
        state.episode_step.extend([state.env_steps] * len(returns))
        if self.copies == 1:  # one episode per member at most: the windows move at once
            state.recent[rows, :-1] = state.recent[rows, 1:]
            state.recent[rows, -1] = step.returns
            return
        for row, ret in zip(rows.tolist(), returns):  # a member's copies may end together: in turn
            state.recent[row, :-1] = state.recent[row, 1:]
            state.recent[row, -1] = ret

    def _crossed(self, state: PopulationState, every: int, done: int) -> bool:
        return bool(every) and state.member_env_steps // every > done

    def _operators(self, state: PopulationState) -> None:
        p = self.params
        if self._crossed(state, p.share_every, state.shares):
            self.share(state)
        if self._crossed(state, p.replicate_every, state.replications) and state.member_env_steps >= p.replicate_after:
            self.replicate(state)

    def scores(self, state: PopulationState) -> np.ndarray:
        """Each member's mean return over its last ``--window`` episodes (NaN: none
        yet), the whole population's."""
        recent = self._whole(state.recent)
        seen = ~np.isnan(recent)
        total = np.where(seen, recent, 0.0).sum(axis=1)
        count = seen.sum(axis=1)
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)

    def tournament(self, state: PopulationState) -> tuple[np.ndarray, np.ndarray]:
        """Elo ratings (mean 0) and their standard errors from a round robin of
        ``--tournament-games`` greedy games per pair of members, in the environment's
        two-player game; its streams are keyed by the run's seed and the members'
        env-steps, so a resumed run plays the same games. Over ranks each rank acts for its
        own members and the actions are gathered once per ply (the environment's
        ``round_robin`` protocol), so the games are one process's."""
        p = self.params
        mine = slice(self.offset, self.offset + len(self.slots)) if self.sharded else None
        wins, draws = self.arena(self.greedy(state), len(self.whole_slots), p.tournament_games, p.seed,
                                 state.member_env_steps, rows=mine, gather=self._whole if self.sharded else None)
        ratings = elo_ratings(wins, draws)
        return ratings, elo_standard_errors(ratings, wins, draws)

    def greedy_ranking(self, state: PopulationState) -> tuple[np.ndarray, np.ndarray]:
        """Each member's mean return over ``--rank-episodes`` greedy episodes and its
        standard error, the whole population's; the episodes come from a stream of the
        seed and the members' env-steps (a resumed run plays the same ones), apart from
        training's and the final evaluation's. Their env-steps, every environment step
        taken while the longest episode finishes, are added to ``ranking_env_steps``."""
        p = self.params
        act, taken = self.greedy(state), [0]

        def counted(obs: np.ndarray) -> np.ndarray:
            taken[0] += len(obs)
            return act(obs)

        seed = rng.key_path(p.seed, TAG_RANKING, state.member_env_steps)
        returns = self._whole(evaluate_members(p.env, seed, self.slots, counted, p.rank_episodes))
        state.ranking_env_steps += int(self._whole(np.array([taken[0]], dtype=np.int64)).sum())
        return window_means(returns)

    def whole_hypers(self, state: PopulationState) -> dict[str, np.ndarray]:
        return {name: self._whole(values) for name, values in state.learner.hypers.items()}

    def replicate(self, state: PopulationState, scores: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """PBT's exploit and explore now (``scores``: by default :meth:`scores`);
        returns the (parents, children) slots."""
        p = self.params
        # the count of --replicate-every marks passed (a phase may pass several): keys explore's draws
        state.replications = (state.member_env_steps // p.replicate_every if p.replicate_every
                              else state.replications + 1)
        learner = state.learner
        errors = None
        if scores is not None:
            scores = np.asarray(scores, dtype=np.float64)
        elif p.rank_by == "tournament":
            scores, errors = self.tournament(state)
        elif p.rank_by == "greedy":
            scores, errors = self.greedy_ranking(state)
        else:
            scores = self.scores(state)
        finite = self._finite_members(state)
        parents, children = select_replacements(scores, p.replicate_fraction, eligible=finite)
        copies = parents != children
        if p.replicate_when == "significant":
            # A diverged member is replaced whatever the evidence; the others only by a
            # parent whose window mean (or rating) is above theirs beyond its noise.
            if errors is None:
                _, errors = window_means(self._whole(state.recent))
            copies &= significant(parents, children, scores, errors, p.replicate_confidence) | ~finite[children]
        parents, children = parents[copies], children[copies]
        if children.size == 0:
            return parents, children
        for table in learner.member_tables(replay=p.copy_replay):
            self._copy_rows(table, parents, children)
        hypers = self.whole_hypers(state)
        for values in hypers.values():
            values[children] = values[parents]
        generation = state.member_env_steps
        copied = {name: hypers[name][children] for name in self.tracked}
        state.ids, child_ids = state.lineage.replace(generation, state.ids, parents, children, values=copied)
        if self.specs:
            hypers = hyper.explore(hypers, children, self.specs, p.seed, state.replications, child_ids, p.resample)
            state.lineage.record(generation, "mutation", child_ids, slots=children,
                                 values={name: hypers[name][children] for name in self.tracked})
        learner.set_hypers({name: self._mine(values) for name, values in hypers.items()})
        recent = self._whole(state.recent)
        recent[children] = recent[parents]  # ranked as its parent until it plays
        state.recent = self._mine(recent).copy()
        return parents, children

    def _copy_rows(self, table: torch.Tensor, parents: np.ndarray, children: np.ndarray) -> None:
        """Rows ``children`` of a member-major table become rows ``parents`` (whole-
        population slots); across ranks, each parent's rank sends its row."""
        here = len(self.slots)
        if not self.sharded:
            src = torch.as_tensor(parents - self.offset, device=table.device)
            table[torch.as_tensor(children - self.offset, device=table.device)] = table[src]
            return
        owner = parents // here
        mine = owner == self.dist.rank
        send = torch.zeros((len(parents), *table.shape[1:]), dtype=table.dtype, device=table.device)
        send[torch.as_tensor(np.flatnonzero(mine))] = table[torch.as_tensor(parents[mine] - self.offset)]
        rows = collectives.all_gather_axis(send, axis=0, dist=self.dist).reshape(
            self.dist.world_size, len(parents), *table.shape[1:])[torch.as_tensor(owner),
                                                                   torch.arange(len(parents))]
        arriving = children // here == self.dist.rank
        if arriving.any():
            table[torch.as_tensor(children[arriving] - self.offset)] = rows[torch.as_tensor(np.flatnonzero(arriving))]

    def share(self, state: PopulationState) -> None:
        """Experience-weighted sharing in groups, then differentiation."""
        # numba's import costs every deep process (each rank) a few tenths of a second; only sharing needs it
        from popplay.operators.sharing import differentiate, share_weighted  # defers numba

        p = self.params
        group = p.share_group or len(self.whole_slots)
        experience = float(state.member_env_steps - state.last_share_step)
        keys = torch.as_tensor(rng.stream_keys(p.seed, TAG_SHARE, self.whole_slots).reshape(-1, group))
        # A diverged member's NaN would become its whole group's: it gives nothing and
        # keeps its own rows (a PBT step replaces it).
        finite_members = torch.as_tensor(self._finite_members(state))[:, None]
        for table in state.learner.parameter_tables():
            whole = self._whole(table)
            kept = whole.to(torch.float64)
            finite = finite_members.to(kept.device)
            values = torch.where(finite, kept, 0.0).reshape(-1, group, whole.shape[1])
            weights = torch.where(finite, torch.full_like(kept, experience), 0.0).reshape(values.shape)
            shared, _ = share_weighted(values, weights, 0.0)
            if state.max_bias > 0:
                shared, _ = differentiate(shared, state.max_bias, keys, state.shares * whole.shape[1])
            table.copy_(self._mine(torch.where(finite, shared.reshape(whole.shape), kept)).to(table.dtype))
        groups = len(self.whole_slots) // group
        state.lineage.record(state.member_env_steps, "share", np.full(groups, -1), groups=np.arange(groups))
        state.shares = state.member_env_steps // p.share_every if p.share_every else state.shares + 1
        state.max_bias /= p.bias_decay
        state.last_share_step = state.member_env_steps

    def _finite_members(self, state: PopulationState) -> np.ndarray:
        local = np.all([torch.isfinite(t).all(dim=1).cpu().numpy() for t in state.learner.parameter_tables()], axis=0)
        return self._whole(local.astype(np.int64)) != 0

    def diverged_members(self, state: PopulationState) -> np.ndarray:
        """(members,) bool, the whole population's: whose networks hold NaN or infinity.
        Such a member plays nothing: it is left out of rankings, sharing, evaluation
        and export, and a PBT step replaces it; the others learn on."""
        return ~self._finite_members(state)

    _warned: frozenset = frozenset()  # members whose divergence was reported

    def check_finite(self, state: PopulationState, *, phase: int) -> list[str]:
        """A member whose parameters went non-finite ranks last (the next PBT step
        replaces it) and is reported once, as an event of the run file; the run stops
        only when every member has."""
        finite = self._finite_members(state)
        # the set as it is now: a member replaced since its report is reported again if it diverges again
        reported, self._warned = self._warned, frozenset(np.flatnonzero(~finite).tolist())
        if finite.all() or self.diverged is not None:
            return []
        if not finite.any():
            self.diverged_phase = phase
            self.diverged = f"phase {phase}: every member diverged (non-finite parameters); the run stops here"
            return [self.diverged]
        state.recent[~self._mine(finite)] = np.nan
        new = sorted(self._warned - reported)
        if not new:
            return []
        return [f"phase {phase}: member{'s' if len(new) > 1 else ''} {', '.join(map(str, new))} diverged "
                "(non-finite parameters): left out of rankings, sharing, evaluation and export; the others "
                "learn on (PBT, --replicate-every, replaces such members)"]

    # --- measurements ---------------------------------------------------------------
    def _updates(self, state: PopulationState) -> float:
        """The learner's optimiser steps: the same for every member where they learn in
        lockstep; where each learns at its own moments (REINFORCE's episode ends), the
        whole population's sum of ``member_updates()``."""
        per_member = getattr(state.learner, "member_updates", None)
        return float(self._whole(per_member()).sum()) if per_member is not None else float(state.learner.updates)

    def measure(self, state: PopulationState) -> dict[str, float]:
        scores = self.scores(state)
        seen = scores[~np.isnan(scores)]
        out = {"return_best": float(seen.max()) if seen.size else math.nan,
               "return_mean": float(seen.mean()) if seen.size else math.nan,
               "return_worst": float(seen.min()) if seen.size else math.nan,
               "updates": self._updates(state)}
        epsilons = getattr(state.learner, "epsilons", None)
        if epsilons is not None:  # an ε-greedy agent's exploration, falling with its updates
            out["epsilon"] = float(np.mean(self._whole(epsilons())))
        hypers = self.whole_hypers(state) if self.specs else {}
        for spec in self.specs:  # the spread of every hyper-parameter that varies
            values = hypers[spec.name]
            out[f"{spec.name}_min"], out[f"{spec.name}_mean"], out[f"{spec.name}_max"] = (
                float(values.min()), float(values.mean()), float(values.max()))
        return out

    # --- run file ---------------------------------------------------------------------
    def state_arrays(self, state: PopulationState) -> dict[str, Any]:
        """The whole population's arrays (on several ranks every rank takes part; the
        episodes come out in the one-process order: by step, then by member)."""
        self._note(state)
        lineage = {f"lineage_{name}": values for name, values in state.lineage.to_arrays().items()}
        local_envs = state.envs.arrays()
        envs_arrays = {name: self._whole(values) for name, values in local_envs.items() if name != "env.actions"}
        actions = local_envs["env.actions"]
        envs_arrays["env.actions"] = (collectives.all_gather_ragged(actions.reshape(-1), dist=self.dist)
                                      .reshape(-1, *actions.shape[1:]) if self.sharded else actions)
        episodes = [np.asarray(state.episode_member, dtype=np.int64), np.asarray(state.episode_return),
                    np.asarray(state.episode_length, dtype=np.int64), np.asarray(state.episode_step, dtype=np.int64)]
        if self.sharded:
            episodes = [collectives.all_gather_ragged(values, dist=self.dist) for values in episodes]
            order = np.lexsort((episodes[0], episodes[3]))
            episodes = [values[order] for values in episodes]
        member, returns, lengths, steps = episodes
        return {**{name: self._whole(values) for name, values in state.learner.arrays().items()}, **envs_arrays,
                "agent_id": state.ids.copy(), **lineage, "episode_member": member,
                "episode_returns": returns.astype(np.float64), "episode_lengths": lengths,
                "episode_env_steps": steps, "recent_returns": self._whole(state.recent)}

    def state_counters(self, state: PopulationState) -> dict[str, Any]:
        return {**state.learner.counters(), "member_steps": state.member_steps, "episodes": state.episodes,
                "env_steps": state.env_steps, "shares": state.shares, "max_bias": state.max_bias,
                "replications": state.replications, "last_share_step": state.last_share_step,
                "ranking_env_steps": state.ranking_env_steps}

    def _without_diverged(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """The stored arrays that must hold no NaN or infinity: all but the lineage's and
        the recent returns' NaN, and but the rows of members that diverged (non-finite
        values in their own rows: such a member is kept as it was, and plays nothing),
        unless every member did (a run that stopped diverged)."""
        whole, copies = len(self.whole_slots), self.copies
        dead = np.zeros(whole, dtype=bool)
        for name, values in arrays.items():
            if name.startswith("members.") and isinstance(values, np.ndarray) and values.dtype.kind == "f" \
                    and values.ndim and values.shape[0] == whole:
                dead |= ~np.isfinite(values.reshape(whole, -1)).all(axis=1)
        if dead.all():
            dead[:] = False
        live_envs = np.repeat(~dead, copies)
        counts = np.asarray(arrays.get("env.action_counts", np.zeros(0)), dtype=np.int64)
        members = np.asarray(arrays.get("episode_member", np.zeros(0)), dtype=np.int64)
        out = {}
        for name, values in arrays.items():
            if name.startswith("lineage_") or name == "recent_returns" or not isinstance(values, np.ndarray):
                continue
            if name.startswith("members.") and values.ndim and len(values) == whole:
                values = values[~dead]
            elif name in ("env.obs", "env.return") and values.ndim and len(values) == whole * copies:
                values = values[live_envs]
            elif name == "env.actions" and counts.shape == live_envs.shape and (counts >= 0).all() \
                    and counts.sum() == len(values):
                values = values[np.repeat(live_envs, counts)]
            elif name == "episode_returns" and members.shape == values.shape \
                    and ((members >= 0) & (members < whole)).all():
                values = values[~dead[members]]
            out[name] = values
        return out

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> PopulationState:
        """This rank's part of a stored population (stored from any number of ranks)."""
        check_finite_arrays(self._without_diverged(arrays))
        p = self.params
        whole = len(self.whole_slots)
        ids = np.asarray(arrays["agent_id"], dtype=np.int64)
        if ids.shape != (whole,):
            raise ValueError(f"agent_id: {ids.shape} ids stored for {whole} members")
        lineage = Lineage.from_arrays({k[len("lineage_"):]: v for k, v in arrays.items() if k.startswith("lineage_")},
                                      self.tracked)
        rows = slice(self.offset, self.offset + len(self.slots))
        env_rows = slice(self.offset * self.copies, (self.offset + len(self.slots)) * self.copies)
        mine: dict[str, Any] = {}
        for name, values in arrays.items():
            if name.startswith(("members.", "hyper.")):
                values = np.asarray(values)
                if values.ndim == 0 or values.shape[0] != whole:
                    raise ValueError(f"{name}: {values.shape[:1]} rows stored for {whole} members")
                mine[name] = values[rows]
        counts = np.asarray(arrays["env.action_counts"], dtype=np.int64)
        if counts.shape != (whole * self.copies,) or (counts < 0).any():
            raise ValueError(f"env.action_counts: does not fit {whole} members x {self.copies} copies")
        starts = np.concatenate([[0], np.cumsum(counts)])
        for name in ("env.episode", "env.return", "env.obs", "env.action_counts"):
            mine[name] = np.asarray(arrays[name])[env_rows]
        mine["env.actions"] = np.asarray(arrays["env.actions"])[starts[env_rows.start]:starts[env_rows.stop]]
        hypers = {name: np.asarray(mine.get(f"hyper.{name}", np.zeros(0))) for name in self.hyper_bounds}
        learner = self.new_learner(self.slots, {k: (v if v.shape == self.slots.shape else np.ones(len(self.slots)))
                                                for k, v in hypers.items()})
        learner.load(mine, counters)
        member_envs = MemberEnvs(p.env, p.seed, self.slots, self.copies)
        member_envs.load(mine)
        recent = np.asarray(arrays["recent_returns"], dtype=np.float64)
        if recent.shape != (whole, p.window):
            raise ValueError(f"recent_returns: shape {recent.shape}, expected {(whole, p.window)}")
        state = PopulationState(learner=learner, envs=member_envs, ids=ids, lineage=lineage,
                                recent=recent[rows].copy(), copies=self.copies, agents=whole)
        state.member_steps = int(counters["member_steps"])
        state.episodes = int(counters["episodes"])
        state.shares = int(counters["shares"])
        state.max_bias = float(counters["max_bias"])
        state.replications = int(counters["replications"])
        state.last_share_step = int(counters["last_share_step"])
        state.ranking_env_steps = int(counters.get("ranking_env_steps", 0))  # files written before: none
        member = np.asarray(arrays["episode_member"], dtype=np.int64)
        episodes = [member, np.asarray(arrays["episode_returns"]), np.asarray(arrays["episode_lengths"]),
                    np.asarray(arrays["episode_env_steps"])]
        if len({len(values) for values in episodes}) != 1 or len(member) != state.episodes:
            raise ValueError(f"{len(member)} episode records stored for {state.episodes} episodes")
        keep = np.isin(member, self.slots)
        state.episode_member, state.episode_return, state.episode_length, state.episode_step = (
            [kind(v) for v in values[keep].tolist()] for kind, values in zip((int, float, int, int), episodes))
        self._warned = frozenset(np.flatnonzero(self.diverged_members(state)).tolist())  # the file's events say so
        self._note(state)
        return state

    # --- evaluation -------------------------------------------------------------------
    def member_qualities(self, state: PopulationState, episodes: int | None = None) -> np.ndarray:
        """Each member's mean return over ``episodes`` greedy episodes (default
        ``--eval-episodes``), all members playing at once; NaN for 0. The whole
        population's: on several ranks, every rank takes part."""
        n = self.params.eval_episodes if episodes is None else episodes
        if n == 0:
            return np.full(len(self.whole_slots), np.nan)
        local = evaluate_members(self.params.env, self.params.seed, self.slots, self.greedy(state), n).mean(axis=1)
        qualities = self._whole(local)
        qualities[self.diverged_members(state)] = np.nan  # NaN weights act at random, not by a policy
        return qualities

    def member_returns(self, state: PopulationState, episodes: int, seed: int, member: int | None = None
                       ) -> np.ndarray:
        """(members, episodes) greedy returns from evaluation seed ``seed``: every
        member, or ``member`` alone (slot), in one process."""
        act = self.greedy(state)
        diverged = self.diverged_members(state)
        if member is None:
            returns = evaluate_members(self.params.env, seed, self.slots, act, episodes)
            returns[diverged] = np.nan  # NaN weights act at random, not by a policy
            return returns
        returns = evaluate_members(self.params.env, seed, self.slots[member:member + 1],
                                   lambda obs: act(np.repeat(obs, len(self.slots), axis=0))[member:member + 1],
                                   episodes)
        return np.full_like(returns, np.nan) if diverged[member] else returns

    def quality(self, state: PopulationState, episodes: int | None = None) -> float:
        return float(np.nanmax(self.member_qualities(state, episodes)))

    def close(self, state: PopulationState) -> None:
        """The greedy evaluation of every member, once the run is saved (every rank
        plays its members' episodes; the summary reads the result)."""
        self._qualities = (self.member_qualities(state) if self.diverged is None
                           else np.full(len(self.whole_slots), np.nan))
        self._hypers = self.whole_hypers(state)

    def summary_fields(self, state: PopulationState, seconds: float) -> dict[str, Any]:
        qualities = self._qualities if self._qualities is not None else self.member_qualities(state)
        known = qualities[~np.isnan(qualities)]
        plain = lambda x: None if x is None or math.isnan(x) else float(x)  # noqa: E731
        best = int(np.nanargmax(qualities)) if known.size else None
        hypers = getattr(self, "_hypers", None) or self.whole_hypers(state)
        hypers = {name: values for name, values in hypers.items() if name in self.tracked}
        return {"env": self.params.env, "topology": "population", "ranks": self.dist.world_size if self.sharded else 1,
                "agents": self.params.agents,
                "quality": plain(known.max()) if known.size else None,
                "quality_mean": plain(known.mean()) if known.size else None,
                "quality_worst": plain(known.min()) if known.size else None, "best_member": best,
                "member_quality": [plain(q) for q in qualities.tolist()],
                "eval_episodes": self.params.eval_episodes, "env_steps": int(state.env_steps),
                "episodes": int(state.episodes),
                "env_steps_per_second": state.env_steps / seconds if seconds > 0 else 0.0,
                "replications": state.replications, "shares": state.shares,
                "ranking_env_steps": int(state.ranking_env_steps),
                "hypers": {name: [float(v) for v in values] for name, values in hypers.items()},
                **({"diverged": self.diverged} if self.diverged is not None else {})}

    @staticmethod
    def role(params: Any, rank: int) -> str:
        return f"members rank {rank}"


class ActorCriticPopulation(PopulationExperiment):
    """A population of actor-critic members learning from rollouts of ``--copies``
    environments each (PPO's, A2C's): the agent names its batched learner,
    ``learner_class(params, obs_dim, actions, seed, members, hypers, device=, init_from=)``,
    which gives ``greedy_actions`` and ``member_module`` besides the population protocol."""

    copies_field = "copies"
    learner_class: Any = None

    def __init__(self, params: Any, backend: Any, members: np.ndarray | None = None) -> None:
        super().__init__(params, backend, members)
        require_discrete(self.info, self.domain)

    def new_learner(self, members: np.ndarray, hypers: dict[str, np.ndarray]) -> Any:
        return self.learner_class(self.params, self.info.obs_dim, int(self.info.actions), self.params.seed, members,
                                  hypers, device=self.device, init_from=self.initial_networks(members))


def evaluate_members(env_id: str, seed: int, slots: np.ndarray, act: Any, episodes: int) -> np.ndarray:
    """(P, episodes) returns of greedy episodes, every member's episode ``e`` played at
    once from a seed of (seed, member, e) apart from the training episodes' seeds;
    ``act`` maps (P, obs_dim) observations to (P,) actions."""
    slots = np.asarray(slots, dtype=np.int64)
    evaluation = MemberEnvs(env_id, rng.key_path(seed, TAG_EVALUATION), slots)
    try:
        out = np.zeros((len(slots), episodes))
        for e in range(episodes):
            if e:
                evaluation.start_episode(e)
            active = np.ones(len(slots), dtype=bool)
            while active.any():
                step = evaluation.step(act(evaluation.obs))
                out[active, e] += step.reward[active]
                active[step.ended] = False
        return out
    finally:
        evaluation.close()

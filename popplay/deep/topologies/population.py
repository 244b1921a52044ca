"""Populations of deep agents: ``--agents P`` members learning at once in one process.

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from popplay import rng
from popplay.deep.envs.members import MemberEnvs
from popplay.deep.topologies.base import check_finite_arrays
from popplay.deep.topologies.common import budget_reached, estimated_budget_steps
from popplay.operators import hyper
from popplay.operators.evolution import Lineage, initial_ids, select_replacements
from popplay.operators.sharing import differentiate, share_weighted

TAG_SHARE = 12
TAG_EVALUATION = 13


@dataclass
class PopulationState:
    learner: Any  # the agent's population learner (DQNMembers)
    envs: MemberEnvs
    ids: np.ndarray  # (P,) lineage id of the member in each slot
    lineage: Lineage
    member_steps: int = 0  # steps of each member's environments (they step in lockstep)
    episodes: int = 0  # finished episodes, all members
    shares: int = 0
    max_bias: float = 0.0
    replications: int = 0
    last_share_step: int = 0
    # every finished episode, in order: member slot, return, length, population env-steps at its end
    episode_member: list[int] = field(default_factory=list)
    episode_return: list[float] = field(default_factory=list)
    episode_length: list[int] = field(default_factory=list)
    episode_step: list[int] = field(default_factory=list)
    recent: list[list[float]] = field(default_factory=list)  # per slot: returns that rank it (last --window)
    copies: int = 1  # environments per member
    agents: int = 0  # members of the whole population (this process may run a part: ``ids``)

    @property
    def member_env_steps(self) -> int:
        """Env-steps of each member (over its copies): the operators' clock."""
        return self.member_steps * self.copies

    @property
    def env_steps(self) -> int:
        """Env-steps of the whole population (its members step in lockstep)."""
        return self.member_env_steps * (self.agents or len(self.ids))


class PopulationExperiment:
    """The runner's view of a deep population (:class:`popplay.core.experiment.Experiment`).

    An agent's population plugs in with :meth:`new_learner` (its batched learner for
    the member slots given) and :meth:`greedy` (a function from (P, B, obs) observations
    to actions); the learner gives ``act``, ``receive``, ``train``, ``hypers``,
    ``set_hypers``, ``copy_members``, ``parameter_tables``, ``arrays``, ``counters``,
    ``load`` and ``losses``.
    """

    domain = "deep"
    hyper_bounds: dict[str, hyper.Bounds] = {}
    step_name = "env-steps"
    episode_unit = "episodes"
    diverged: str | None = None
    diverged_phase: int | None = None

    #: Environments per member (PPO's --copies; one for DQN).
    copies_field: str | None = None

    def __init__(self, params: Any, backend: Any, members: np.ndarray | None = None) -> None:
        """``members``: the member slots this process runs (default: all ``--agents``)."""
        torch.set_num_threads(1)  # as every deep run: tiny matrices, shared cores
        params.validate()
        self.params = params
        self.backend = backend
        self.device = backend.device if backend is not None else "cpu"
        self.specs = params.hyper_specs(self.hyper_bounds)
        self.slots = (np.arange(params.agents, dtype=np.int64) if members is None
                      else np.asarray(members, dtype=np.int64).reshape(-1))
        # The lineage records the hyper-parameters that vary (an --hp spec); the others are the run's config.
        self.tracked = tuple(spec.name for spec in self.specs)
        self.copies = int(getattr(params, self.copies_field)) if self.copies_field else 1
        probe = MemberEnvs(params.env, params.seed, self.slots[:1])
        self.info = probe.info
        probe.close()

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

    # --- the run ---------------------------------------------------------------------
    def warmup(self) -> None:
        pass

    def initial_state(self) -> PopulationState:
        p = self.params
        hypers = hyper.sample(self.specs, p.seed, self.slots, self.hyper_defaults())
        ids = initial_ids((len(self.slots),))
        lineage = Lineage.start(ids, self.tracked, values={name: hypers[name] for name in self.tracked})
        return PopulationState(learner=self.new_learner(self.slots, hypers),
                               envs=MemberEnvs(p.env, p.seed, self.slots, self.copies), ids=ids, lineage=lineage,
                               copies=self.copies, agents=p.agents,
                               max_bias=float(p.differentiation), recent=[[] for _ in self.slots])

    def finished(self, state: PopulationState, *, time_mode: bool) -> bool:
        if self.diverged is not None:
            return True
        return budget_reached(state.episodes, state.env_steps, self.params.episodes, self.params.env_steps)

    def phase(self, state: PopulationState, *, time_left: float | None) -> PopulationState:
        p = self.params
        learner, member_envs = state.learner, state.envs
        every = max(1, getattr(p, "train_every", 0))
        for _ in range(p.phase_steps):
            if self.finished(state, time_mode=False):
                break
            actions = learner.act(member_envs.obs, state.member_steps)
            step = member_envs.step(actions)
            learner.receive(step.obs, step.action, step.reward, step.successor, step.terminated, step.truncated)
            state.member_steps += 1
            if state.member_steps % every == 0:
                learner.train(state.env_steps / p.env_steps if p.env_steps else 0.0)
            for env, ret, length in zip(step.ended.tolist(), step.returns.tolist(), step.lengths.tolist()):
                slot = env // self.copies
                state.episode_member.append(slot)
                state.episode_return.append(ret)
                state.episode_length.append(length)
                state.episode_step.append(state.env_steps)
                recent = state.recent[slot]
                recent.append(ret)
                del recent[:-p.window]
            state.episodes += len(step.ended)
            # at the step a mark is passed, not at the phase's end: where a phase ends
            # depends on budgets (a resumed run's phases fall elsewhere), the marks do not
            self._operators(state)
        return state

    def _crossed(self, state: PopulationState, every: int, done: int) -> bool:
        return bool(every) and state.member_env_steps // every > done

    def _operators(self, state: PopulationState) -> None:
        p = self.params
        if self._crossed(state, p.share_every, state.shares):
            self.share(state)
        if self._crossed(state, p.replicate_every, state.replications):
            self.replicate(state)

    def scores(self, state: PopulationState) -> np.ndarray:
        """Each member's mean return over its last ``--window`` episodes (NaN: none yet)."""
        return np.asarray([np.mean(r) if r else np.nan for r in state.recent], dtype=np.float64)

    def replicate(self, state: PopulationState, scores: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """PBT's exploit and explore now (``scores``: by default :meth:`scores`);
        returns the (parents, children) slots."""
        p = self.params
        # the count of --replicate-every marks passed (a phase may pass several): keys explore's draws
        state.replications = (state.member_env_steps // p.replicate_every if p.replicate_every
                              else state.replications + 1)
        learner = state.learner
        scores = self.scores(state) if scores is None else np.asarray(scores, dtype=np.float64)
        parents, children = select_replacements(scores, p.replicate_fraction, eligible=self._finite_members(state))
        copies = parents != children
        parents, children = parents[copies], children[copies]
        if children.size == 0:
            return parents, children
        learner.copy_members(parents, children, replay=p.copy_replay)
        generation = state.member_env_steps
        copied = {name: learner.hypers[name][children] for name in self.tracked}
        state.ids, child_ids = state.lineage.replace(generation, state.ids, parents, children, values=copied)
        if self.specs:
            explored = hyper.explore(learner.hypers, children, self.specs, p.seed, state.replications, child_ids,
                                     p.resample)
            learner.set_hypers(explored)
            state.lineage.record(generation, "mutation", child_ids, slots=children,
                                 values={name: explored[name][children] for name in self.tracked})
        for parent, child in zip(parents.tolist(), children.tolist()):
            state.recent[child] = list(state.recent[parent])  # ranked as its parent until it plays
        return parents, children

    def share(self, state: PopulationState) -> None:
        """Experience-weighted sharing in groups, then differentiation."""
        p = self.params
        learner = state.learner
        group = p.share_group or len(self.slots)
        experience = float(state.member_env_steps - state.last_share_step)
        keys = torch.as_tensor(rng.stream_keys(p.seed, TAG_SHARE, self.slots).reshape(-1, group))
        for table in learner.parameter_tables():
            values = table.to(torch.float64).reshape(-1, group, table.shape[1])
            weights = torch.full_like(values, experience)
            shared, _ = share_weighted(values, weights, 0.0)
            if state.max_bias > 0:
                shared, _ = differentiate(shared, state.max_bias, keys, state.shares * table.shape[1])
            table.copy_(shared.reshape(table.shape).to(table.dtype))
        groups = len(self.slots) // group
        state.lineage.record(state.member_env_steps, "share", np.full(groups, -1), groups=np.arange(groups))
        state.shares = state.member_env_steps // p.share_every if p.share_every else state.shares + 1
        state.max_bias /= p.bias_decay
        state.last_share_step = state.member_env_steps

    def _finite_members(self, state: PopulationState) -> np.ndarray:
        return np.all([torch.isfinite(t).all(dim=1).cpu().numpy() for t in state.learner.parameter_tables()], axis=0)

    def check_finite(self, state: PopulationState, *, phase: int) -> list[str]:
        """A member whose parameters went non-finite ranks last (the next PBT step
        replaces it); the run stops only when every member has."""
        finite = self._finite_members(state)
        if finite.all() or self.diverged is not None:
            return []
        if not finite.any():
            self.diverged_phase = phase
            self.diverged = f"phase {phase}: every member diverged (non-finite parameters); the run stops here"
            return [self.diverged]
        for slot in np.flatnonzero(~finite):
            state.recent[slot] = []
        return []

    # --- measurements ---------------------------------------------------------------
    def measure(self, state: PopulationState) -> dict[str, float]:
        scores = self.scores(state)
        seen = scores[~np.isnan(scores)]
        out = {"return_best": float(seen.max()) if seen.size else math.nan,
               "return_mean": float(seen.mean()) if seen.size else math.nan,
               "return_worst": float(seen.min()) if seen.size else math.nan,
               "updates": float(state.learner.updates)}
        epsilons = getattr(state.learner, "epsilons", None)
        if epsilons is not None:  # an ε-greedy agent's exploration, falling with its updates
            out["epsilon"] = float(np.mean(epsilons()))
        for spec in self.specs:  # the spread of every hyper-parameter that varies
            values = state.learner.hypers[spec.name]
            out[f"{spec.name}_min"], out[f"{spec.name}_mean"], out[f"{spec.name}_max"] = (
                float(values.min()), float(values.mean()), float(values.max()))
        return out

    def agent_steps(self, state: PopulationState) -> int:
        return state.env_steps

    total_agent_steps = agent_steps

    def _note(self, state: PopulationState) -> None:
        self._last = (state.episodes, state.env_steps)

    def budget_agent_steps(self) -> int:
        done = getattr(self, "_last", (0, 0))
        return estimated_budget_steps(done[0], done[1], self.params.episodes, self.params.env_steps)

    @property
    def progress_unit(self) -> str:
        return "env-steps" if self.params.env_steps and not self.params.episodes else self.episode_unit

    def budget_progress(self) -> int:
        return self.params.env_steps if self.progress_unit == "env-steps" else self.params.episodes

    def progress(self, state: PopulationState) -> int:
        self._note(state)
        return state.env_steps if self.progress_unit == "env-steps" else state.episodes

    # --- run file ---------------------------------------------------------------------
    def state_arrays(self, state: PopulationState) -> dict[str, Any]:
        self._note(state)
        lineage = {f"lineage_{name}": values for name, values in state.lineage.to_arrays().items()}
        return {**state.learner.arrays(), **state.envs.arrays(), "agent_id": state.ids.copy(), **lineage,
                "episode_member": np.asarray(state.episode_member, dtype=np.int64),
                "episode_returns": np.asarray(state.episode_return, dtype=np.float64),
                "episode_lengths": np.asarray(state.episode_length, dtype=np.int64),
                "episode_env_steps": np.asarray(state.episode_step, dtype=np.int64),
                "recent_returns": _ragged(state.recent)[0], "recent_counts": _ragged(state.recent)[1]}

    def state_counters(self, state: PopulationState) -> dict[str, Any]:
        return {**state.learner.counters(), "member_steps": state.member_steps, "episodes": state.episodes,
                "env_steps": state.env_steps, "shares": state.shares, "max_bias": state.max_bias,
                "replications": state.replications, "last_share_step": state.last_share_step}

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> PopulationState:
        check_finite_arrays({k: v for k, v in arrays.items() if not k.startswith("lineage_")})
        p = self.params
        ids = np.asarray(arrays["agent_id"], dtype=np.int64)
        if ids.shape != self.slots.shape:
            raise ValueError(f"agent_id: {ids.shape} ids stored for {len(self.slots)} members")
        lineage = Lineage.from_arrays({k[len("lineage_"):]: v for k, v in arrays.items() if k.startswith("lineage_")},
                                      self.tracked)
        hypers = {name: np.asarray(arrays.get(f"hyper.{name}", np.zeros(0))) for name in self.hyper_bounds}
        learner = self.new_learner(self.slots, {k: (v if v.shape == self.slots.shape else np.ones(len(self.slots)))
                                                for k, v in hypers.items()})
        learner.load(arrays, counters)
        member_envs = MemberEnvs(p.env, p.seed, self.slots, self.copies)
        member_envs.load(arrays)
        state = PopulationState(learner=learner, envs=member_envs, ids=ids, lineage=lineage, copies=self.copies,
                                agents=p.agents)
        state.member_steps = int(counters["member_steps"])
        state.episodes = int(counters["episodes"])
        state.shares = int(counters["shares"])
        state.max_bias = float(counters["max_bias"])
        state.replications = int(counters["replications"])
        state.last_share_step = int(counters["last_share_step"])
        state.episode_member = [int(v) for v in arrays["episode_member"]]
        state.episode_return = [float(v) for v in arrays["episode_returns"]]
        state.episode_length = [int(v) for v in arrays["episode_lengths"]]
        state.episode_step = [int(v) for v in arrays["episode_env_steps"]]
        if not len(state.episode_member) == len(state.episode_return) == state.episodes:
            raise ValueError(f"{len(state.episode_return)} episode returns stored for {state.episodes} episodes")
        state.recent = _unragged(arrays["recent_returns"], arrays["recent_counts"], len(self.slots))
        self._note(state)
        return state

    def static_arrays(self) -> dict[str, Any]:
        return {}

    def results(self, state: PopulationState) -> dict[str, Any]:
        return {}

    # --- evaluation -------------------------------------------------------------------
    def member_qualities(self, state: PopulationState, episodes: int | None = None) -> np.ndarray:
        """Each member's mean return over ``episodes`` greedy episodes (default
        ``--eval-episodes``), all members playing at once; NaN for 0."""
        n = self.params.eval_episodes if episodes is None else episodes
        if n == 0:
            return np.full(len(self.slots), np.nan)
        return evaluate_members(self.params.env, self.params.seed, self.slots, self.greedy(state), n).mean(axis=1)

    def greedy(self, state: PopulationState) -> Any:
        raise NotImplementedError

    def member_network(self, state: PopulationState, member: int) -> Any:
        """Member ``member``'s acting network as a plain ``nn.Sequential`` (a copy)."""
        raise NotImplementedError

    def member_returns(self, state: PopulationState, episodes: int, seed: int, member: int | None = None
                       ) -> np.ndarray:
        """(members, episodes) greedy returns from evaluation seed ``seed``: every
        member, or ``member`` alone (slot)."""
        act = self.greedy(state)
        if member is None:
            return evaluate_members(self.params.env, seed, self.slots, act, episodes)
        return evaluate_members(self.params.env, seed, self.slots[member:member + 1],
                                lambda obs: act(np.repeat(obs, len(self.slots), axis=0))[member:member + 1],
                                episodes)

    def quality(self, state: PopulationState, episodes: int | None = None) -> float:
        return float(np.nanmax(self.member_qualities(state, episodes)))

    def summary_fields(self, state: PopulationState, seconds: float) -> dict[str, Any]:
        qualities = self.member_qualities(state) if self.diverged is None else np.full(len(self.slots), np.nan)
        known = qualities[~np.isnan(qualities)]
        plain = lambda x: None if x is None or math.isnan(x) else float(x)  # noqa: E731
        best = int(np.nanargmax(qualities)) if known.size else None
        return {"env": self.params.env, "topology": "population", "ranks": 1, "agents": self.params.agents,
                "quality": plain(known.max()) if known.size else None,
                "quality_mean": plain(known.mean()) if known.size else None,
                "quality_worst": plain(known.min()) if known.size else None, "best_member": best,
                "member_quality": [plain(q) for q in qualities.tolist()],
                "eval_episodes": self.params.eval_episodes, "env_steps": int(state.env_steps),
                "episodes": int(state.episodes),
                "env_steps_per_second": state.env_steps / seconds if seconds > 0 else 0.0,
                "replications": state.replications, "shares": state.shares,
                "hypers": {name: [float(v) for v in values] for name, values in state.learner.hypers.items()
                           if any(s.name == name for s in self.specs)},
                **({"diverged": self.diverged} if self.diverged is not None else {})}

    @staticmethod
    def role(params: Any, rank: int) -> str:
        return "population"


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
                evaluation.episode[:] = e
                evaluation.obs = np.stack([evaluation._reset(i) for i in range(len(slots))]).astype(np.float32)
            active = np.ones(len(slots), dtype=bool)
            while active.any():
                step = evaluation.step(act(evaluation.obs))
                out[active, e] += step.reward[active]
                active[step.ended] = False
        return out
    finally:
        evaluation.close()


def _ragged(lists: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    return (np.asarray([v for values in lists for v in values], dtype=np.float64),
            np.asarray([len(values) for values in lists], dtype=np.int64))


def _unragged(flat: Any, counts: Any, members: int) -> list[list[float]]:
    flat, counts = np.asarray(flat, dtype=np.float64), np.asarray(counts, dtype=np.int64)
    if counts.shape != (members,) or (counts < 0).any() or int(counts.sum()) != flat.size:
        raise ValueError("recent_returns: does not fit the members")
    out, start = [], 0
    for n in counts.tolist():
        out.append(flat[start:start + n].tolist())
        start += n
    return out


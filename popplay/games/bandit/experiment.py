"""A bandit population experiment on either backend (what the runner drives)."""
from __future__ import annotations

from typing import Any

import numpy as np

from popplay import stats
from popplay.core.backend import Backend, PhasePlan
from popplay.distributed import collectives
from popplay.distributed.collectives import population_shard
from popplay.distributed.group import Dist, current
from popplay.games.bandit import rules as game
from popplay.games.bandit.rules import BanditParams, BanditState


class BanditExperiment:
    """Learning phases of ``share_every`` steps per agent, each ending with a share.

    The state between phases is :class:`BanditState` (NumPy arrays): the shared
    tables that every agent of a trial holds after a share.
    """

    domain = "bandit"

    def __init__(self, params: BanditParams, backend: Backend, dist: Any = None) -> None:
        params.validate()
        self.params = params
        self.backend = backend
        p = params
        # Sharded over ranks, this process learns either a contiguous block of the
        # trials (all their agents) or, when the ranks do not divide the trials, a
        # contiguous block of each trial's agents. Trials never share, so the trial
        # layout needs no communication inside a phase, only the gathering of the
        # (small) shared tables after it; the agent layout must gather every agent's
        # touched arms for the share. The shared tables (the state) are whole on every
        # rank either way, and the bits are the same in both layouts.
        self.dist = current() if dist is None else dist
        self.layout, self._trial_block, mine = population_shard(p.trials, p.agents, self.dist)
        self.local_agents = mine.stop - mine.start
        self.local_trials = self._trial_block.stop - self._trial_block.start
        trials, agents = np.arange(p.trials)[self._trial_block], np.arange(p.agents)[mine]
        self.means = game.arm_means(p.seed, p.trials, p.arms)
        self.best_arm = np.argmax(self.means, axis=1)
        self._local_means = np.ascontiguousarray(self.means[self._trial_block])
        keys = game.agent_keys(p.seed, trials, agents)
        static_keys = game.agent_static_keys(p.seed, trials, agents)
        self.epsilons = game.agent_epsilons(p)
        self.topk = game.agent_topk(p)
        self.groups, self.n_groups = game.explore_groups(p)
        local = {name: np.ascontiguousarray(getattr(self, name)[mine]) for name in ("epsilons", "topk", "groups")}
        self.use_bias = p.differentiation == "bias"
        self.plan = PhasePlan(p.steps_per_agent, p.share_every)
        if backend.name == "torch":
            import torch  # defers torch

            from popplay.games.bandit._torch import TorchBanditEngine  # defers torch

            def reduce_sums(pulls: Any, rewards: Any) -> tuple[Any, Any]:
                both = collectives.sum_int_array(torch.stack([pulls, rewards]), self.dist)
                return both[0], both[1]

            self._torch = TorchBanditEngine(
                means=self._local_means, keys=keys, static_keys=static_keys, epsilons=local["epsilons"],
                topk=local["topk"], groups=local["groups"], n_groups=self.n_groups,
                bias_scale=p.bias_scale, use_bias=self.use_bias, device=backend.device, compile=backend.compile,
                total_agents=p.agents, run_steps=p.steps_per_agent,
                reduce_sums=reduce_sums if self.layout == "agents" and self.dist.distributed else None,
            )
        else:
            self._keys = keys
            self._static_keys = static_keys
            self._local = local
            self._scratch: dict[int, tuple[np.ndarray, ...]] = {}
            # Ranking every trial's arms at each phase lets an agent rescan its greedy
            # choice in O(arms it pulled) instead of O(arms); worth its sort only when
            # a phase does more agent-steps per trial than there are arms. With a
            # per-agent bias the order bounds how far an agent must look.
            self._ranked = p.agents * p.share_every >= 2 * p.arms
            shape = (self.local_trials, p.arms) if self._ranked else (1, 1)
            self._order = np.zeros(shape, dtype=np.int64)
            self._rank = np.zeros(shape, dtype=np.int64)
            self._tie_top = np.zeros(shape[0], dtype=np.int64)

    # -- the runner's interface -------------------------------------------------

    def initial_state(self) -> BanditState:
        if self.backend.name == "torch":
            self._torch.start_run()
        return game.initial_state(self.params)

    def warmup(self) -> None:
        """Compile (or load from numba's cache) the kernels on a tiny population."""
        if self.backend.name != "numba":
            return
        # The tiny run takes the same kernel path (ranked rescans or full scans) as
        # this one, so that no kernel is left to load or compile in a timed phase.
        share_every = 4 if self._ranked else 1
        tiny = BanditParams(arms=3, agents=2, trials=1, steps_per_agent=share_every, share_every=share_every,
                            differentiation=self.params.differentiation)

        small = BanditExperiment(tiny, self.backend, dist=Dist())
        assert small._ranked == self._ranked
        small.measure(small.phase(small.initial_state(), time_left=None))

    def finished(self, state: BanditState, *, time_mode: bool) -> bool:
        return not time_mode and state.step >= self.params.steps_per_agent

    def phase(self, state: BanditState, *, time_left: float | None) -> BanditState:
        """One learning phase followed by a share (the timed unit of work).

        The numba path updates the state's arrays in place (only the arms agents
        pulled change), so a phase costs O(steps), not O(trials x arms); keep a copy
        if you need the state before it.
        """
        n_steps = self.plan.next_length(state.step, unbounded=time_left is not None)
        if self.backend.name == "torch":
            import torch  # defers torch

            rows = self._trial_block
            q, n = self._torch.phase(torch.as_tensor(state.q[rows], device=self._torch.device),
                                     torch.as_tensor(state.n[rows], device=self._torch.device),
                                     state.step, n_steps)
            self.backend.synchronize()
            q, n = q.cpu().numpy(), n.cpu().numpy()
            if self.layout == "trials":

                both = collectives.all_gather_axis(np.concatenate([q, n], axis=1), axis=0, dist=self.dist)
                q, n = both[:, :self.params.arms], both[:, self.params.arms:]
            return game.state_from_tables(q, n, state.step + n_steps, state.shares + 1)
        self._numba_phase(state, n_steps)
        return state._replace(step=state.step + n_steps, shares=state.shares + 1)

    def measure(self, state: BanditState) -> dict[str, float]:
        """Quality: the fraction of trials whose block estimate picks the best arm, and
        its standard error over trials."""

        correct = self.correctness(state)
        return {"quality": float(correct.mean()), **stats.error_metric("quality", correct)}

    def correctness(self, state: BanditState) -> np.ndarray:
        return game.block_correctness(state.q, self.means)

    def results(self, state: BanditState) -> dict[str, np.ndarray]:
        """Per trial: did the block estimate pick the best arm (1/c for a c-way tie)."""
        return {"correct": self.correctness(state)}

    def agent_steps(self, state: BanditState) -> int:
        """Agent-time steps per trial so far (Bell's x-axis)."""
        return state.step * self.params.agents

    def total_agent_steps(self, state: BanditState) -> int:
        return state.step * self.params.agents * self.params.trials

    def budget_agent_steps(self) -> int:
        return self.params.steps_per_agent * self.params.agents

    def progress(self, state: BanditState) -> int:
        return self.agent_steps(state)

    def check_finite(self, state: BanditState, *, phase: int) -> list[str]:
        """A trial whose shared table holds a non-finite value starts again from an
        empty table (its agents all hold the shared table, so the trial is the unit)."""
        bad = ~(np.isfinite(state.q).all(axis=1) & np.isfinite(state.n).all(axis=1))
        if not bad.any():
            return []
        state.q[bad] = 0.0
        state.n[bad] = 0.0
        top_arm, top_value, second_value = game.greedy_cache(state.q[bad])
        state.top_arm[bad], state.top_value[bad], state.second_value[bad] = top_arm, top_value, second_value
        return [f"phase {phase}: trial {t} had non-finite estimates; its shared table was reset"
                for t in np.flatnonzero(bad)]

    # -- numba path -------------------------------------------------------------

    def _numba_phase(self, state: BanditState, n_steps: int) -> None:
        from popplay.games.bandit import _numba as kernels  # defers numba

        p = self.params
        capacity = min(p.arms, n_steps)
        out_arm, out_pulls, out_rewards, out_used = self._touched_buffers(capacity)
        counters = kernels._mixed_counters(state.step, n_steps, game.WORDS_PER_STEP)
        # Rows of C-contiguous arrays: views the kernels update in place.
        rows = self._trial_block
        q, n, top_arm, top_value, second_value = (
            state.q[rows], state.n[rows], state.top_arm[rows], state.top_value[rows], state.second_value[rows])
        if self._ranked:
            kernels._rank_arms(q, self._order, self._rank, self._tie_top, self.backend.chunks(self.local_trials))
        kernels._learn_phase(
            q, n, top_arm, top_value, second_value, self._local_means, self._keys,
            self._static_keys, self._local["epsilons"], self._local["topk"], self._local["groups"],
            self.n_groups, p.bias_scale, self.use_bias, state.step * game.WORDS_PER_STEP, counters, n_steps,
            self.backend.chunks(self.local_trials * self.local_agents), out_arm, out_pulls, out_rewards, out_used,
            self._ranked, self._order, self._rank, self._tie_top, p.agents,
        )
        if self.layout == "agents" and self.dist.distributed:
            out_arm, out_pulls, out_rewards, out_used = self._gather_touched(
                out_arm, out_pulls, out_rewards, out_used, capacity)
        kernels._share(q, n, top_arm, top_value, second_value,
                       self.backend.chunks(self.local_trials), out_arm, out_pulls, out_rewards, out_used)
        if self.layout == "trials":
            self._gather_tables(state)

    def _gather_tables(self, state: BanditState) -> None:
        """Every rank's block of trials into ``state`` on every rank (one collective:
        the greedy cache's arm index travels as the bits of a float64, unchanged)."""

        rows, arms = self._trial_block, self.params.arms
        packed = np.concatenate([state.q[rows], state.n[rows], state.top_value[rows, None],
                                 state.second_value[rows, None], state.top_arm[rows, None].view(np.float64)], axis=1)
        whole = collectives.all_gather_axis(packed, axis=0, dist=self.dist)
        state.q[:] = whole[:, :arms]
        state.n[:] = whole[:, arms:2 * arms]
        state.top_value[:] = whole[:, 2 * arms]
        state.second_value[:] = whole[:, 2 * arms + 1]
        state.top_arm[:] = np.ascontiguousarray(whole[:, 2 * arms + 2]).view(np.int64)

    def _gather_touched(self, out_arm: np.ndarray, out_pulls: np.ndarray, out_rewards: np.ndarray,
                        out_used: np.ndarray, capacity: int) -> tuple[np.ndarray, ...]:
        """Every agent's touched arms, in agent order, on every rank: the share then
        visits them exactly as one process would (the order in which arms change
        decides the greedy cache on ties, so integer sums alone would not do)."""

        packed = np.concatenate([out_arm, out_pulls, out_rewards, out_used[:, :, None]], axis=2)
        whole = collectives.all_gather_axis(packed, axis=1, dist=self.dist)
        c = capacity
        return (np.ascontiguousarray(whole[:, :, :c]), np.ascontiguousarray(whole[:, :, c:2 * c]),
                np.ascontiguousarray(whole[:, :, 2 * c:3 * c]), np.ascontiguousarray(whole[:, :, 3 * c]))

    def _touched_buffers(self, capacity: int) -> tuple[np.ndarray, ...]:
        if capacity not in self._scratch:
            shape = (self.local_trials, self.local_agents, capacity)
            self._scratch = {capacity: (
                np.empty(shape, dtype=np.int64), np.empty(shape, dtype=np.int64),
                np.empty(shape, dtype=np.int64),
                np.empty(shape[:2], dtype=np.int64),
            )}
        return self._scratch[capacity]

    # -- run files --------------------------------------------------------------

    def state_arrays(self, state: BanditState) -> dict[str, Any]:
        return {"q": state.q, "n": state.n}

    def state_counters(self, state: BanditState) -> dict[str, int]:
        return {"step": state.step, "shares": state.shares}

    def restore(self, arrays: dict[str, np.ndarray], counters: dict[str, int]) -> BanditState:
        shape = (self.params.trials, self.params.arms)
        q = np.asarray(arrays["q"], dtype=np.float64)
        n = np.asarray(arrays["n"], dtype=np.float64)
        if q.shape != shape or n.shape != shape:
            raise ValueError(f"state arrays have shape {q.shape}/{n.shape}, expected {shape}")
        return game.state_from_tables(q, n, int(counters["step"]), int(counters["shares"]))

    def static_arrays(self) -> dict[str, np.ndarray]:
        return {
            "environment/means": self.means,
            "environment/best_arm": self.best_arm,
            "population/epsilon": self.epsilons,
            "population/topk": self.topk,
            "population/explore_group": self.groups,
        }

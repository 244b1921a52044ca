"""A cart-pole population experiment on either backend (what the runner drives).

With ``replicate_every`` = N > 0, every N-th phase ends with selective replication
with variation (Bell §3.4, on the tabular populations) *before* the share: within
each trial, the agents that failed least since the last selection are copied over
those that failed most, and the copies vary (Gaussian noise of std ``mutate_q`` on
every Q value of a copy; α, λ, ε times log-uniform factors in [1/``mutate_params``,
``mutate_params``], kept in [0, 1]). Quarantined agents (non-finite values after
learning) are never parents and are replaced first. Copies get new ids; the state's
:class:`popplay.operators.evolution.Lineage` records every copy, mutation, share, quarantine
and trial reset.

What a copy takes is what the fitness measured: the parent's α, λ, ε and the table
the parent *started* the phase with (the shared table plus its differentiation
bias). It keeps its own experience of the phase: its learned change of Q (added to
the inherited table), its sharing weights, traces, cart and pending action. Copying
the parent's learned table and weights instead (the obvious design) throws away the
experience of the agents that failed: failure is cart-pole's only reward, so the
share would lose exactly what it needs (measured in ``docs/cartpole.md``: 4,635 →
1,104 steps). Selecting before the share is the point: after it every agent of a
trial holds the same table again, so there would be nothing left to select.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import numba
import numpy as np

from popplay import stats
from popplay.core.backend import Backend, PhasePlan
from popplay.distributed import collectives
from popplay.distributed.collectives import population_shard
from popplay.distributed.group import Dist, current
from popplay.games.cartpole import _numba as kernels
from popplay.games.cartpole import rules as game
from popplay.games.cartpole.rules import (
    LINEAGE_PARAMETERS,
    STATE_ACTIONS,
    WORDS_PER_STEP,
    CartPolePopulationParams,
    CartPoleState,
)
from popplay.operators import evolution as evo
from popplay.operators import sharing as operators

_STATE_ARRAYS = ("q", "trace", "weight", "cart", "action", "shared", "alpha", "lam", "epsilon")
_VARIED = ("alpha", "lam", "epsilon")
_LINEAGE_PREFIX = "lineage_"
# What a rank of the trial layout holds for its own trials only (everything else in
# the state is small and whole on every rank: shared tables, α, λ, ε, ids, fitness,
# lineage).
_TRIAL_BLOCK = ("q", "trace", "weight", "cart", "action", "failures")


class CartPoleExperiment:
    """Learning phases of ``share_every`` steps per agent, each ending with a share
    (equations (5)–(8)) and, when ``bias > 0`` and there are at least two agents,
    differentiation ((9)–(10)); every ``replicate_every``-th phase selects and
    replicates just before its share (module docstring).

    The state between phases is :class:`CartPoleState`: every agent's Q table,
    traces, sharing weights, cart state, pending action and α, λ, ε, the shared
    table, the current max bias, the counters, and the ids, fitness, failure counts
    and lineage of selection. Quality (§2.5) is the greedy policy of the shared table
    tested from random starts: steps balanced, capped at ``test_steps``.
    """

    domain = "cartpole"

    def __init__(self, params: CartPolePopulationParams, backend: Backend, dist: Any = None) -> None:
        params.validate()
        self.params = params
        self.backend = backend
        p = params
        # Sharded over ranks, a process holds and learns either a contiguous block of
        # the trials (the trial layout, when the ranks divide the trials) or a
        # contiguous block of every trial's agents. Trials never share, so in the
        # trial layout a phase runs from learning to differentiation on the rank's
        # own tables, and only the shared tables travel after it (plus, for a
        # selection, every agent's failure count); its tables stay sharded, so a
        # rank's memory is its share of the population. In the agent layout the
        # learned blocks are gathered in agent order, and selection, sharing and
        # differentiation run on the whole population on every rank. Either way the
        # bits are those of one process.
        self.dist = current() if dist is None else dist
        self.layout, self._rows, self._mine = population_shard(p.trials, p.agents, self.dist)
        trials, agents = np.arange(p.trials)[self._rows], np.arange(p.agents)
        self._keys = game.learn_keys(p.seed, trials, agents)
        self._local_keys = np.ascontiguousarray(self._keys[:, self._mine])
        self._bias_keys = game.bias_keys(p.seed, trials, agents)
        self._test_keys = game.test_keys(p.seed, trials, np.arange(p.test_starts))
        # Saving the trial layout's state gathers the tables: every rank takes part.
        self.collective_save = self.layout == "trials"
        self._phys = p.physics().vector()
        self._bounds = p.bounds()
        # numba kernels take the constants as tuples: array arguments of the (not
        # always inlined) rule functions would cost reference counting every step.
        self._phys_tuple = tuple(float(v) for v in self._phys)
        self._bounds_tuple = tuple(float(v) for v in self._bounds)
        self.plan = PhasePlan(p.steps_per_agent, p.share_every)
        self._measured: tuple[Any, np.ndarray] | None = None
        self._torch = None
        if backend.name == "torch":
            from popplay.games.cartpole._torch import TorchCartPoleEngine  # defers torch

            self._torch = TorchCartPoleEngine(
                keys=self._local_keys, phys=self._phys, bounds=self._bounds, gamma=p.gamma,
                failure_reward=p.failure_reward, cutoff=p.trace_cutoff, start_range=p.start_range,
                accumulate=p.trace == "accumulating", watkins=p.algorithm == "q", device=backend.device,
                compile=backend.compile,
            )
            self._bias_keys_device = self._torch.tensor(self._bias_keys)
        else:
            population = (self._rows.stop - self._rows.start, self._mine.stop - self._mine.start)
            self._buffers = _Recycler(lambda: (
                np.empty(population + (STATE_ACTIONS,)), np.empty(population + (STATE_ACTIONS,)),
                np.empty(population + (STATE_ACTIONS,)), np.empty(population + (4,)),
                np.empty(population, dtype=np.int64), np.empty(population, dtype=np.int64)))

    # -- the runner's interface -------------------------------------------------

    def initial_state(self) -> CartPoleState:
        if self._torch is not None:
            self._torch.start_run()
        return self._to_backend(game.initial_state(self.params, self._keys))

    def warmup(self) -> None:
        """Compile (or load from numba's cache) the kernels on a tiny population."""
        if self.backend.name != "numba":
            return
        p = self.params
        tiny = CartPolePopulationParams(agents=2, trials=1, steps_per_agent=2, share_every=2, test_steps=2,
                                        algorithm=p.algorithm, trace=p.trace, bias=p.bias,
                                        replicate_every=1 if p.replicate_every else 0, mutate_q=p.mutate_q,
                                        mutate_params=p.mutate_params)

        small = CartPoleExperiment(tiny, self.backend, dist=Dist())
        small.measure(small.phase(small.initial_state(), time_left=None))

    def finished(self, state: CartPoleState, *, time_mode: bool) -> bool:
        return not time_mode and state.step >= self.params.steps_per_agent

    def phase(self, state: CartPoleState, *, time_left: float | None) -> CartPoleState:
        """One learning phase, then (every ``replicate_every`` phases) selection and
        replication, then the share and differentiation: the timed unit. The lineage
        log of ``state`` is appended to in place (it is append-only)."""
        p = self.params
        n_steps = self.plan.next_length(state.step, unbounded=time_left is not None)
        generation = state.shares + 1  # the share this phase ends with
        rows, trial_layout = self._rows, self.layout == "trials"
        if trial_layout:
            learner = state._replace(**{name: getattr(state, name)[rows] for name in _VARIED})
        elif self.dist.distributed:
            learner = state._replace(**{
                name: _contiguous(getattr(state, name)[:, self._mine])
                for name in ("q", "trace", "weight", "cart", "action", "alpha", "lam", "epsilon")})
        else:
            learner = state
        if self._torch is not None:
            q, e, w, cart, action, failed = self._torch.phase(learner.q, learner.trace, learner.weight, learner.cart,
                                                              learner.action, learner.alpha, learner.lam,
                                                              learner.epsilon, state.step, n_steps)
            keys = self._bias_keys_device
        else:
            q, e, w, cart, action, failed = self._numba_phase(learner, n_steps)
            keys = self._bias_keys
        if self.dist.distributed and not trial_layout:
            q, e, w, cart, action, failed = self._gather_learned(q, e, w, cart, action, failed)
        bad = self._quarantine(state, q, e, w, cart)
        failures = state.failures + _numpy(failed)
        replicating = bool(p.replicate_every) and generation % p.replicate_every == 0
        whole_failures = failures
        if trial_layout and replicating:  # selection ranks every agent of every trial
            whole_failures, bad_whole = self._gather_failures(failures, bad)
        elif trial_layout:
            bad_whole = None  # known after the share (its count travels with the shared tables)
        else:
            bad_whole = bad
        lineage = state.lineage
        if not trial_layout or replicating:
            self._pending_events = self._record_quarantine(state, generation, bad_whole)
        selection = state._replace(q=q, trace=e, weight=w, cart=cart, action=action, failures=failures)
        if replicating:
            eligible = np.ones(whole_failures.shape, dtype=bool) if bad_whole is None else ~bad_whole
            selection = self.replicate(selection._replace(failures=whole_failures), generation, eligible, state.q)
            selection = selection._replace(failures=np.zeros_like(failures))
        q, w = selection.q, selection.weight
        # The phase's outputs are this experiment's own arrays: share and bias in place.
        q, w = operators.share_weighted(q, w, p.initial_weight, out=(q, w))
        shared = q[:, 0, :].clone() if self._torch is not None else q[:, 0, :].copy()
        max_bias = state.max_bias
        if max_bias > 0.0 and p.agents > 1:  # differentiation is between agents
            q, max_bias = operators.differentiate(q, max_bias, keys, state.shares * STATE_ACTIONS, p.bias_decay,
                                                  out=q)
        if trial_layout:
            shared, bad_whole = self._gather_shared(shared, bad, gather_masks=not replicating)
            if not replicating:
                self._pending_events = self._record_quarantine(state, generation, bad_whole)
        lineage.record(generation, "share", np.full(p.trials, -1), groups=np.arange(p.trials))
        self.backend.synchronize()
        return selection._replace(q=q, weight=w, shared=shared, max_bias=max_bias, step=state.step + n_steps,
                                  shares=generation)

    def _gather_failures(self, failures: np.ndarray, bad: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """Trial layout, before a selection: every agent's failure count and
        quarantine mark, whole on every rank (one collective; the counts travel as the
        bits of float64)."""

        marks = np.zeros(failures.shape) if bad is None else _numpy(bad).astype(np.float64)
        packed = np.stack([np.ascontiguousarray(failures, dtype=np.int64).view(np.float64), marks], axis=-1)
        whole = collectives.all_gather_axis(packed, axis=0, dist=self.dist)
        failures = np.ascontiguousarray(whole[..., 0]).view(np.int64)
        bad_whole = whole[..., 1] != 0.0
        return failures, (bad_whole if bad_whole.any() else None)

    def _gather_shared(self, shared: Any, bad: Any, *, gather_masks: bool) -> tuple[Any, np.ndarray | None]:
        """Trial layout, after the share: every trial's shared table on every rank, with
        each trial's count of quarantined agents; their marks (rare) only when some
        rank has any and ``gather_masks``."""

        counts = np.zeros(shared.shape[0]) if bad is None else _numpy(bad).sum(axis=1).astype(np.float64)
        whole = collectives.all_gather_axis(_cat([shared, _like(shared, counts[:, None])]), axis=0, dist=self.dist)
        shared = _contiguous(whole[:, :STATE_ACTIONS])
        if not gather_masks or not bool((_numpy(whole[:, STATE_ACTIONS]) > 0).any()):
            return shared, None
        local = np.zeros(self._keys.shape, dtype=np.int64) if bad is None else _numpy(bad).astype(np.int64)
        return shared, collectives.all_gather_axis(local, axis=0, dist=self.dist) != 0

    def _record_quarantine(self, before: CartPoleState, generation: int, bad: np.ndarray | None) -> list[str]:
        """Record the agents (a whole-population mask) that :meth:`_quarantine` reset;
        return the events."""
        if bad is None:
            return []
        trials, slots = np.nonzero(bad)
        before.lineage.record(generation, "quarantine", before.agent_id[bad], groups=trials, slots=slots)
        return [f"step {before.step}: trial {t} agent {a} had non-finite values; it was reset to the last "
                "shared table and left out of the share" for t, a in zip(trials.tolist(), slots.tolist())]

    def _gather_learned(self, q: Any, e: Any, w: Any, cart: Any, action: Any, failed: Any) -> tuple[Any, ...]:
        """Every rank's learned block, in agent order, on every rank (two collectives:
        the float arrays packed into one, the integer ones into another)."""

        items = q.shape[-1]
        floats = collectives.all_gather_axis(_cat([q, e, w, cart]), axis=1, dist=self.dist)
        ints = collectives.all_gather_axis(_cat([action[..., None], failed[..., None]]), axis=1, dist=self.dist)
        pieces = (floats[..., :items], floats[..., items:2 * items], floats[..., 2 * items:3 * items],
                  floats[..., 3 * items:], ints[..., 0], ints[..., 1])
        return tuple(_contiguous(piece) for piece in pieces)

    # -- selective replication with variation -----------------------------------

    def fitness(self, failures: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        """What selection ranks by: minus the failures since the last selection (NaN
        for agents that may not be parents).

        Failures are the domain's own return (reward −1 per failure, 0 otherwise), so
        fewer failures over the same steps is a better policy, measured on the
        learning steps already taken: it costs nothing (a greedy test of every agent's
        own table would cost more agent-steps than the learning it ranks). They are
        summed since the last selection because an agent's α, λ, ε persist across
        shares (its table does not), so with ``replicate_every`` > 1 the count rests
        on more steps of the parameters that ``mutate_params`` varies.
        """
        return np.where(eligible, -failures.astype(np.float64), np.nan)

    def replicate(self, state: CartPoleState, generation: int, eligible: np.ndarray, start: Any) -> CartPoleState:
        """Within every trial, copy the fittest agents over the least fit and vary the
        copies; record it all at ``generation``.

        ``state.q`` holds the tables after learning and ``start`` (same shape and
        kind) those the phase started from. A child's table becomes
        ``q[child] + (start[parent] − start[child])``: the parent's starting table plus
        the child's own learned change. Acts in place on ``state.q`` (the phase's own
        output); returns a new state with new α, λ, ε, ids and fitness, and the failure
        counts restarted. Weights, traces, carts and actions stay the child's own.

        In the trial layout ``state.q`` and ``start`` are this rank's trials, while the
        failure counts, ``eligible``, α, λ, ε, ids and lineage are whole: every rank
        selects for every trial (the same ids, in the same order, as one process) and
        changes its own tables."""
        p = self.params
        fitness = self.fitness(state.failures, eligible)
        parents, children = evo.select_replacements(fitness, p.replicate_fraction, eligible)
        # A trial with no agent that may be a parent copies nothing (parents == children).
        copies = parents != children
        lead = (np.arange(p.trials)[:, None],)
        rows = self._rows
        own_parents, own_children, own_copies = parents[rows], children[rows], copies[rows]
        own_lead = (np.arange(own_parents.shape[0])[:, None],)
        alpha, lam, epsilon = (_numpy(getattr(state, name)) for name in _VARIED)
        ids, child_ids = state.lineage.replace(
            generation, state.agent_id, parents, children,
            values={name: values[lead + (parents,)] for name, values in zip(_VARIED, (alpha, lam, epsilon))})
        # Rows without copies (parents == children) inherit a difference of exactly 0.
        # A quarantined child has no learned change left (its table is the last shared
        # one) and may have started from non-finite values: it takes the parent's start.
        own_start = start[_index_like(start, own_lead + (own_children,))]
        mine = state.q[_index_like(start, own_lead + (own_children,))]
        quarantined = ~eligible[rows][own_lead + (own_children,)]
        if quarantined.any():
            mask = _like(start, quarantined)[..., None]
            own_start = _namespace(start).where(mask, mine, own_start)
        inherited = start[_index_like(start, own_lead + (own_parents,))] - own_start
        q = evo.add_at(state.q, own_children, inherited, out=state.q)
        alpha, lam, epsilon = (evo.replicate(getattr(state, name), parents, children) for name in _VARIED)
        if p.mutate_params > 1.0 or p.mutate_q > 0.0:
            factors = evo.vary_factors(p.seed, generation, child_ids, _VARIED, p.mutate_params)
            # α, λ and ε must stay where the parameters are valid: α is a step size of
            # at most 1 (as validated for the run), λ a decay and ε a probability.
            alpha, lam, epsilon = (
                evo.multiply_at(values, children, np.where(copies, factors[name], 1.0), low=0.0, high=1.0,
                                out=values)
                for name, values in zip(_VARIED, (alpha, lam, epsilon)))
            noise = evo.gaussian_noise(p.seed, generation, child_ids[rows], STATE_ACTIONS, p.mutate_q)
            q = evo.add_at(q, own_children, np.where(own_copies[..., None], noise, 0.0), out=q)
            state.lineage.record(
                generation, "mutation", child_ids[copies], parents=state.agent_id[lead + (parents,)][copies],
                groups=np.nonzero(copies)[0], slots=children[copies],
                values={**{name: _numpy(values)[lead + (children,)][copies]
                           for name, values in zip(_VARIED, (alpha, lam, epsilon))}, "noise": p.mutate_q})
        return state._replace(q=q, alpha=alpha, lam=lam, epsilon=epsilon, agent_id=ids,
                              fitness=fitness, failures=np.zeros_like(state.failures))

    def measure(self, state: CartPoleState) -> dict[str, float]:
        """§2.5: mean steps balanced by the shared greedy policy (the cap when it never
        fails) over trials and test starts, and the fraction of tests that never fail.
        With replication and ``mutate_params`` > 1 also the mean α, λ, ε over all
        agents (selection may drift them: show it live)."""
        p = self.params
        balanced = self.balanced_steps(state)
        # The standard error is over trials (independent populations; each trial's
        # test starts share its table).
        metrics = {"quality": float(balanced.mean()), **stats.error_metric("quality", balanced.mean(axis=1)),
                   "balanced": float((balanced == p.test_steps).mean())}
        if p.replicate_every and p.mutate_params > 1.0:
            for name in _VARIED:
                metrics[f"{name}_mean"] = float(_numpy(getattr(state, name)).mean())
        return metrics

    def balanced_steps(self, state: CartPoleState) -> np.ndarray:
        """Steps balanced by each trial's shared greedy policy from each test start,
        shaped (trials, test_starts); always tested on the CPU (the table is small)."""
        if self._measured is not None and self._measured[0] is state.shared:
            return self._measured[1]

        p = self.params
        out = np.empty(self._test_keys.shape, dtype=np.int64)
        kernels._greedy_test(np.ascontiguousarray(_numpy(state.shared[self._rows]), dtype=np.float64),
                             self._test_keys, self._phys_tuple, self._bounds_tuple, p.test_steps, p.start_range, out)
        if self.layout == "trials":  # each rank tests its own trials

            out = collectives.all_gather_axis(out, axis=0, dist=self.dist)
        self._measured = (state.shared, out)
        return out

    def results(self, state: CartPoleState) -> dict[str, np.ndarray]:
        """Per trial: mean steps balanced over the test starts."""
        return {"balanced_steps": self.balanced_steps(state).mean(axis=1)}

    def agent_steps(self, state: CartPoleState) -> int:
        """Agent-time steps per trial so far (Bell's x-axis)."""
        return state.step * self.params.agents

    def total_agent_steps(self, state: CartPoleState) -> int:
        return state.step * self.params.agents * self.params.trials

    def budget_agent_steps(self) -> int:
        return self.params.steps_per_agent * self.params.agents

    def progress(self, state: CartPoleState) -> int:
        """Agent-time steps per trial (the unit of --checkpoint-every and the budget)."""
        return self.agent_steps(state)

    def _quarantine(self, before: CartPoleState, q: Any, e: Any, w: Any, cart: Any) -> np.ndarray | None:
        """Agents whose learning produced a non-finite value are reset before the share
        and kept out of it (sharing weight 0), so no NaN is ever merged (nor copied:
        selection never picks them as parents). Returns the (trials, agents) mask of
        those agents in this rank's tables (None when there are none; see
        :meth:`_record_quarantine`). One pass over the tables when all is well."""
        xp = _namespace(q)
        # one question to the device (combined there), not one per table
        if bool(xp.isfinite(q).all() & xp.isfinite(w).all() & xp.isfinite(e).all() & xp.isfinite(cart).all()):
            return None
        bad = ~(xp.isfinite(q).all(-1) & xp.isfinite(w).all(-1) & xp.isfinite(e).all(-1)
                & xp.isfinite(cart).all(-1))
        shared = before.shared[self._rows]
        q[bad] = shared[_numpy(xp.nonzero(bad)[0])] if xp is np else shared[bad.nonzero(as_tuple=True)[0]]
        e[bad] = 0.0
        w[bad] = 0.0
        cart[bad] = 0.0
        return _numpy(bad)

    def check_finite(self, state: CartPoleState, *, phase: int) -> list[str]:
        """A trial whose tables, traces or carts hold a non-finite value starts again:
        Q, traces and the shared table 0, initial weights, carts at rest, the run's
        α, λ, ε, and new ids (recorded as resets: founders sharing nothing learned
        with the agents they replace), in place. The trial is the unit: its share has
        already mixed every agent's values. In the trial layout each rank checks its
        own trials and all learn which trials start again."""
        xp = _namespace(state.q)
        own = ~(xp.isfinite(state.q).all(-1).all(-1) & xp.isfinite(state.trace).all(-1).all(-1)
                & xp.isfinite(state.weight).all(-1).all(-1) & xp.isfinite(state.cart).all(-1).all(-1)
                & xp.isfinite(state.shared[self._rows]).all(-1))
        bad = _numpy(own)
        if self.layout == "trials":

            bad = collectives.all_gather_axis(bad.astype(np.int64), axis=0, dist=self.dist) != 0
        events, self._pending_events = getattr(self, "_pending_events", []), []
        if not bool(bad.any()):
            return events
        state.q[own] = 0.0
        state.trace[own] = 0.0
        state.weight[own] = self.params.initial_weight
        state.cart[own] = 0.0
        state.failures[_numpy(own)] = 0
        bad = _like(state.shared, bad)
        state.shared[bad] = 0.0
        p = self.params
        state.alpha[bad], state.lam[bad], state.epsilon[bad] = p.alpha, p.lam, p.epsilon
        self._measured = None
        trials = np.flatnonzero(_numpy(bad))
        old = state.agent_id[trials].copy()
        new = state.lineage.new_ids(old.size).reshape(old.shape)
        state.agent_id[trials] = new
        state.lineage.record(state.shares, "reset", new, replaced=old, groups=trials[:, None],
                             slots=np.arange(p.agents), values={"alpha": p.alpha, "lam": p.lam, "epsilon": p.epsilon})
        return events + [f"phase {phase}: trial {t} had non-finite values; its agents were reset" for t in trials]

    # -- numba path -------------------------------------------------------------

    def _numba_phase(self, state: CartPoleState, n_steps: int) -> tuple[Any, ...]:
        p = self.params
        q, e, w, cart, action, failures = self._buffers.take()
        mixed = kernels._mixed_counters(state.step + 1, n_steps, WORDS_PER_STEP)
        # Hand out chunks one at a time: a thread slowed by another process on its core
        # then does fewer chunks instead of holding up the whole phase.
        with numba.parallel_chunksize(1):
            kernels._learn_phase(
                state.q, state.trace, state.weight, state.cart, state.action, self._local_keys, mixed,
                self._phys_tuple, self._bounds_tuple, state.alpha, p.gamma, p.gamma * state.lam, state.epsilon,
                p.failure_reward, p.trace_cutoff, p.start_range, p.trace == "accumulating", p.algorithm == "q", n_steps,
                self.backend.chunks(q.shape[0] * q.shape[1]), q, e, w, cart, action, failures,
            )
        return q, e, w, cart, action, failures

    # -- run files --------------------------------------------------------------

    def _to_backend(self, state: CartPoleState) -> CartPoleState:
        if self._torch is None:
            return state
        t = self._torch.tensor
        return state._replace(**{name: t(getattr(state, name)) for name in _STATE_ARRAYS})

    def state_arrays(self, state: CartPoleState) -> dict[str, Any]:
        """The state as a run file stores it: no more than a resume needs.

        States are saved between phases, right after a share, where three of the
        per-agent tables are (nearly always) redundant, and at 1024 trials of 256 agents
        each table is 151 MB of float64:

        - ``q`` is the shared table plus each agent's differentiation bias, which the
          agents' bias streams give again: only trials where that does not hold (a
          trial reset after non-finite values) are stored, as ``q_trials`` (their
          indices) and ``q_rows``. The prediction is checked bit for bit here.
        - ``weight`` is ``initial_weight`` everywhere (equation (8)); stored only when
          it is not.
        - ``trace`` holds few distinct values (products of γλ): stored as the sorted
          distinct values ``trace_values`` and ``trace_codes``, an unsigned index
          into them per entry (mostly 0: dead traces), which compresses ~5× better.

        :meth:`restore` rebuilds the exact arrays (and still reads the full tables of
        files written before this layout).

        In the trial layout every rank must call this: the same arrays are assembled
        on rank 0 (the writer; other ranks get ``{}``) trial block by trial block,
        point to point, so that no rank but the writer ever holds more than its own
        tables, and the writer only the compact forms. Elsewhere the state is whole
        here and the collectives are the identity."""

        dist, rows = (self.dist, self._rows) if self.layout == "trials" else (Dist(), slice(None))
        counts = [_numpy(state.q).shape[0]] * dist.world_size
        arrays: dict[str, Any] = {name: _numpy(getattr(state, name))
                                  for name in ("shared", *_VARIED, "agent_id", "fitness")}
        for name, values in state.lineage.to_arrays().items():
            arrays[_LINEAGE_PREFIX + name] = values
        q = _numpy(state.q)
        predicted = self._predicted_q(np.asarray(arrays["shared"][rows], dtype=np.float64), state.shares)
        differs = ~(_same_bits(q, predicted).reshape(q.shape[0], -1).all(axis=1))
        del predicted
        everywhere = collectives.all_gather_axis(differs.astype(np.int64), axis=0, dist=dist).reshape(
            dist.world_size, -1)
        arrays["q_trials"] = np.flatnonzero(everywhere.reshape(-1)).astype(np.int64)
        arrays["q_rows"] = collectives.gather_rows(np.ascontiguousarray(q[differs]), everywhere.sum(axis=1),
                                                   dist=dist)
        weight = _numpy(state.weight)
        if collectives.any_flag(not (weight == self.params.initial_weight).all(), dist):
            arrays["weight"] = collectives.gather_rows(weight, counts, dist=dist)
        trace_bits = np.ascontiguousarray(_numpy(state.trace), dtype=np.float64).view(np.int64)
        distinct = np.unique(collectives.all_gather_ragged(np.unique(trace_bits[trace_bits != 0]), dist))
        for name, values in _encode_values(trace_bits.view(np.float64), "trace", distinct).items():
            arrays[name] = collectives.gather_rows(values, counts, dist=dist) if values.ndim > 1 else values
        for name in ("cart", "action", "failures"):
            arrays[name] = collectives.gather_rows(_numpy(getattr(state, name)), counts, dist=dist)
        return arrays if dist.is_writer else {}

    def _predicted_q(self, shared: np.ndarray, shares: int) -> np.ndarray:
        """Every agent's Q right after share number ``shares``: the shared table plus
        the bias that share's differentiation drew (:meth:`phase`), replayed with the
        same float operations, so the same bits."""
        p = self.params
        q = np.repeat(shared[:, None, :], p.agents, axis=1)
        max_bias = float(p.bias)
        for _ in range(shares - 1):  # the decay of every earlier share, as phase applies it
            if not (max_bias > 0.0 and p.agents > 1):
                break
            decayed = max_bias / p.bias_decay
            if decayed == max_bias:  # a fixed point (0, inf, a decay of 1): the rest change nothing
                break
            max_bias = decayed
        if shares > 0 and max_bias > 0.0 and p.agents > 1:
            q, _ = operators.differentiate(q, max_bias, self._bias_keys, (shares - 1) * STATE_ACTIONS,
                                           p.bias_decay, out=q)
        return q

    def state_counters(self, state: CartPoleState) -> dict[str, Any]:
        return {"step": state.step, "shares": state.shares, "max_bias": state.max_bias}

    def restore(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> CartPoleState:
        """Rebuild a state from :meth:`state_arrays`/:meth:`state_counters`; every shape
        and range is checked. Run files written before selective replication existed
        (no α, λ, ε, ids or lineage) continue as they would have: the run's α, λ, ε and
        every agent a founder."""
        p = self.params
        population = (p.trials, p.agents)
        own = (self._rows.stop - self._rows.start, p.agents)  # the whole population but in the trial layout
        self._check_values(arrays)
        if self.layout == "trials":
            arrays = self._own_trials(arrays)
        arrays = self._unpacked(arrays, int(counters["shares"]))
        shapes = {"q": own + (STATE_ACTIONS,), "trace": own + (STATE_ACTIONS,),
                  "weight": own + (STATE_ACTIONS,), "cart": own + (4,), "action": own,
                  "shared": (p.trials, STATE_ACTIONS)}
        optional = {"alpha": np.full(population, float(p.alpha)), "lam": np.full(population, float(p.lam)),
                    "epsilon": np.full(population, float(p.epsilon)), "agent_id": evo.initial_ids(population),
                    "fitness": np.full(population, np.nan), "failures": np.zeros(own, dtype=np.int64)}
        integer = ("action", "agent_id", "failures")
        loaded = {}
        for name, shape in {**shapes, **{name: np.shape(value) for name, value in optional.items()}}.items():
            if name not in arrays and name not in optional:
                raise ValueError(f"state array {name!r} is missing")
            dtype = np.int64 if name in integer else np.float64
            array = np.array(arrays[name] if name in arrays else optional[name], dtype=dtype, order="C")
            if array.shape != shape:
                raise ValueError(f"state array {name!r} has shape {array.shape}, expected {shape}")
            loaded[name] = array
        for name, low in (("alpha", 0.0), ("lam", 0.0), ("epsilon", 0.0)):
            values = loaded[name]
            if not ((values >= low) & (values <= 1.0)).all() or (name == "alpha" and not (values > 0.0).all()):
                raise ValueError(f"state array {name!r} holds values outside its range")
        max_bias = float(counters["max_bias"])
        if not (max_bias >= 0.0 and np.isfinite(max_bias)):
            raise ValueError(f"max_bias must be non-negative and finite (got {max_bias!r})")
        columns = {name[len(_LINEAGE_PREFIX):]: value for name, value in arrays.items()
                   if name.startswith(_LINEAGE_PREFIX)}
        ids = loaded["agent_id"]
        if columns:
            lineage = evo.Lineage.from_arrays(columns, LINEAGE_PARAMETERS)
            if ids.min() < 0 or ids.max() >= lineage.next_id:
                raise ValueError("state agent_id holds ids the lineage never handed out")
        else:
            lineage = evo.Lineage.start(ids, LINEAGE_PARAMETERS, {name: loaded[name] for name in _VARIED})
        if len(np.unique(ids)) != ids.size:
            raise ValueError("state agent_id holds an id twice")
        state = CartPoleState(**{name: loaded[name] for name in shapes}, max_bias=max_bias,
                              step=int(counters["step"]), shares=int(counters["shares"]),
                              **{name: loaded[name] for name in optional}, lineage=lineage)
        return self._to_backend(state)

    def _check_values(self, arrays: dict[str, Any]) -> None:
        """The values of a run file's state arrays that per-trial code relies on, checked
        on the whole arrays before anything is cut to a rank's trials: every rank then
        reaches the same verdict on a damaged file (a rank that refused alone would
        leave the others waiting for it). Shapes are checked where the arrays are used."""
        if "action" in arrays and not np.isin(np.asarray(arrays["action"], dtype=np.int64), (0, 1)).all():
            raise ValueError("state array 'action' holds values other than 0 and 1")
        if "failures" in arrays and (np.asarray(arrays["failures"], dtype=np.int64) < 0).any():
            raise ValueError("state array 'failures' holds negative counts")
        if "q_trials" in arrays:
            trials = np.asarray(arrays["q_trials"])
            if trials.ndim != 1 or trials.dtype.kind not in "iu" or len(np.unique(trials)) != trials.size \
                    or (trials.size and not (0 <= trials.min() and trials.max() < self.params.trials)):
                raise ValueError("state array 'q_trials' must hold distinct trial indices")
        if "trace" not in arrays and "trace_codes" in arrays:
            table = arrays.get("trace_values")
            if table is None:
                raise ValueError("state array 'trace_values' is missing")
            codes, table = np.asarray(arrays["trace_codes"]), np.asarray(table, dtype=np.float64)
            if codes.dtype.kind != "u" or table.ndim != 1 or table.size == 0 or \
                    (codes.size and int(codes.max()) >= table.size):
                raise ValueError("state array 'trace_codes' holds codes outside 'trace_values'")

    def _own_trials(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """A run file's state arrays (values checked by :meth:`_check_values`) cut down
        to this rank's trials (trial layout): the per-agent tables, carts, actions and
        failure counts (full or compact)."""
        p, rows = self.params, self._rows
        arrays = dict(arrays)
        for name in (*_TRIAL_BLOCK, "trace_codes"):
            if name in arrays:
                values = np.asarray(arrays[name])
                if values.ndim < 2 or values.shape[0] != p.trials:
                    raise ValueError(f"state array {name!r} has shape {values.shape}, expected {p.trials} trials "
                                     "first")
                arrays[name] = values[rows]
        if "q_trials" in arrays:
            trials, stored = np.asarray(arrays["q_trials"]), arrays.get("q_rows")
            if stored is None or np.asarray(stored).shape[:1] != trials.shape:
                raise ValueError("state arrays 'q_trials' and 'q_rows' do not match")
            keep = (trials >= rows.start) & (trials < rows.stop)
            arrays["q_trials"], arrays["q_rows"] = trials[keep] - rows.start, np.asarray(stored)[keep]
        return arrays

    def _unpacked(self, arrays: dict[str, np.ndarray], shares: int) -> dict[str, np.ndarray]:
        """The full tables from :meth:`state_arrays`' compact layout (arrays already
        full, as in older files, pass through); shapes and codes are checked. In the
        trial layout ``arrays`` hold this rank's trials (:meth:`_own_trials`)."""
        p = self.params
        arrays = dict(arrays)
        population = (self._rows.stop - self._rows.start, p.agents)
        table = population + (STATE_ACTIONS,)
        if "trace" not in arrays and "trace_codes" in arrays:
            arrays["trace"] = _decode_values(arrays.pop("trace_codes"), arrays.pop("trace_values", None), "trace",
                                             table)
            if (arrays["trace"] < 0.0).any():
                raise ValueError("state array 'trace_values' holds negative traces")
        if "weight" not in arrays and "q" not in arrays:
            arrays["weight"] = np.full(table, float(p.initial_weight))
        if "q" not in arrays and "q_trials" in arrays:
            shared = np.asarray(arrays.get("shared"), dtype=np.float64)
            if shared.shape != (p.trials, STATE_ACTIONS):
                raise ValueError(f"state array 'shared' has shape {shared.shape}, expected "
                                 f"{(p.trials, STATE_ACTIONS)}")
            if shares < 0:
                raise ValueError(f"shares must be non-negative (got {shares})")
            trials = np.asarray(arrays.pop("q_trials"))
            rows = np.asarray(arrays.pop("q_rows", None), dtype=np.float64)
            if rows.shape != (trials.size,) + table[1:]:
                raise ValueError(f"state array 'q_rows' has shape {rows.shape}, expected "
                                 f"{(trials.size,) + table[1:]}")
            q = self._predicted_q(shared[self._rows], shares)
            q[trials] = rows
            arrays["q"] = q
        return arrays

    def static_arrays(self) -> dict[str, np.ndarray]:
        return {"environment/physics": self._phys, "environment/box_bounds": self._bounds}


class _Recycler:
    """Output arrays of numba phases, reused once nothing else refers to them.

    A fresh multi-megabyte array costs a page fault per 4 KiB page when first written
    (several microseconds each in a virtual machine): more than the learning itself
    for short phases. A set of arrays is handed out again only when this pool holds
    the sole references, so a state that anybody still keeps is never overwritten.
    """

    _KEEP = 4  # sets kept for reuse; more busy sets than this are not pooled

    def __init__(self, make: Callable[[], tuple[np.ndarray, ...]]) -> None:
        self._make = make
        self._sets: list[tuple[np.ndarray, ...]] = []
        probe = [(np.empty(1),)]
        self._free = self._references(probe[0])

    @staticmethod
    def _references(arrays: tuple[np.ndarray, ...]) -> int:
        return max(sys.getrefcount(a) for a in arrays)

    def take(self) -> tuple[np.ndarray, ...]:
        for arrays in self._sets:
            if self._references(arrays) <= self._free:
                return arrays
        arrays = self._make()
        if len(self._sets) < self._KEEP:
            self._sets.append(arrays)
        return arrays


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: the same float64 bits (so -0.0 differs from 0.0 and a NaN can match)."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64) == \
        np.ascontiguousarray(b, dtype=np.float64).view(np.int64)


def _encode_values(values: np.ndarray, name: str, distinct: np.ndarray) -> dict[str, np.ndarray]:
    """``values`` as the sorted distinct values (0 first: the most common) and the
    smallest unsigned code per entry; exact for every float64 bit pattern.
    ``distinct`` (the sorted nonzero bit patterns, as int64) may name a larger set
    than ``values`` holds: a block of trials then takes the whole population's codes."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    nonzero = bits != 0
    table = np.concatenate([np.zeros(1, dtype=np.int64), distinct])
    dtype = np.uint8 if table.size <= 2**8 else np.uint16 if table.size <= 2**16 else np.uint32
    codes = np.zeros(bits.shape, dtype=dtype)
    codes[nonzero] = (np.searchsorted(distinct, bits[nonzero]) + 1).astype(dtype)
    return {f"{name}_codes": codes, f"{name}_values": table.view(np.float64)}


def _decode_values(codes: Any, table: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The values :func:`_encode_values` encoded (codes and table already checked by
    :meth:`CartPoleExperiment._check_values`)."""
    codes, table = np.asarray(codes), np.asarray(table, dtype=np.float64)
    if codes.shape != shape:
        raise ValueError(f"state array {name + '_codes'!r} has shape {codes.shape}, expected {shape}")
    return table[codes]


def _like(array: Any, values: np.ndarray) -> Any:
    """A NumPy array as the kind of ``array`` (a tensor on its device for torch)."""
    if type(array).__module__.startswith("torch"):
        import torch  # defers torch

        return torch.as_tensor(np.ascontiguousarray(values), device=array.device)
    return values


def _index_like(array: Any, index: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
    """NumPy index arrays as the array's own kind (torch tensors index with tensors)."""
    if type(array).__module__.startswith("torch"):
        import torch  # defers torch

        return tuple(torch.as_tensor(np.ascontiguousarray(i), device=array.device) for i in index)
    return index


def _contiguous(x: Any) -> Any:
    if type(x).__module__.startswith("torch"):
        return x.contiguous()
    return np.ascontiguousarray(x)


def _cat(parts: list[Any]) -> Any:
    """Arrays of one kind (NumPy or torch) joined along the last axis."""
    xp = _namespace(parts[0])
    return xp.concatenate(parts, axis=-1) if xp is np else xp.cat(parts, dim=-1)


def _namespace(x: Any) -> Any:
    if type(x).__module__.startswith("torch"):
        import torch  # defers torch

        return torch
    return np


def _numpy(x: Any) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)

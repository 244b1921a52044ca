"""A cart-pole population experiment on either backend (what the runner drives)."""
from __future__ import annotations

import sys
from typing import Any, Callable

import numba
import numpy as np

from popplay import operators
from popplay.games import cartpole as game
from popplay.games.cartpole import STATE_ACTIONS, WORDS_PER_STEP, CartPolePopulationParams, CartPoleState
from popplay.populations.base import Backend, PhasePlan

_STATE_ARRAYS = ("q", "trace", "weight", "cart", "action", "shared")


class CartPoleExperiment:
    """Learning phases of ``share_every`` steps per agent, each ending with a share
    (equations (5)–(8)) and, when ``bias > 0`` and there are at least two agents,
    differentiation ((9)–(10)).

    The state between phases is :class:`CartPoleState`: every agent's Q table,
    traces, sharing weights, cart state and pending action, the shared table, the
    current max bias and the counters. Quality (§2.5) is the greedy policy of the
    shared table tested from random starts: steps balanced, capped at ``test_steps``.
    """

    domain = "cartpole"

    def __init__(self, params: CartPolePopulationParams, backend: Backend) -> None:
        params.validate()
        self.params = params
        self.backend = backend
        p = params
        trials, agents = np.arange(p.trials), np.arange(p.agents)
        self._keys = game.learn_keys(p.seed, trials, agents)
        self._bias_keys = game.bias_keys(p.seed, trials, agents)
        self._test_keys = game.test_keys(p.seed, trials, np.arange(p.test_starts))
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
            from popplay.games._cartpole_torch import TorchCartPoleEngine

            self._torch = TorchCartPoleEngine(
                keys=self._keys, phys=self._phys, bounds=self._bounds, alpha=p.alpha, gamma=p.gamma,
                lam=p.lam, epsilon=p.epsilon, failure_reward=p.failure_reward, cutoff=p.trace_cutoff,
                start_range=p.start_range, accumulate=p.trace == "accumulating", watkins=p.algorithm == "q",
                device=backend.device,
            )
            self._bias_keys_device = self._torch.tensor(self._bias_keys)
        else:
            population = (p.trials, p.agents)
            self._buffers = _Recycler(lambda: (
                np.empty(population + (STATE_ACTIONS,)), np.empty(population + (STATE_ACTIONS,)),
                np.empty(population + (STATE_ACTIONS,)), np.empty(population + (4,)),
                np.empty(population, dtype=np.int64), np.empty(population, dtype=np.int64)))

    # -- the runner's interface -------------------------------------------------

    def initial_state(self) -> CartPoleState:
        return self._to_backend(game.initial_state(self.params, self._keys))

    def warmup(self) -> None:
        """Compile (or load from numba's cache) the kernels on a tiny population."""
        if self.backend.name != "numba":
            return
        p = self.params
        tiny = CartPolePopulationParams(agents=2, trials=1, steps_per_agent=2, share_every=2, test_steps=2,
                                        algorithm=p.algorithm, trace=p.trace, bias=p.bias)
        small = CartPoleExperiment(tiny, self.backend)
        small.measure(small.phase(small.initial_state(), time_left=None))

    def finished(self, state: CartPoleState, *, time_mode: bool) -> bool:
        return not time_mode and state.step >= self.params.steps_per_agent

    def phase(self, state: CartPoleState, *, time_left: float | None) -> CartPoleState:
        """One learning phase, then the share and differentiation (the timed unit)."""
        p = self.params
        n_steps = self.plan.next_length(state.step, unbounded=time_left is not None)
        if self._torch is not None:
            q, e, w, cart, action, _ = self._torch.phase(state.q, state.trace, state.weight, state.cart,
                                                         state.action, state.step, n_steps)
            keys = self._bias_keys_device
        else:
            q, e, w, cart, action, _ = self._numba_phase(state, n_steps)
            keys = self._bias_keys
        self._pending_events = self._quarantine(state, q, e, w, cart)
        # The phase's outputs are this experiment's own arrays: share and bias in place.
        q, w = operators.share_weighted(q, w, p.initial_weight, out=(q, w))
        shared = q[:, 0, :].clone() if self._torch is not None else q[:, 0, :].copy()
        max_bias = state.max_bias
        if max_bias > 0.0 and p.agents > 1:  # differentiation is between agents
            q, max_bias = operators.differentiate(q, max_bias, keys, state.shares * STATE_ACTIONS, p.bias_decay,
                                                  out=q)
        self.backend.synchronize()
        return CartPoleState(q, e, w, cart, action, shared, max_bias, state.step + n_steps, state.shares + 1)

    def measure(self, state: CartPoleState) -> dict[str, float]:
        """§2.5: mean steps balanced by the shared greedy policy (the cap when it never
        fails) over trials and test starts, and the fraction of tests that never fail."""
        balanced = self.balanced_steps(state)
        return {"quality": float(balanced.mean()), "balanced": float((balanced == self.params.test_steps).mean())}

    def balanced_steps(self, state: CartPoleState) -> np.ndarray:
        """Steps balanced by each trial's shared greedy policy from each test start,
        shaped (trials, test_starts); always tested on the CPU (the table is small)."""
        if self._measured is not None and self._measured[0] is state.shared:
            return self._measured[1]
        from popplay.games import _cartpole_numba as kernels

        p = self.params
        out = np.empty(self._test_keys.shape, dtype=np.int64)
        kernels._greedy_test(np.ascontiguousarray(_numpy(state.shared), dtype=np.float64), self._test_keys,
                             self._phys_tuple, self._bounds_tuple, p.test_steps, p.start_range, out)
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

    def _quarantine(self, before: CartPoleState, q: Any, e: Any, w: Any, cart: Any) -> list[str]:
        """Agents whose learning produced a non-finite value are reset before the share
        and kept out of it (sharing weight 0), so no NaN is ever merged. One pass over
        the tables when all is well."""
        xp = _namespace(q)
        if bool(xp.isfinite(q).all()) and bool(xp.isfinite(w).all()) and bool(xp.isfinite(e).all()) \
                and bool(xp.isfinite(cart).all()):
            return []
        bad = ~(xp.isfinite(q).all(-1) & xp.isfinite(w).all(-1) & xp.isfinite(e).all(-1)
                & xp.isfinite(cart).all(-1))
        trials, agents = (_numpy(index) for index in xp.nonzero(bad)) if xp is np else \
            (_numpy(index) for index in bad.nonzero(as_tuple=True))
        q[bad] = before.shared[trials] if xp is np else before.shared[bad.nonzero(as_tuple=True)[0]]
        e[bad] = 0.0
        w[bad] = 0.0
        cart[bad] = 0.0
        return [f"step {before.step}: trial {t} agent {a} had non-finite values; it was reset to the last "
                "shared table and left out of the share" for t, a in zip(trials.tolist(), agents.tolist())]

    def check_finite(self, state: CartPoleState, *, phase: int) -> list[str]:
        """A trial whose tables, traces or carts hold a non-finite value starts again:
        Q, traces and the shared table 0, initial weights, carts at rest (in place).
        The trial is the unit: its share has already mixed every agent's values."""
        xp = _namespace(state.q)
        bad = ~(xp.isfinite(state.q).all(-1).all(-1) & xp.isfinite(state.trace).all(-1).all(-1)
                & xp.isfinite(state.weight).all(-1).all(-1) & xp.isfinite(state.cart).all(-1).all(-1)
                & xp.isfinite(state.shared).all(-1))
        events, self._pending_events = getattr(self, "_pending_events", []), []
        if not bool(bad.any()):
            return events
        state.q[bad] = 0.0
        state.trace[bad] = 0.0
        state.weight[bad] = self.params.initial_weight
        state.cart[bad] = 0.0
        state.shared[bad] = 0.0
        self._measured = None
        trials = np.flatnonzero(_numpy(bad))
        return events + [f"phase {phase}: trial {t} had non-finite values; its agents were reset" for t in trials]

    # -- numba path -------------------------------------------------------------

    def _numba_phase(self, state: CartPoleState, n_steps: int) -> tuple[Any, ...]:
        from popplay.games import _cartpole_numba as kernels

        p = self.params
        q, e, w, cart, action, failures = self._buffers.take()
        mixed = kernels._mixed_counters(state.step + 1, n_steps, WORDS_PER_STEP)
        # Hand out chunks one at a time: a thread slowed by another process on its core
        # then does fewer chunks instead of holding up the whole phase.
        with numba.parallel_chunksize(1):
            kernels._learn_phase(
                state.q, state.trace, state.weight, state.cart, state.action, self._keys, mixed, self._phys_tuple,
                self._bounds_tuple, p.alpha, p.gamma, p.gamma * p.lam, p.epsilon, p.failure_reward, p.trace_cutoff,
                p.start_range, p.trace == "accumulating", p.algorithm == "q", n_steps,
                self.backend.chunks(p.trials * p.agents), q, e, w, cart, action, failures,
            )
        return q, e, w, cart, action, failures

    # -- run files --------------------------------------------------------------

    def _to_backend(self, state: CartPoleState) -> CartPoleState:
        if self._torch is None:
            return state
        t = self._torch.tensor
        return state._replace(q=t(state.q), trace=t(state.trace), weight=t(state.weight), cart=t(state.cart),
                              action=t(state.action), shared=t(state.shared))

    def state_arrays(self, state: CartPoleState) -> dict[str, Any]:
        return {name: _numpy(getattr(state, name)) for name in _STATE_ARRAYS}

    def state_counters(self, state: CartPoleState) -> dict[str, Any]:
        return {"step": state.step, "shares": state.shares, "max_bias": state.max_bias}

    def restore(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> CartPoleState:
        p = self.params
        population = (p.trials, p.agents)
        shapes = {"q": population + (STATE_ACTIONS,), "trace": population + (STATE_ACTIONS,),
                  "weight": population + (STATE_ACTIONS,), "cart": population + (4,), "action": population,
                  "shared": (p.trials, STATE_ACTIONS)}
        loaded = {}
        for name, shape in shapes.items():
            if name not in arrays:
                raise ValueError(f"state array {name!r} is missing")
            dtype = np.int64 if name == "action" else np.float64
            array = np.ascontiguousarray(arrays[name], dtype=dtype)
            if array.shape != shape:
                raise ValueError(f"state array {name!r} has shape {array.shape}, expected {shape}")
            loaded[name] = array
        if not np.isin(loaded["action"], (0, 1)).all():
            raise ValueError("state array 'action' holds values other than 0 and 1")
        max_bias = float(counters["max_bias"])
        if not (max_bias >= 0.0 and np.isfinite(max_bias)):
            raise ValueError(f"max_bias must be non-negative and finite (got {max_bias!r})")
        state = CartPoleState(**loaded, max_bias=max_bias, step=int(counters["step"]),
                              shares=int(counters["shares"]))
        return self._to_backend(state)

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


def _namespace(x: Any) -> Any:
    if type(x).__module__.startswith("torch"):
        import torch

        return torch
    return np


def _numpy(x: Any) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)

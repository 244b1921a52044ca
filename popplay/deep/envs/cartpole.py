"""popplay's cart-pole physics (:mod:`popplay.games.cartpole.rules`) as gymnasium environments.

``popplay/CartPole-v1`` is a drop-in for gymnasium's ``CartPole-v1``: frictionless
(both friction coefficients 0), force ±10 N, τ = 0.02 s, failure beyond ±2.4 m or ±12°,
reward 1 for every step including the failing one, starts uniform in ±0.05 drawn from
the environment's ``np_random`` exactly as gymnasium draws them, 500 steps at most.
The dynamics are :func:`popplay.games.cartpole.rules.make_rules`'s (our own sin/cos), which
agree with gymnasium's to rounding; ``tests/test_deep_envs.py`` checks that step by step.

:class:`CartPoleVectorEnv` steps N copies in one numba loop and resets a finished copy
in the same step (gymnasium's ``AutoresetMode.SAME_STEP``: the last observation of the
finished episode is in ``info["final_obs"]``).
"""
from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from popplay.games.cartpole.rules import CartPoleParams

PHYSICS = CartPoleParams(cart_friction=0.0, pole_friction=0.0)
MAX_EPISODE_STEPS = 500
_START = 0.05


def _loaded(kernel: Any, *no_rows: Any) -> Any:
    """``kernel`` with its compiled code loaded now, by a call on ``no_rows`` (arrays of no
    rows): the first real call would otherwise pay it (about 0.3 s from the cache),
    inside a run's timed learning."""
    kernel(*no_rows)
    return kernel


def _observation_space() -> spaces.Box:
    # Twice the failure limits, as gymnasium does, so a failing observation stays inside.
    high = np.array([PHYSICS.track_limit * 2, np.inf, PHYSICS.angle_limit * 2, np.inf], dtype=np.float32)
    return spaces.Box(-high, high, dtype=np.float32)


class CartPoleEnv(gymnasium.Env):
    """One cart-pole (the TimeLimit wrapper from the registration adds the 500-step cut)."""

    metadata: dict[str, Any] = {"render_modes": [], "render_fps": 50}

    def __init__(self, render_mode: str | None = None) -> None:
        from popplay.deep.envs._cartpole_numba import step_many  # defers numba

        self._phys = PHYSICS.vector()
        self._step_many = _loaded(step_many, np.zeros((0, 4)), np.zeros(0, dtype=np.int64), self._phys,
                                  np.zeros(0, dtype=np.bool_))
        self.action_space = spaces.Discrete(2)
        self.observation_space = _observation_space()
        self._state = np.zeros((1, 4), dtype=np.float64)
        self._action = np.zeros(1, dtype=np.int64)
        self._failed = np.zeros(1, dtype=np.bool_)
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._state[0] = self.np_random.uniform(low=-_START, high=_START, size=(4,))
        self._done = False
        return self._state[0].astype(np.float32), {}

    @classmethod
    def batched(cls, count: int, max_episode_steps: int | None) -> "CartPoleBatch":
        """``count`` copies stepped in one numba loop, for a deep population's members
        (:class:`popplay.deep.envs.members.MemberEnvs`): the observations, rewards and
        ends this environment gives inside its registered time limit."""
        return CartPoleBatch(count, max_episode_steps)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("call reset() before step() (the episode has ended)")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0 or 1 (got {action!r})")
        self._action[0] = int(action)
        self._step_many(self._state, self._action, self._phys, self._failed)
        terminated = bool(self._failed[0])
        self._done = terminated
        return self._state[0].astype(np.float32), 1.0, terminated, False, {}


class CartPoleBatch:
    """Copies of :class:`CartPoleEnv` (with its time limit) as arrays: ``reset`` copies,
    each with its seed, drawing as ``CartPoleEnv.reset(seed=...)`` draws; ``step`` every
    copy (or the ``rows`` given) at once. A copy whose episode ended is reset by the
    caller before it steps again."""

    def __init__(self, count: int, max_episode_steps: int | None) -> None:
        from popplay.deep.envs._cartpole_numba import reset_rows, step_all  # defers numba

        self._phys = PHYSICS.vector()
        self._step_all = _loaded(step_all, np.zeros((0, 4)), np.zeros(0, dtype=np.int64), self._phys,
                                 np.zeros(0, dtype=np.int64), -1, np.zeros((0, 4), dtype=np.float32),
                                 np.zeros(0, dtype=np.bool_), np.zeros(0, dtype=np.bool_))
        self._reset_rows = _loaded(reset_rows, np.zeros((0, 4)), np.zeros(0, dtype=np.int64),
                                   np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), -_START, _START,
                                   np.zeros((0, 4), dtype=np.float32))
        self.limit = max_episode_steps
        self.state = np.zeros((count, 4), dtype=np.float64)
        self.steps = np.zeros(count, dtype=np.int64)

    def reset(self, rows: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        """Restart copies ``rows`` with ``seeds`` (one each, in [0, 2^32)); their first
        observations (len(rows), 4). The start is ``gymnasium.utils.seeding.np_random(seed)``'s
        ``uniform(±0.05, size=4)``, drawn in numba (:mod:`._numpy_streams`): the same bits
        without building NumPy's three generator objects per seed (about 10 µs each
        time, and a population resets a few copies at every step). Rows run from 0 to
        the copy count less one."""
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        seeds = np.ascontiguousarray(seeds, dtype=np.int64).reshape(-1)
        starts = np.empty((len(rows), 4), dtype=np.float32)
        if seeds.shape != rows.shape or not self._reset_rows(self.state, self.steps, rows, seeds, -_START, _START,
                                                             starts):
            raise ValueError(f"one seed in [0, 2^32) per row in [0, {len(self.state)}) expected")
        return starts

    def step(self, actions: np.ndarray, rows: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        actions = np.asarray(actions, dtype=np.int64).reshape(-1)
        # one loop for the step and what it returns (a population steps its copies every
        # env-step): with a dozen small NumPy passes around the physics, a step of 64
        # copies took 16 against 7 us
        state, steps = (self.state, self.steps) if rows is None else (self.state[rows], self.steps[rows])
        count = len(state)
        if len(actions) != count:
            raise ValueError(f"one action per copy expected ({count}, got {len(actions)})")
        successors, failed = np.empty((count, 4), dtype=np.float32), np.empty(count, dtype=np.bool_)
        truncated = np.empty(count, dtype=np.bool_)
        if not self._step_all(state, actions, self._phys, steps, -1 if self.limit is None else self.limit,
                              successors, failed, truncated):
            raise ValueError("actions must be 0 or 1")
        if rows is not None:  # the rows were stepped in copies
            self.state[rows], self.steps[rows] = state, steps
        return successors, np.ones(count, dtype=np.float32), failed, truncated


class CartPoleVectorEnv(VectorEnv):
    """N cart-poles stepped together; finished copies restart in the same step."""

    metadata: dict[str, Any] = {"render_modes": [], "render_fps": 50,
                                "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 1, max_episode_steps: int = MAX_EPISODE_STEPS,
                 render_mode: str | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1 (got {num_envs})")
        self._batch = CartPoleBatch(num_envs, max_episode_steps)  # the copies' arrays and steps
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.render_mode = render_mode
        self.single_action_space = spaces.Discrete(2)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.single_observation_space = _observation_space()
        self.observation_space = batch_space(self.single_observation_space, num_envs)

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        if isinstance(seed, (list, tuple)):
            # One stream for all copies, determined by every copy's seed.
            seed = int(np.random.SeedSequence([int(s) for s in seed]).generate_state(1)[0])
        super().reset(seed=seed)
        batch = self._batch
        batch.state[:] = self.np_random.uniform(low=-_START, high=_START, size=(self.num_envs, 4))
        batch.steps[:] = 0
        return batch.state.astype(np.float32), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        batch = self._batch
        final, reward, terminated, truncated = batch.step(np.asarray(actions, dtype=np.int64).reshape(self.num_envs))
        done = terminated | truncated
        info: dict[str, Any] = {}
        if done.any():
            info["final_obs"] = np.array([final[i] if done[i] else None for i in range(self.num_envs)],
                                         dtype=object)
            info["_final_obs"] = done.copy()
            batch.state[done] = self.np_random.uniform(low=-_START, high=_START, size=(int(done.sum()), 4))
            batch.steps[done] = 0
        return batch.state.astype(np.float32), reward, terminated, truncated, info

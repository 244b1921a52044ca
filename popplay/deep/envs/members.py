"""The environments of a deep population's members, stepped together.

Each member has ``copies`` environments (copy ``c`` of member ``k`` at index
``k_slot * copies + c``: member-major). Its episode ``e`` starts from the reset seed
``episode_seed(seed, k, c, e)`` (:func:`popplay.rng.key_path`), whatever the other
members do, so a member's experience does not depend on the population's size or
sharding.

A run file cannot hold a gymnasium environment, but it can hold how the current
episodes were reached: each member's episode index and the actions taken in it. A
resume resets each environment with that episode's seed and replays the actions,
which rebuilds the exact state for every deterministic environment (all of
gymnasium's classic-control and box2d ones); the replayed observations are compared
with the stored ones, so an environment that does not replay refuses the resume
instead of continuing differently.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from popplay import rng
from popplay.deep import envs

TAG_MEMBER_ENV = 11
#: Steps the action log grows by before the steps no current episode needs are dropped.
_TRIM_EVERY = 256


def copy_key(seed: int, member: int, copy: int) -> int:
    """The key of member ``member``'s copy ``copy``, from which its episodes' seeds come."""
    return rng.key_path(seed, TAG_MEMBER_ENV, member, copy)


def episode_seed(seed: int, member: int, copy: int, episode: int, key: int | None = None) -> int:
    """The reset seed of episode ``episode`` of member ``member``'s copy ``copy`` (32 bits:
    gymnasium's); ``key``: that copy's :func:`copy_key`, when the caller keeps it."""
    key = copy_key(seed, member, copy) if key is None else key
    return rng.key_extend(key, episode) & 0xFFFFFFFF


def episode_seeds(keys: np.ndarray, episodes: np.ndarray) -> np.ndarray:
    """:func:`episode_seed` of many copies at once (int64): ``keys``, their
    :func:`copy_key` values as signed 64-bit ints, and their episode indices. A
    population resets a few copies at every step; one key a time in Python ints cost
    about 7 us a copy."""
    from popplay.deep.envs._seeds_numba import episode_seeds_into  # defers numba

    keys = np.ascontiguousarray(keys, dtype=np.int64)
    episodes = np.ascontiguousarray(episodes, dtype=np.int64)
    if keys.shape != episodes.shape or keys.ndim != 1:
        raise ValueError("one episode index per key expected")
    out = np.empty(len(keys), dtype=np.int64)
    episode_seeds_into(keys, episodes, out)
    return out


class Step(NamedTuple):
    """One step of every environment (rows member-major) and the episodes it ended."""

    obs: np.ndarray  # (N, obs_dim) float32: where each environment acted
    action: np.ndarray
    reward: np.ndarray  # (N,) float32
    successor: np.ndarray  # (N, obs_dim): the next observation, an ended episode's last one
    terminated: np.ndarray  # (N,) bool: ended by the environment
    truncated: np.ndarray  # (N,) bool: cut by a time limit (and not terminated)
    ended: np.ndarray  # indices of the environments whose episode ended
    returns: np.ndarray  # their returns
    lengths: np.ndarray  # and lengths


class MemberEnvs:
    """``copies`` environments of ``env_id`` per member that restart finished episodes
    at once (the successor at an episode's end is its last observation)."""

    def __init__(self, env_id: str, seed: int, members: np.ndarray, copies: int = 1) -> None:
        self.env_id = env_id
        self.seed = seed
        self.copies = int(copies)
        self.members = np.asarray(members, dtype=np.int64).reshape(-1)
        self._owner = np.repeat(self.members, self.copies)  # member index of each environment
        self._copy = np.tile(np.arange(self.copies), len(self.members))
        first = envs.make_single(env_id, disable_env_checker=True)
        self.info = envs.describe_single(first, env_id)
        # An environment class that steps many copies at once (popplay/CartPole-v1: one
        # numba loop) replaces the per-copy objects and their Python steps; it promises
        # the same observations, rewards and ends as they give.
        batched = getattr(type(first.unwrapped), "batched", None)
        self.batch = None if batched is None else batched(len(self._owner), envs.time_limit(env_id))
        self.envs = [first] if self.batch is not None else \
            [first, *(envs.make_single(env_id, disable_env_checker=True) for _ in self._owner[1:])]
        p = len(self._owner)
        # each copy's key before its episode index (episode_seed's path, derived once)
        self._episode_keys = np.array([rng.signed64(copy_key(seed, int(m), int(c)))
                                       for m, c in zip(self._owner, self._copy)], dtype=np.int64)
        self.episode = np.zeros(p, dtype=np.int64)  # index of each member's current episode
        self.episode_return = np.zeros(p, dtype=np.float64)
        self.episode_length = np.zeros(p, dtype=np.int64)
        # The actions of the current episodes, for the run file: each step's actions
        # array, kept from the oldest current episode's start (step ``_taken_from``) on,
        # and the step at which each environment's episode started. One list entry a
        # step, not one per environment: appending to 64 lists was a tenth of a
        # population's environment step.
        self._taken: list[np.ndarray] = []
        self._taken_from = 0
        self._now = 0
        self._started = np.zeros(p, dtype=np.int64)
        self._trim_at = _TRIM_EVERY
        self.obs = self._reset(np.arange(p))

    def _reset(self, rows: np.ndarray) -> np.ndarray:
        """Start environments ``rows`` on their current episodes; their first observations."""
        seeds = episode_seeds(self._episode_keys[rows], self.episode[rows])
        if self.batch is not None:
            return self.batch.reset(rows, seeds)
        return np.stack([self.envs[i].reset(seed=int(s))[0] for i, s in zip(rows.tolist(), seeds.tolist())]
                        ).astype(np.float32)

    def start_episode(self, episode: int) -> None:
        """Every environment restarts at episode ``episode`` of its stream (evaluation
        plays the same episode index on every member at once)."""
        self.episode[:] = episode
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0
        self._taken, self._taken_from, self._trim_at = [], self._now, _TRIM_EVERY
        self._started[:] = self._now
        self.obs = self._reset(np.arange(len(self._owner)))

    def step(self, actions: np.ndarray) -> Step:
        """One step of every environment with ``actions`` (member-major). :attr:`obs`
        moves on (a finished environment's to its next episode's first observation)."""
        p = len(self._owner)
        obs = self.obs
        if self.batch is not None:
            successor, reward, terminated, truncated = self.batch.step(actions)
            truncated = truncated & ~terminated
        else:
            successor = np.empty_like(obs)
            reward = np.empty(p, dtype=np.float32)
            terminated = np.zeros(p, dtype=bool)
            truncated = np.zeros(p, dtype=bool)
            for i, env in enumerate(self.envs):
                action = actions[i].item() if actions.ndim == 1 else actions[i]
                nxt, r, term, trunc, _ = env.step(action)
                successor[i] = nxt
                reward[i], terminated[i], truncated[i] = r, term, trunc and not term
        self._taken.append(np.array(actions))  # a copy: the caller's array may change
        self._now += 1
        done = terminated | truncated
        self.episode_return += reward
        self.episode_length += 1
        finished = np.flatnonzero(done)
        returns, lengths = self.episode_return[finished], self.episode_length[finished]  # copies
        after = successor.copy()
        if finished.size:
            self.episode[finished] += 1
            self.episode_return[finished] = 0.0
            self.episode_length[finished] = 0
            self._started[finished] = self._now
            if len(self._taken) >= self._trim_at:
                self._trim()
            after[finished] = self._reset(finished)
        self.obs = after
        return Step(obs, actions, reward, successor, terminated, truncated, finished, returns, lengths)

    def _trim(self) -> None:
        """Drop the steps before every current episode's start."""
        oldest = int(self._started.min())
        del self._taken[:oldest - self._taken_from]
        self._taken_from = oldest
        self._trim_at = len(self._taken) + _TRIM_EVERY

    def _episode_actions(self, i: int) -> list[Any]:
        """Environment ``i``'s actions in its current episode, as :meth:`step` took
        them: a Python scalar from a vector of actions, else the action's row."""
        steps = self._taken[int(self._started[i]) - self._taken_from:]
        return [row[i].item() if row.ndim == 1 else row[i] for row in steps]

    # --- run-file arrays -------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        taken = [self._episode_actions(i) for i in range(len(self._owner))]
        lengths = np.asarray([len(a) for a in taken], dtype=np.int64)
        flat = np.asarray([a for member in taken for a in member])
        if flat.size == 0:
            flat = np.zeros((0,) + ((self.info.action_dim,) if not self.info.discrete else ()))
        return {"env.episode": self.episode.copy(), "env.return": self.episode_return.copy(),
                "env.actions": flat, "env.action_counts": lengths, "env.obs": self.obs.copy()}

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Rebuild every member's environment from :meth:`arrays` (ValueError, one
        line, when the stored episode does not replay to the stored observation)."""
        p = len(self._owner)
        episode = np.asarray(arrays["env.episode"], dtype=np.int64)
        counts = np.asarray(arrays["env.action_counts"], dtype=np.int64)
        stored_obs = np.asarray(arrays["env.obs"], dtype=np.float32)
        returns = np.asarray(arrays["env.return"], dtype=np.float64)
        actions = np.asarray(arrays["env.actions"])
        if episode.shape != (p,) or counts.shape != (p,) or returns.shape != (p,) or (episode < 0).any() \
                or (counts < 0).any() or stored_obs.shape != self.obs.shape or len(actions) != int(counts.sum()):
            raise ValueError(f"env.*: the stored environments do not fit {len(self.members)} members x "
                             f"{self.copies} copies")
        self.episode = episode.copy()
        self.episode_return = returns.copy()
        self.episode_length = counts.copy()
        # the stored episodes laid into the step log, each ending at the current step
        longest = int(counts.max(initial=0))
        log = np.zeros((longest, p) + actions.shape[1:], dtype=actions.dtype)
        self._now, self._taken_from, self._started = longest, 0, longest - counts
        self._trim_at = longest + _TRIM_EVERY
        start = 0
        for i in range(p):
            obs = self._reset(np.array([i]))[0]
            taken = actions[start:start + counts[i]]
            start += int(counts[i])
            for action in taken:
                obs, term, trunc = self._replay(i, action.item() if self.info.discrete else action)
                if term or trunc:
                    raise ValueError(f"env.actions: member {int(self._owner[i])}'s stored episode ended early")
            log[longest - len(taken):, i] = taken
            # equal_nan: a diverged member's actions can lead its environment to NaN
            if not np.array_equal(np.asarray(obs, dtype=np.float32), stored_obs[i], equal_nan=True):
                raise ValueError(f"--env {self.env_id}: member {int(self._owner[i])}'s episode does not replay to "
                                 "its stored state (the environment is not deterministic)")
            self.obs[i] = obs
        self._taken = list(log)

    def _replay(self, i: int, action: Any) -> tuple[np.ndarray, bool, bool]:
        """Environment ``i`` alone steps ``action`` (a resume replaying its episode)."""
        if self.batch is not None:
            obs, _, term, trunc = self.batch.step(np.asarray([action]), rows=np.array([i]))
            return obs[0], bool(term[0]), bool(trunc[0])
        obs, _, term, trunc, _ = self.envs[i].step(action)
        return obs, bool(term), bool(trunc)

    def close(self) -> None:
        for env in self.envs:
            env.close()

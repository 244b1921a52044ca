"""Playing whole episodes on a vector environment (numpy in, numpy out).

Grandio's simulators and the parameter-server draft's workers think in episodes, so a simulator here
plays one episode on each copy of its vector environment, each copy reset with its
own seed (so that an episode depends only on the run's seed and its index, which is
what makes ``--resume`` exact). A copy that finishes early waits (its further steps
are not recorded) until every copy has finished.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass
class Episodes:
    """Transitions of one or more episodes, copy after copy, in time order."""

    obs: np.ndarray  # (T, obs_dim) float32
    action: np.ndarray  # (T,) int64 or (T, action_dim) float32
    reward: np.ndarray  # (T,) float32
    next_obs: np.ndarray  # (T, obs_dim) float32: the real successor, also at episode ends
    terminated: np.ndarray  # (T,) bool: ended by the environment (not a time limit)
    returns: np.ndarray  # (episodes,) float64: undiscounted return of each episode
    lengths: np.ndarray  # (episodes,) int64

    @property
    def steps(self) -> int:
        return int(self.reward.shape[0])


def episode_seed(seed: int, stream: int, episode: int) -> int:
    """The reset seed of episode ``episode`` of stream ``stream`` (simulator, worker)."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(stream), int(episode)]).generate_state(1)[0])


def play_episodes(env: Any, act: Callable[[np.ndarray], np.ndarray], seeds: list[int],
                  max_steps: int = 1_000_000, *, hand_over: Callable[[Episodes], None] | None = None,
                  first: int = 0, every: int = 0) -> Episodes:
    """One episode on each copy of ``env`` (``len(seeds) == env.num_envs``), acting
    with ``act(obs batch) -> action batch``.

    With ``hand_over`` (one copy only), the transitions are handed over while the
    episode runs: to ``hand_over`` after step ``first`` and then after every ``every``
    steps more, as pieces that hold no finished episode (``returns`` and ``lengths``
    empty). A learner that trains there follows a step-based schedule and ``act`` sees
    the result at the next step. The returned :class:`Episodes` then holds only the
    transitions not handed over, with the episode's whole return and length.
    """
    n = env.num_envs
    if len(seeds) != n:
        raise ValueError(f"need one seed per copy ({n}), got {len(seeds)}")
    if hand_over is not None and (n != 1 or first < 1 or every < 1):
        raise ValueError(f"hand_over needs one copy and positive first, every (got {n}, {first}, {every})")
    obs, _ = env.reset(seed=list(seeds) if n > 1 else int(seeds[0]))
    obs_dim = int(np.prod(obs.shape[1:]))
    active = np.ones(n, dtype=bool)
    per_copy: list[list[tuple]] = [[] for _ in range(n)]
    handed = 0  # rows of copy 0 already handed over
    due = first
    steps = 0
    while active.any() and steps < max_steps:
        action = np.asarray(act(obs))
        nxt, reward, terminated, truncated, info = env.step(action)
        done = np.logical_or(terminated, truncated)
        successor = nxt
        if done.any():
            successor = nxt.copy()
            final = info["final_obs"]
            for i in np.flatnonzero(done):
                successor[i] = final[i]
        for i in np.flatnonzero(active):
            per_copy[i].append((obs[i], action[i], reward[i], successor[i], terminated[i]))
        active &= ~done
        obs = nxt
        steps += 1
        if hand_over is not None and steps == due:
            hand_over(_episodes(per_copy[0][handed:], obs_dim, np.zeros(0), np.zeros(0, dtype=np.int64)))
            handed = steps
            due += every
    lengths = np.array([len(c) for c in per_copy], dtype=np.int64)
    returns = np.array([float(sum(r[2] for r in c)) for c in per_copy], dtype=np.float64)
    rows = per_copy[0][handed:] if handed else [row for copy in per_copy for row in copy]
    return _episodes(rows, obs_dim, returns, lengths)


def _episodes(rows: list[tuple], obs_dim: int, returns: np.ndarray, lengths: np.ndarray) -> Episodes:
    """Transition rows ``(obs, action, reward, next_obs, terminated)`` as arrays."""
    return Episodes(
        obs=np.array([r[0] for r in rows], dtype=np.float32).reshape(len(rows), obs_dim),
        action=np.array([r[1] for r in rows]),
        reward=np.array([r[2] for r in rows], dtype=np.float32),
        next_obs=np.array([r[3] for r in rows], dtype=np.float32).reshape(len(rows), obs_dim),
        terminated=np.array([r[4] for r in rows], dtype=bool),
        returns=np.asarray(returns, dtype=np.float64), lengths=np.asarray(lengths, dtype=np.int64),
    )


def evaluate(env: Any, act: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int,
             stream: int = 1_000_003) -> np.ndarray:
    """Returns of ``episodes`` episodes of ``act`` (greedy evaluation), seeded apart
    from every training stream."""
    out: list[float] = []
    done = 0
    while done < episodes:
        seeds = [episode_seed(seed, stream, done + i) for i in range(env.num_envs)]
        out.extend(play_episodes(env, act, seeds).returns.tolist())
        done += env.num_envs
    return np.array(out[:episodes], dtype=np.float64)

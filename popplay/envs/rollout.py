"""Playing whole episodes on a vector environment (numpy in, numpy out).

Seed 003's simulators and seed 001's workers think in episodes, so a simulator here
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
                  max_steps: int = 1_000_000) -> Episodes:
    """One episode on each copy of ``env`` (``len(seeds) == env.num_envs``), acting
    with ``act(obs batch) -> action batch``."""
    n = env.num_envs
    if len(seeds) != n:
        raise ValueError(f"need one seed per copy ({n}), got {len(seeds)}")
    obs, _ = env.reset(seed=list(seeds) if n > 1 else int(seeds[0]))
    active = np.ones(n, dtype=bool)
    per_copy: list[list[tuple]] = [[] for _ in range(n)]
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
    rows = [row for copy in per_copy for row in copy]
    lengths = np.array([len(c) for c in per_copy], dtype=np.int64)
    returns = np.array([float(sum(r[2] for r in c)) for c in per_copy], dtype=np.float64)
    return Episodes(
        obs=np.array([r[0] for r in rows], dtype=np.float32).reshape(len(rows), -1),
        action=np.array([r[1] for r in rows]),
        reward=np.array([r[2] for r in rows], dtype=np.float32),
        next_obs=np.array([r[3] for r in rows], dtype=np.float32).reshape(len(rows), -1),
        terminated=np.array([r[4] for r in rows], dtype=bool),
        returns=returns, lengths=lengths,
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

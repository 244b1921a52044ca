"""What moves between ranks: transitions packed into one float64 tensor, weights with
a small header, an exact checksum, and the role a rank shows in ``ps``."""
from __future__ import annotations

from typing import Any

import numpy as np

from popplay.deep.agents.replay import episode_rows, transition_width

# Header of a transitions message (int64): transitions, episodes, last (1: the sender stops).
HEADER = 3
# Header of a weights message (float64), before the flat parameters.
W_FLAG, W_EXPLORATION, W_EPISODES, W_UPDATES = range(4)
WEIGHTS_HEADER = 4


def row_width(obs_dim: int, action_dim: int = 1) -> int:
    """obs, action (``action_dim`` entries; 1 for an index), reward, next_obs, terminated."""
    return transition_width(obs_dim, action_dim)


def action_width(info: Any) -> int:
    """Entries of one action: 1 (an index) for discrete actions, else the box's size."""
    return 1 if info.discrete else len(info.action_low)


def pack(episodes: Any, obs_dim: int) -> np.ndarray:
    """Transitions (:func:`~popplay.deep.agents.replay.episode_rows`, the replay agents'
    one row format) then (return, length) of each episode, as one float64 vector (exact:
    float32 values, small integer actions and lengths are exact in float64)."""
    rows = episode_rows(episodes)
    tail = np.stack([episodes.returns.astype(np.float64), episodes.lengths.astype(np.float64)], axis=1)
    return np.concatenate([rows.reshape(-1), tail.reshape(-1)])


def unpack(data: np.ndarray, transitions: int, episodes: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows (T, width), returns, lengths)`` of a :func:`pack` vector of rows ``width`` wide."""
    rows = data[:transitions * width].reshape(transitions, width)
    tail = data[transitions * width:transitions * width + 2 * episodes].reshape(episodes, 2)
    return rows, tail[:, 0], tail[:, 1].astype(np.int64)


_MULTIPLIERS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93],
                        dtype=np.uint64)


def checksum(rows: np.ndarray) -> int:
    """An exact, order-independent checksum of transition rows: the wrapping 64-bit sum
    over rows of their bit patterns times per-column odd constants. Equal multisets
    of rows give equal sums, whatever messages carried them."""
    if rows.size == 0:
        return 0
    bits = np.ascontiguousarray(rows, dtype=np.float64).view(np.uint64)
    # Float32 values have 29 zero low bits in float64: fold the high bits down first.
    bits = bits ^ (bits >> np.uint64(29)) ^ (bits >> np.uint64(47))
    cols = np.resize(_MULTIPLIERS, bits.shape[1]) + 2 * np.arange(bits.shape[1], dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int((bits * cols).sum(dtype=np.uint64))


def add_checksums(a: int, b: int) -> int:
    return (a + b) & ((1 << 64) - 1)

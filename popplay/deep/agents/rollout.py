"""What rollout agents (PPO) learn from: a fixed-length, time-major rollout of
``T`` steps on each of ``B`` environment copies, with the acting policy's
log-probabilities and values (:mod:`popplay.deep.topologies.rollout` plays it)."""
from __future__ import annotations

from typing import NamedTuple

import torch


class Rollout(NamedTuple):
    obs: torch.Tensor  # (T, B, obs_dim) float32
    action: torch.Tensor  # (T, B) int64
    log_prob: torch.Tensor  # (T, B) float32: log pi_old(a_t|s_t) of the policy that acted
    value: torch.Tensor  # (T, B) float32: V_old(s_t)
    # (T, B) float32; a time-limit cut already adds gamma V(cut state), as SB3 does
    reward: torch.Tensor
    episode_start: torch.Tensor  # (T, B) float32: 1 where s_t began an episode
    last_value: torch.Tensor  # (B,) float32: V of the observation after the last row
    last_episode_start: torch.Tensor  # (B,) float32: 1 where that observation began an episode

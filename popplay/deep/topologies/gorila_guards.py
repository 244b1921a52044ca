"""Gorila's two safeguards (Nair et al. 2015, "Stability"), as plain state machines.

- :class:`StalenessGuard` (on each parameter-server shard): a gradient computed from
  parameters ``server_version - gradient_version`` updates old, where versions count
  the updates this shard has applied, is discarded when that age exceeds
  ``max_staleness``. Every age seen is counted in a histogram (ages above the
  threshold share the last bin).
- :class:`OutlierGuard` (on each learner, as the seed puts it: "each actor/learner
  keeps a running average and standard deviation"): a gradient whose norm lies more
  than ``k`` standard deviations above the mean of the last ``window`` accepted norms
  is discarded, once ``min_samples`` norms have been seen. Like the seed's running
  statistics, the window holds every finite norm seen, discarded ones included: a
  window of accepted norms only would lock out for good a learner whose gradients
  grow steadily (DQN's do, as the Q-values grow), which we saw drop over half of all
  gradients on CartPole. The price: a run of consecutive huge gradients raises the bar
  (with a window of ``w``, the second of two equal outliers in a row passes iff
  ``k`` is above about ``sqrt(w - 1)``). Non-finite norms are always outliers and stay
  out of the window.

The outlier decision is taken where the whole gradient is known (the learner): a
shard only sees its slice, and shards taking separate decisions on slices would apply
half a gradient. Staleness is per shard, like the seed's asynchronous shards, which
apply gradients independently of each other.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class StalenessGuard:
    max_staleness: int
    accepted: int = 0
    discarded: int = 0
    histogram: np.ndarray = field(init=False)  # [0..max_staleness] and one bin for older

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be non-negative (got {self.max_staleness})")
        self.histogram = np.zeros(self.max_staleness + 2, dtype=np.int64)

    def admit(self, server_version: int, gradient_version: int) -> bool:
        """Count the gradient's age; True when it may be applied."""
        age = int(server_version) - int(gradient_version)
        if age < 0:
            raise ValueError(f"gradient version {gradient_version} is ahead of the server's {server_version}")
        self.histogram[min(age, self.max_staleness + 1)] += 1
        if age > self.max_staleness:
            self.discarded += 1
            return False
        self.accepted += 1
        return True


@dataclass
class OutlierGuard:
    k: float = 5.0
    window: int = 100
    min_samples: int = 20
    accepted: int = 0
    discarded: int = 0
    history: deque = field(init=False)

    def __post_init__(self) -> None:
        if not self.k > 0:
            raise ValueError(f"k must be positive (got {self.k})")
        if self.window < 2 or not 2 <= self.min_samples <= self.window:
            raise ValueError(f"need 2 <= min_samples ({self.min_samples}) <= window ({self.window})")
        self.history = deque(maxlen=self.window)

    def bound(self) -> float:
        """The largest norm admitted now (infinite until ``min_samples`` were seen)."""
        if len(self.history) < self.min_samples:
            return math.inf
        values = list(self.history)
        mean = math.fsum(values) / len(values)
        var = math.fsum((v - mean) ** 2 for v in values) / len(values)
        return mean + self.k * math.sqrt(var)

    def admit(self, norm: float) -> bool:
        """True when a gradient of this norm may be sent (a finite norm is remembered either way)."""
        norm = float(norm)
        if not math.isfinite(norm):
            self.discarded += 1
            return False
        admitted = norm <= self.bound()
        self.history.append(norm)
        if admitted:
            self.accepted += 1
        else:
            self.discarded += 1
        return admitted

"""popplay: evolutionary population reinforcement learning.

The Python API (see ``docs/api.md``)::

    import popplay
    outcome = popplay.train("bandit", agents=8, trials=16, steps_per_agent=64)
    outcome.summary["quality"], outcome.result.curve.metrics["quality"]

Names are loaded on first use, so that ``import popplay`` (and the command line)
stays fast.
"""
from __future__ import annotations

import os
from importlib import import_module

from popplay import _numba_cache

# MKL picks its matrix-product code by the memory alignment of each operand, and the
# paths round differently: a population member's rows start wherever its index puts
# them, so without this a member alone, or on another rank, computed other bits than
# inside the population (measured: 64-64 networks acting on one observation; TD3 on two
# ranks). Strict conditional numerical reproducibility fixes the path; MKL reads it at
# its first call, so it is set on import, unless the user chose a mode.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"

_EXPORTS = {
    "train": "popplay.api", "evaluate": "popplay.api", "tournament": "popplay.api", "load": "popplay.api",
    "params_for": "popplay.api", "TrainOptions": "popplay.training.pipeline", "TrainOutcome": "popplay.training.pipeline",
    "CheckpointEvery": "popplay.training.pipeline", "BanditParams": "popplay.games.bandit.rules",
    "CartPolePopulationParams": "popplay.games.cartpole.rules", "KnightsParams": "popplay.games.knights.rules",
}
__all__ = ["__version__", *_EXPORTS]

_numba_cache.configure()


def __getattr__(name: str) -> object:
    if name in _EXPORTS:

        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'popplay' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

"""popplay: evolutionary population reinforcement learning."""
from popplay import _numba_cache

__version__ = "0.1.0"

_numba_cache.configure()

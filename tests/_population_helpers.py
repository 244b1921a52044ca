"""What the deep-population tests share: phases run by hand, and run files compared state by state."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np


def run_phases(experiment: Any, phases: int) -> Any:
    """``phases`` phases of ``experiment`` from its initial state; the state after them."""
    state = experiment.initial_state()
    for _ in range(phases):
        state = experiment.phase(state, time_left=None)
    return state


def assert_same_state(a: Path, b: Path) -> list[str]:
    """Two run files hold the same state datasets, bit for bit (NaN equal to NaN); their names."""
    with h5py.File(a) as left, h5py.File(b) as right:
        names = sorted(left["state"])
        assert names == sorted(right["state"])
        for name in names:
            x, y = left["state"][name][()], right["state"][name][()]
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    return names

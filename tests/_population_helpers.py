"""What the deep-population tests share: phases run by hand, and run files compared state by state."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from tests._dist_helpers import assert_same_run, popplay


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


def assert_two_ranks_equal_one_process(flags: list[str], tmp_path: Path) -> None:
    """``popplay FLAGS`` (a population with PBT and sharing) in this process and over
    ``--nproc 2`` real ranks: the same run file, with copies and shares made."""
    from popplay.cli.main import main

    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    assert main([*flags, "--out", str(one)]) == 0
    done = popplay(*flags, "--nproc", "2", "--out", str(two), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["replications"] >= 1 and summary["shares"] >= 1
    assert_same_run(one, two)

"""popplay.distributed: launcher, process groups and fixed-order collectives through
real ranks on gloo (2 processes, tiny, a timeout on every wait)."""
from __future__ import annotations

import pytest

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tests._dist_helpers import finish

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

ROOT = Path(__file__).resolve().parents[1]
WAIT = 120  # seconds: generous for a loaded 2-core machine, but never forever


def _launcher(scenario: str, outdir: Path, nproc: int = 2, timeout: float = 10.0) -> subprocess.Popen:
    code = ("import sys; from popplay.distributed.launch import launch_local; "
            f"sys.exit(launch_local([{scenario!r}, {str(outdir)!r}], {nproc}, timeout={timeout}, "
            "module='tests._dist_worker', describe_lost=lambda: 'last good checkpoint: none'))")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TEST_TIMEOUT": str(timeout)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
    return finish(process, WAIT, "the launcher")


def test_tree_sum_power_of_two_blocks_equal_numba_share() -> None:
    """The tree collectives rebuild is the one operators.share_weighted uses."""
    from popplay.distributed.collectives import tree_sum
    from popplay.operators.sharing import share_weighted

    rng = np.random.default_rng(1)
    for agents in (1, 3, 4, 6, 8):
        values = rng.standard_normal((2, agents, 5)) * 1e3
        weights = np.ones_like(values)
        shared, _ = share_weighted(values, weights, 0.0)
        mean = tree_sum(values, axis=1) / tree_sum(weights, axis=1)
        # share_weighted divides the two tree sums; with unit weights that is our quotient.
        assert np.array_equal(shared[:, :1, :], mean), agents


def test_killed_rank_stops_job_with_one_line(tmp_path: Path) -> None:
    started = time.monotonic()
    code, out, err = _finish(_launcher("die", tmp_path, timeout=20.0))
    elapsed = time.monotonic() - started
    from popplay.distributed.launch import LOST_EXIT

    assert code == LOST_EXIT
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: rank 1 of 2 was lost (killed by SIGKILL); stopped the job; "
                      "last good checkpoint: none"], err
    assert elapsed < WAIT


def test_silent_rank_times_out(tmp_path: Path) -> None:
    started = time.monotonic()
    code, out, err = _finish(_launcher("hang", tmp_path, timeout=3.0))
    elapsed = time.monotonic() - started
    assert code != 0
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: rank 1 of 2 was lost (stopped answering"), err
    assert elapsed < 60, elapsed  # bounded by the 3 s timeout (plus start-up), not 30 minutes


def test_collectives_ps_roles_and_ctrl_c(tmp_path: Path) -> None:
    """Two ranks: every collective against the one-process answer, each rank's role in
    ``ps``, then Ctrl-C on the launcher reaches both once and rank 0 saves once."""
    from popplay.distributed.collectives import tree_sum
    from popplay.operators.sharing import _tree_sum_th

    process = _launcher("gather_then_stop", tmp_path)
    deadline = time.monotonic() + WAIT
    while not ((tmp_path / "ready0").exists() and (tmp_path / "ready1").exists()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "ranks never became ready"
        time.sleep(0.05)
    listing = subprocess.run(["ps", "-ww", "-o", "args=", "--ppid", str(process.pid)], capture_output=True,
                             text=True, timeout=30).stdout
    assert "popplay rank 0/2" in listing and "popplay rank 1/2" in listing, listing
    process.send_signal(signal.SIGINT)
    code, out, err = _finish(process)
    assert code == 130, err
    assert (tmp_path / "saved").read_text() == "saved\n"  # rank 0 saved, once

    values = np.random.default_rng(5).standard_normal((3, 12, 4))
    np.testing.assert_array_equal(np.load(tmp_path / "whole.npy"), values)
    import torch

    single = _tree_sum_th(torch.from_numpy(values)).numpy()
    # Bit for bit the one-process tree, though each rank summed its own 6 agents.
    assert np.load(tmp_path / "total.npy").tobytes() == single.tobytes()
    assert tree_sum(values, axis=1).tobytes() == single.tobytes()
    np.testing.assert_array_equal(np.load(tmp_path / "ragged.npy"), [0, 1, 2])
    rows = np.load(tmp_path / "rows.npy")
    assert rows.dtype == np.uint16 and rows.shape == (3, 2, 3)
    np.testing.assert_array_equal(rows[:, 0, 0], [1, 2, 2])
    keys = np.arange(12, dtype=np.uint64) * np.uint64(2**63 + 1)
    assert np.load(tmp_path / "keys.npy").dtype == np.uint64
    np.testing.assert_array_equal(np.load(tmp_path / "keys.npy"), keys)
    flag, count, *role = (tmp_path / "scalars.txt").read_text().split()
    assert (flag, count, " ".join(role)) == ("True", "3", "popplay rank 0/2")

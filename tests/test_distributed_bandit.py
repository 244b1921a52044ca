"""Bandit populations sharded over real ranks (gloo): bit-identical to one process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests._dist_helpers import ROOT, WAIT, assert_same_run, popplay

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

TINY = ["train", "bandit", "--arms", "6", "--agents", "8", "--trials", "3", "--agent-steps", "96",
        "--share-every", "3", "--seed", "4"]


def _single(tmp_path: Path, name: str, *extra: str) -> Path:
    from popplay.cli.main import main

    out = tmp_path / name
    assert main([*TINY, *extra, "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def sharded_default_out(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """TINY with per-agent static streams on 2 ranks, started without --out in a directory
    of its own: one start serves the comparison with one process and the check of the
    latest link it makes (each start of ranks costs seconds on two cores)."""
    cwd = tmp_path_factory.mktemp("default-out")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "popplay", *TINY, "--differentiation", "bias", "--nproc", "2",
                           "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 0, done.stderr
    return cwd, done


def test_two_and_four_ranks_equal_one_process(tmp_path: Path, sharded_default_out) -> None:
    extra = ["--differentiation", "bias"]  # per-agent static streams: the layout-sensitive case
    one = _single(tmp_path, "one.h5", *extra)
    cwd, done = sharded_default_out
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2
    data = assert_same_run(one, cwd / "runs" / "latest-bandit.h5")
    assert np.count_nonzero(data["state/q"]) > 0  # the comparison is not of empty tables


def test_trials_split_over_ranks_equal_one_process(tmp_path: Path) -> None:
    """Ranks that divide the trials take whole trials each (no share travels)."""
    four_trials = [*TINY[:TINY.index("--trials")], "--trials", "4", *TINY[TINY.index("--agent-steps"):]]
    extra = ["--differentiation", "bias"]
    from popplay.cli.main import main

    one = tmp_path / "one.h5"
    assert main([*four_trials, *extra, "--out", str(one)]) == 0
    for n in (2,):  # four ranks of the agent layout: test_two_and_four_ranks_equal_one_process
        out = tmp_path / f"n{n}.h5"
        done = popplay(*four_trials, *extra, "--nproc", str(n), "--out", str(out), "--json")
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        # 4 phases (12 steps per agent, shares every 3), each gathering only this
        # rank's trials' tables (4/n x 15 float64) and a stop flag; the agent layout
        # sends every agent's touched arms (3,872 B in all with 2 ranks).
        assert summary["world_size"] == n and summary["comm_bytes"] <= 4 * (4 // n * 15 * 8 + 16)
        assert_same_run(one, out)
    out = tmp_path / "torch.h5"
    one = tmp_path / "one-torch.h5"
    assert main([*four_trials, "--backend", "torch", "--out", str(one)]) == 0
    done = popplay(*four_trials, "--backend", "torch", "--nproc", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_run(one, out)


def test_shard_layout_prefers_whole_trials() -> None:
    from popplay.core.backend import shard_layout

    assert shard_layout(4, 2) == "trials" and shard_layout(3, 2) == "agents" and shard_layout(4, 1) == "agents"


def test_torch_backend_two_ranks_equal_one_process(tmp_path: Path) -> None:
    extra = ["--backend", "torch", "--differentiation", "partition"]
    one = _single(tmp_path, "one.h5", *extra)
    out = tmp_path / "n2.h5"
    done = popplay(*TINY, *extra, "--nproc", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "2 ranks" in done.stdout  # the console line names the world size
    assert_same_run(one, out)


def test_ranks_must_divide_the_agents_or_the_trials(tmp_path: Path, capsys) -> None:
    from popplay.cli.main import main

    # 5 divides neither the 8 agents nor the 3 trials: refused before any rank starts
    assert main([*TINY, "--nproc", "5", "--out", str(tmp_path / "x.h5")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "cannot be split evenly over 5 ranks" in errors[0]
    assert not (tmp_path / "x.h5").exists()


def test_cuda_nccl_two_ranks_equal_one_process(tmp_path: Path) -> None:
    """NCCL, one GPU per rank: needs two CUDA devices (skipped elsewhere)."""
    import pytest
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    extra = ["--backend", "torch", "--device", "cuda", "--differentiation", "bias"]
    one = _single(tmp_path, "one.h5", *extra)
    out = tmp_path / "n2.h5"
    done = popplay(*TINY, *extra, "--nproc", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_run(one, out)


@pytest.mark.parametrize("trials", ["3", "4"], ids=["agent-layout", "trial-layout"])
def test_one_process_run_resumes_on_two_ranks(tmp_path: Path, trials: str) -> None:
    from popplay.cli.main import main

    tiny = [*TINY[:TINY.index("--trials")], "--trials", trials, *TINY[TINY.index("--agent-steps"):]]
    half = [*tiny[:tiny.index("--agent-steps")], "--agent-steps", "48", *tiny[tiny.index("--share-every"):]]
    out = tmp_path / "run.h5"
    assert main([*half, "--differentiation", "top2", "--out", str(out), "--json"]) == 0
    done = popplay("train", "bandit", "--resume", str(out), "--agent-steps", "96", "--nproc", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["world_size"] == 2
    whole = tmp_path / "whole.h5"
    assert main([*tiny, "--differentiation", "top2", "--out", str(whole), "--json"]) == 0
    assert_same_run(whole, out)


@pytest.mark.parametrize("trials", ["3", "4"], ids=["agent-layout", "trial-layout"])
def test_time_budget_ends_every_rank_after_the_same_phase(tmp_path: Path, trials: str) -> None:
    """The ranks agree on the learning time after each phase (the slowest rank's), so a
    time budget stops them together: the run equals a one-process run of the steps it
    reached."""
    untimed = ["train", "bandit", "--arms", "6", "--agents", "8", "--trials", trials, "--share-every", "3",
               "--seed", "4"]
    out = tmp_path / "timed.h5"
    # A budget several phases long even where a loaded machine starves one phase.
    done = popplay(*untimed, "--time-budget", "0.8", "--nproc", "2", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["complete"] and summary["seconds"] >= 0.8 and summary["phases"] > 1
    from popplay.cli.main import main

    steps = tmp_path / "steps.h5"
    assert main([*untimed, "--agent-steps", str(summary["agent_steps_per_trial"]), "--out", str(steps)]) == 0
    assert_same_run(steps, out)


def test_a_sharded_run_with_the_default_out_says_which_latest_link_it_made(sharded_default_out) -> None:
    cwd, done = sharded_default_out
    link = cwd / "runs" / "latest-bandit.h5"
    assert link.is_symlink() and (cwd / "runs" / os.readlink(link)).is_file()
    assert f"runs/latest-bandit.h5 links to {os.readlink(link)}" in done.stderr

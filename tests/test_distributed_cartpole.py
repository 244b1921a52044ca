"""Cart-pole populations sharded over real ranks (gloo): sharing, differentiation and
selective replication on, bit-identical to one process, lineage included."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._dist_helpers import assert_same_run, popplay

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

TINY = ["train", "cartpole", "--agents", "8", "--trials", "2", "--agent-steps", "800", "--share-every", "20",
        "--bias", "0.5", "--replicate-every", "2", "--mutate-q", "0.01", "--mutate-params", "1.5",
        "--test-steps", "50", "--test-starts", "2", "--seed", "3"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """TINY in this process: the run every layout below must equal bit for bit (read only)."""
    from popplay.cli.main import main

    one = tmp_path_factory.mktemp("one") / "one.h5"
    assert main([*TINY, "--out", str(one), "--json"]) == 0
    return one


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> tuple[Path, dict]:
    """TINY on 4 ranks (the agent layout) and its summary: started once for the two
    tests that compare it, each 4-rank start costing seconds on two cores."""
    out = tmp_path_factory.mktemp("n4") / "n4.h5"
    done = popplay(*TINY, "--nproc", "4", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    return out, json.loads(done.stdout.strip().splitlines()[-1])


def test_four_ranks_equal_one_process(one_process: Path, four_ranks: tuple[Path, dict]) -> None:
    out, summary = four_ranks
    assert summary["world_size"] == 4
    data = assert_same_run(one_process, out)
    # Selection copied and mutated agents (the lineage says so): replication really ran.
    from popplay.operators.evolution import EVENTS

    events = set(data["state/lineage_event"].tolist())
    assert {EVENTS["copy"], EVENTS["mutation"]} <= events


def test_two_ranks_take_whole_trials_and_equal_one_process(tmp_path: Path, one_process: Path,
                                                             four_ranks: tuple[Path, dict]) -> None:
    """2 ranks divide the 2 trials: the trial layout (a rank holds its trials' tables
    only), with replication across the ranks' selections, bit for bit."""
    out = tmp_path / "n2.h5"
    done = popplay(*TINY, "--nproc", "2", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2
    assert_same_run(one_process, out)
    # Only shared tables, failure counts and the save travel: far less than the
    # agent layout's gathered tables (4 ranks of the same job).
    assert summary["comm_bytes"] * 4 < four_ranks[1]["comm_bytes"]


def test_resume_moves_between_the_trial_and_the_agent_layout(tmp_path: Path, one_process: Path) -> None:
    """One run in three legs: 2 ranks (whole trials), then 4 (blocks of agents), then one
    process (the file's layout is the whole population's, whoever wrote it). After each
    resume the file equals one process's run to that point."""
    from popplay.cli.main import main

    def budget(steps: str) -> list[str]:
        return [a if a != "800" else steps for a in TINY]

    # Every leg ends on a curve point (one each 160 steps here): a leg that ends between
    # them adds a point of its own (its final evaluation), which the uninterrupted run lacks.
    out = tmp_path / "run.h5"
    done = popplay(*budget("320"), "--nproc", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    # 2 ranks (trials) -> 4 (agents)
    done = popplay("train", "cartpole", "--resume", str(out), "--agent-steps", "480", "--nproc", "4")
    assert done.returncode == 0, done.stderr
    straight = tmp_path / "straight.h5"
    assert main([*budget("480"), "--out", str(straight)]) == 0
    assert_same_run(straight, out)
    # 4 (agents) -> one process, in this one
    assert main(["train", "cartpole", "--resume", str(out), "--agent-steps", "800"]) == 0
    assert_same_run(one_process, out)


def test_diverged_agents_and_trials_in_the_trial_layout_match_one_process(tmp_path: Path) -> None:
    """Quarantine in a selection phase and in a plain one, and a trial reset, with the
    trials spread over 2 and 4 ranks: the same state, lineage and events."""
    import numpy as np

    from popplay.core.backend import Backend
    from popplay.games.cartpole.experiment import CartPoleExperiment
    from tests._dist_worker import CARTPOLE_FAULTS, run_cartpole_with_faults
    from tests.test_distributed_core import _finish, _launcher

    experiment = CartPoleExperiment(CARTPOLE_FAULTS, Backend("numba", "cpu"))
    state, events = run_cartpole_with_faults(experiment)
    expected = experiment.state_arrays(state)
    assert any("agent" in e and "left out of the share" in e for e in events)
    assert any("its agents were reset" in e for e in events)
    for nproc in (2, 4):
        outdir = tmp_path / str(nproc)
        outdir.mkdir()
        code, _, err = _finish(_launcher("cartpole_faults", outdir, nproc=nproc, timeout=60))
        assert code == 0, err
        got = json.loads((outdir / "events.json").read_text())
        assert got["layout"] == "trials" and got["events"] == events
        with np.load(outdir / "state.npz") as arrays:
            assert sorted(arrays.files) == sorted(expected)
            different = [name for name in expected if np.asarray(expected[name]).tobytes() != arrays[name].tobytes()]
        assert not different, different


def test_memory_estimate_counts_a_rank_of_the_trial_layout_by_its_trials(monkeypatch) -> None:
    from popplay.core.limits import MemoryLimitError, check_run_fits
    from popplay.games.cartpole import memory_bytes
    from popplay.games.cartpole.rules import CartPolePopulationParams

    bell = CartPolePopulationParams(agents=8192, trials=1024)
    whole = memory_bytes(bell)
    assert memory_bytes(bell, 64, 1) < whole / 4  # 16 trials' tables and the bookkeeping
    assert memory_bytes(bell, 64, 8) == 8 * memory_bytes(bell, 64, 1)
    odd = CartPolePopulationParams(agents=8192, trials=1023)  # agent layout: every rank holds everything
    assert memory_bytes(odd, 2, 2) == 2 * memory_bytes(odd)
    monkeypatch.setenv("POPPLAY_MAX_MEMORY", "10G")
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "64"), ("LOCAL_WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    check_run_fits("cartpole", bell)  # a 64-machine job: ~5 GB here
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(MemoryLimitError, match="4 of its 64 ranks here"):
        check_run_fits("cartpole", bell)


@pytest.mark.parametrize("damage", ["action", "failures", "q_trials"])
def test_every_rank_refuses_a_file_damaged_in_another_ranks_trials(damage: str) -> None:
    """Rank 1 of 2 holds trials 2 and 3; damage in trial 0 must stop it too, or rank 0
    alone would refuse and leave rank 1 waiting at the start."""
    import numpy as np

    from popplay.core.backend import Backend
    from popplay.distributed.group import Dist
    from popplay.games.cartpole.experiment import CartPoleExperiment
    from popplay.games.cartpole.rules import CartPolePopulationParams

    params = CartPolePopulationParams(agents=4, trials=4, steps_per_agent=32, share_every=16, test_steps=16)
    one = CartPoleExperiment(params, Backend("numba", "cpu"))
    arrays = one.state_arrays(one.phase(one.initial_state(), time_left=None))
    counters = {"step": 16, "shares": 1, "max_bias": params.bias}
    second = CartPoleExperiment(params, Backend("numba", "cpu"), dist=Dist(rank=1, world_size=2))
    assert second.layout == "trials"
    second.restore(arrays, counters)  # the undamaged file loads
    if damage == "action":
        arrays["action"] = arrays["action"].copy()
        arrays["action"][0, 0] = 7
    elif damage == "failures":
        arrays["failures"] = arrays["failures"].copy()
        arrays["failures"][0, 0] = -1
    else:
        arrays["q_trials"] = np.array([0, 0], dtype=np.int64)
        arrays["q_rows"] = np.zeros((2, 4, arrays["trace_codes"].shape[-1]))
    with pytest.raises(ValueError, match=damage):
        second.restore(arrays, counters)

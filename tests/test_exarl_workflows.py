"""EXARL's multi-process workflows through real ranks on gloo (tiny budgets).

The three jobs run side by side (one launch each, started together) to keep the
wall time down; each rank's every wait is bounded by --timeout."""
from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from popplay.checkpoints.validation import load_run

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

TINY = ["--hidden", "8", "--eval-episodes", "1", "--timeout", "60", "--json"]


def _start(jobs, args: list[str], agent: str = "a2c") -> subprocess.Popen:
    return jobs.start(["train", agent, *args, *TINY])


def test_owned_ranges_partition_the_actors_and_rows_round_trip() -> None:
    from popplay.deep.agents.a2c import Trajectory
    from popplay.deep.topologies.exarl_ranks import owned, quota, rows_trajectory, trajectory_rows

    for learners, actors in [(1, 1), (2, 3), (3, 2), (4, 10)]:
        blocks = [list(owned(i, learners, actors)) for i in range(learners)]
        assert sorted(a for b in blocks for a in b) == list(range(actors))
        assert all(len(b) in (actors // learners, -(-actors // learners)) for b in blocks)
    assert [quota(10, 3, i) for i in range(3)] == [4, 3, 3]
    g = torch.Generator().manual_seed(1)
    T = 5
    traj = Trajectory(torch.randn(T, 1, 4, generator=g), torch.randint(0, 2, (T, 1), generator=g),
                      torch.randn(T, 1, generator=g), torch.randn(T, 1, 4, generator=g), torch.zeros(T, 1),
                      torch.zeros(T, 1), torch.randn(T, 1, generator=g), torch.ones(T, 1))
    back = rows_trajectory(trajectory_rows(traj), 4)
    for name, a, b in zip(Trajectory._fields, traj, back):
        assert torch.equal(a, b.to(a.dtype)), name


def test_workflows_through_real_processes(jobs, tmp_path: Path) -> None:
    runs = {
        # Learner 0 owns actor 0, learner 1 actors 1 and 2 (range-based selection).
        "multi": _start(jobs, ["--workflow", "multi-learner", "--learners", "2", "--actors", "3", "--episodes", "15",
                         "--queue-capacity", "2", "--out", str(tmp_path / "multi.h5")]),
        "master": _start(jobs, ["--workflow", "master-learner", "--learners", "2", "--actors", "1", "--episodes", "6",
                          "--out", str(tmp_path / "master.h5")]),
        "central": _start(jobs, ["--workflow", "central-inference", "--actors", "2", "--episodes", "6",
                           "--out", str(tmp_path / "central.h5")]),
    }
    summaries = {name: jobs.summary(process, 150) for name, process in runs.items()}
    # A run with a budget it will not reach, stopped by Ctrl-C once it learns (started
    # after the others, so that its three ranks do not take their cores all along):
    # rank 0 stops the other learners (a stop round) and releases the actors.
    endless = _start(jobs, ["--workflow", "multi-learner", "--learners", "2", "--actors", "1", "--episodes", "1000000",
                      "--out", str(tmp_path / "stopped.h5")])
    deadline, played = time.monotonic() + 150, None
    # progress lines: "... episodes 2/1,000,000 ..."; a silent hang still ends, at the ranks' --timeout 60
    while played is None and time.monotonic() < deadline:
        line = endless.stderr.readline()
        assert line, "the run ended before it was stopped"
        progress = re.search(r"episodes ([\d,]+)/", line)
        played = progress and int(progress.group(1).replace(",", "")) or None
    assert played, "no episode played within 150 s"
    endless.send_signal(signal.SIGINT)
    stopped = jobs.summary(endless, 150, expect=130)
    assert stopped["complete"] is False and stopped["episodes"] > 0

    multi = summaries["multi"]
    assert multi["backend"] == "gloo" and multi["ranks"] == 5 and multi["topology"] == "multi-learner"
    # Every trajectory played was learned from exactly once: counts and an exact
    # order-free checksum of the rows, actors' side against learners' side.
    assert multi["topology_produced"] == multi["topology_reads"] == multi["episodes"] == 15
    assert multi["topology_produced_checksum"] == multi["topology_reads_checksum"]
    reads = [int(v) for v in multi["topology_reads_by_learner"].split(",")]
    assert len(reads) == 2 and sum(reads) == 15 and min(reads) > 0
    # Data-parallel: both learners applied the same mean gradients.
    sums = multi["topology_learner_params"].split(",")
    assert len(sums) == 2 and sums[0] == sums[1] and multi["topology_learners_identical"] == 1
    assert 0 < multi["updates"] <= 15 and 0 <= multi["topology_helped"] <= 15
    counters = load_run(tmp_path / "multi.h5").state_counters
    assert counters["topology_reads"] == 15 and counters["received"] == multi["env_steps"] > 0
    from popplay.cli.main import main

    assert main(["evaluate", str(tmp_path / "multi.h5"), "--episodes", "1", "--json"]) == 0  # in one process

    master = summaries["master"]
    assert master["ranks"] == 3 and master["topology"] == "master-learner"
    assert master["topology_produced"] == master["topology_reads"] == master["episodes"] == 6
    assert master["topology_produced_checksum"] == master["topology_reads_checksum"]
    handed = [int(v) for v in master["topology_reads_by_learner"].split(",")]
    assert handed[1] > 0  # learner 1 trained on batches learner 0 handed it
    assert master["topology_learners_identical"] == 1

    central = summaries["central"]
    assert central["ranks"] == 3 and central["topology"] == "central-inference"
    assert central["topology_produced"] == central["topology_reads"] == central["episodes"] == 6
    assert central["topology_produced_checksum"] == central["topology_reads_checksum"]
    assert central["updates"] == 6  # one update per completed episode, on the one model
    # Per step: each actor sends (2 obs + 5) float32, rank 0 sends back [flag, action] float64.
    steps = central["env_steps"]
    assert central["topology_bytes"] >= steps * ((2 * 4 + 5) * 4 + 16)


def test_replay_learners_through_real_processes(jobs, tmp_path: Path) -> None:
    """TD3 (multi-learner, range selection; central-inference) and DDPG with
    prioritised replay (master-learner): every episode played is stored exactly once,
    the learners run the updates owed for all of them, and their networks stay
    identical (each optimiser step on the gradient averaged over the learners)."""
    small = ["--env", "Pendulum-v1", "--batch-size", "16", "--learning-starts", "200"]
    runs = {
        "td3": _start(jobs, ["--workflow", "multi-learner", "--learners", "2", "--actors", "3", "--env-steps", "600",
                       *small, "--out", str(tmp_path / "td3.h5")], agent="td3"),
        # One actor, two episodes, three learners: learner 0 hands them to learners 1 and
        # 2 before keeping any, so it never holds replay and must still take part.
        "ddpg": _start(jobs, ["--workflow", "master-learner", "--learners", "3", "--actors", "1", "--env-steps", "400",
                        "--per", *small, "--out", str(tmp_path / "ddpg.h5")], agent="ddpg"),
        "central": _start(jobs, ["--workflow", "central-inference", "--actors", "2", "--env-steps", "800", *small,
                           "--out", str(tmp_path / "central.h5")], agent="td3"),
    }
    summaries = {name: jobs.summary(process, 150) for name, process in runs.items()}
    central = summaries["central"]
    assert central["ranks"] == 3 and central["env_steps"] == 800
    assert central["topology_produced"] == central["topology_reads"] == central["episodes"] == 4
    assert central["topology_produced_checksum"] == central["topology_reads_checksum"]
    # The one learner stores episodes one by one; the first already reaches
    # --learning-starts 200, so every step is paid for with one update.
    assert central["updates"] == 800
    # Per step: each actor sends (2 obs + 5) float32, rank 0 sends back [flag, action] float64.
    assert central["topology_bytes"] >= 800 * ((2 * 3 + 5) * 4 + 16)
    for name, ranks, learners, steps in (("td3", 5, 2, 600), ("ddpg", 4, 3, 400)):
        run = summaries[name]
        assert run["ranks"] == ranks and run["env_steps"] == steps and run["episodes"] == steps // 200
        assert run["topology_produced"] == run["topology_reads"] == run["episodes"]
        assert run["topology_produced_checksum"] == run["topology_reads_checksum"]
        assert run["topology_learners_identical"] == 1
        reads = [int(v) for v in run["topology_reads_by_learner"].split(",")]
        # Every learner reports; which one reads an episode is timing (an idle learner takes
        # trajectories of another's actors), so with three episodes one TD3 learner may
        # read them all (it did under CI's load). The others then hold no replay and take
        # part in each step with weight 0: the identical networks above, the updates below.
        assert len(reads) == learners and sum(reads) == run["episodes"]
        assert name != "ddpg" or reads == [0, 1, 1]
        # One update per env-step once 200 were stored, the round that crossed that
        # included (its first episode is 200 steps): every step was paid for.
        assert run["updates"] == steps
    counters = load_run(tmp_path / "ddpg.h5").state_counters
    assert counters["received"] == 400 and counters["updates"] == summaries["ddpg"]["updates"]
    from popplay.cli.main import main

    assert main(["evaluate", str(tmp_path / "td3.h5"), "--episodes", "1", "--json"]) == 0


@pytest.mark.parametrize("args,message", [
    (["train", "td3", "--workflow", "multi-learner", "--learners", "0", "--env-steps", "10"], "--learners"),
    (["train", "a2c", "--workflow", "multi-learner", "--actors", "0", "--episodes", "2"], "--actors"),
])
def test_workflow_usage_errors_are_one_line(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    from popplay.cli.main import main

    assert main([*args, "--out", str(tmp_path / "x.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and message in err[0], err
    assert not (tmp_path / "x.h5").exists()

"""Deep populations split over real ranks (gloo, ``--nproc``): bit-identical to one
process with every operator on, resumable on another number of ranks, and a lost rank
ends the job in bounded time with one line."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests._dist_helpers import WAIT, assert_same_run, popplay

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

FLAGS = ["train", "dqn", "--agents", "4", "--hidden", "16,16", "--batch-size", "8", "--replay", "300",
         "--learning-starts", "30", "--phase-steps", "50", "--eval-episodes", "1", "--seed", "3",
         "--hp", "lr=loguniform:1e-4:1e-2", "--replicate-every", "100", "--replicate-fraction", "0.5",
         "--share-every", "150", "--share-group", "2", "--differentiation", "0.001"]


def test_two_ranks_equal_one_process_and_resume_on_one(tmp_path: Path) -> None:
    from popplay.cli.main import main

    one, two, straight = tmp_path / "one.h5", tmp_path / "two.h5", tmp_path / "straight.h5"
    assert main([*FLAGS, "--env-steps", "1600", "--out", str(one)]) == 0
    done = popplay(*FLAGS, "--env-steps", "1600", "--nproc", "2", "--out", str(two), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # groups of two on two ranks: shares stay on a rank, but PBT copies cross (the best
    # and worst halves are anywhere), and every score and window is gathered
    assert summary["world_size"] == 2 and summary["replications"] >= 3 and summary["comm_calls"] > 0
    data = assert_same_run(one, two)  # curves, lineage, members, replay, environments, episodes
    assert len(data["state/lineage_event"]) > 8
    # the two-rank file goes on in one process, as if never split
    assert main(["train", "dqn", "--resume", str(two), "--env-steps", "2400"]) == 0
    assert main([*FLAGS, "--env-steps", "2400", "--out", str(straight)]) == 0
    assert_same_run(straight, two)


def test_torchrun_ranks_split_the_members_as_nproc_does(jobs, tmp_path: Path) -> None:
    """Under torchrun (as on a cluster) the world size comes from torchrun: the same
    split of the members, the same bits as one process."""
    import socket

    from popplay.cli.main import main

    one, ranked = tmp_path / "one.h5", tmp_path / "torchrun.h5"
    assert main([*FLAGS, "--env-steps", "800", "--out", str(one)]) == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = jobs.start(["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                          "-m", "popplay", *FLAGS, "--env-steps", "800", "--out", str(ranked)],
                         module="torch.distributed.run")
    jobs.finish(process, WAIT, expect=0)
    assert_same_run(one, ranked)


def test_a_killed_rank_ends_the_job_with_one_line_and_a_resumable_checkpoint(jobs, tmp_path: Path) -> None:
    from popplay.checkpoints.validation import summarize
    from popplay.distributed.launch import LOST_EXIT

    out = tmp_path / "run.h5"
    process = jobs.start([*FLAGS, "--env-steps", "40000000", "--checkpoint-every", "400", "--timeout", "20",
                          "--nproc", "2", "--out", str(out)])
    deadline = time.monotonic() + WAIT
    while not out.exists():
        assert process.poll() is None, process.communicate(timeout=30)
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    listing = os.popen(f"ps -ww -o pid=,args= --ppid {process.pid}").read()
    rank1 = next(int(line.split()[0]) for line in listing.splitlines() if "popplay rank 1/2" in line)
    os.kill(rank1, signal.SIGKILL)
    killed = time.monotonic()
    code, _, err = jobs.finish(process, WAIT)
    assert time.monotonic() - killed < 20 + 10 and code == LOST_EXIT
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "rank 1 of 2 was lost" in errors[0], err
    stored = summarize(out)
    assert not stored["complete"]
    from popplay.cli.main import main

    # In this process: the resume is one process, whose start-up would only add seconds.
    assert main(["train", "dqn", "--resume", str(out), "--env-steps", str(stored["progress"]["env_steps"] + 400)]) == 0


@pytest.mark.parametrize("ranking", [["--env", "popplay/Knights-v0", "--rank-by", "tournament"],
                                     ["--env", "CartPole-v1", "--rank-by", "greedy", "--rank-episodes", "2"]],
                         ids=["tournament", "greedy"])
def test_ranking_by_play_on_two_ranks_equals_one_process(tmp_path: Path, ranking: list[str]) -> None:
    """PBT ranking by games played for it, over ranks. Tournament: every rank keeps every
    game's board, acts for its own members, and the actions are gathered once per ply
    (knights, the two-player game popplay ships). Greedy: every rank plays its members'
    ranking episodes and the returns are gathered. The run file equals one process's."""
    from popplay.cli.main import main

    flags = ["train", "dqn", "--agents", "4", *ranking, "--hidden", "16", "--batch-size", "8",
             "--replay", "200", "--learning-starts", "20", "--phase-steps", "20", "--eval-episodes", "1",
             "--seed", "4", "--replicate-every", "40", "--replicate-fraction", "0.5", "--env-steps", "320"]
    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    assert main([*flags, "--out", str(one)]) == 0
    done = popplay(*flags, "--nproc", "2", "--out", str(two), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["replications"] == 2
    data = assert_same_run(one, two)
    assert len(data["state/lineage_event"]) > 4  # copies were made

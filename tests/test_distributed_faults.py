"""Faults of a sharded run through real ranks: a rank killed with SIGKILL ends the job
within the timeout with one line naming it and the last good checkpoint, which then
resumes bit-identically on a different number of ranks; Ctrl-C stops every rank and
saves once (exit 130)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests._dist_helpers import WAIT, assert_same_run

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

# Far more steps than the test lets it run: it is stopped (killed or interrupted) early.
LONG = ["train", "cartpole", "--agents", "4", "--trials", "16", "--agent-steps", "40000000", "--share-every", "25",
        "--bias", "0.5", "--test-steps", "20", "--test-starts", "1", "--seed", "9", "--checkpoint-every", "400",
        "--timeout", "20"]


def _start(jobs, out: Path, *extra: str) -> subprocess.Popen:
    return jobs.start([*LONG, "--out", str(out), "--nproc", "2", *extra])


def _wait_for_checkpoint(process: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + WAIT
    while not out.exists():
        assert process.poll() is None, process.communicate(timeout=30)
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


def _rank_pid(launcher: int, role: str) -> int:
    listing = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(launcher)], capture_output=True, text=True,
                             timeout=30).stdout
    for line in listing.splitlines():
        pid, args = line.strip().split(" ", 1)
        if role in args:
            return int(pid)
    raise AssertionError(f"no process with role {role!r} under {launcher}: {listing}")


def test_killed_rank_ends_job_and_checkpoint_resumes_on_one_rank(jobs, tmp_path: Path) -> None:
    from popplay.checkpoints.validation import summarize
    from popplay.cli.main import main
    from popplay.distributed.launch import LOST_EXIT

    out = tmp_path / "run.h5"
    process = _start(jobs, out)
    _wait_for_checkpoint(process, out)
    os.kill(_rank_pid(process.pid, "popplay rank 1/2"), signal.SIGKILL)
    killed = time.monotonic()
    code, _, err = jobs.finish(process, WAIT)
    assert time.monotonic() - killed < 20 + 10  # within --timeout (and the launcher's bounded clean-up)
    assert code == LOST_EXIT
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith("Error: rank 1 of 2 was lost (killed by SIGKILL); stopped the job; "
                                f"last good checkpoint: {out} (phase "), errors[0]
    stored = summarize(out)
    assert not stored["complete"]
    done = stored["progress"]["step"]
    target = (done + 3 * 25) * 4  # three more phases, in agent-steps per trial
    # Resume on ONE rank (the job had two) and compare with an uninterrupted single run.
    assert main(["train", "cartpole", "--resume", str(out), "--agent-steps", str(target), "--json"]) == 0
    fresh = tmp_path / "fresh.h5"
    assert main([*LONG[:LONG.index("--agent-steps")], "--agent-steps", str(target),
                 *LONG[LONG.index("--share-every"):LONG.index("--timeout")], "--out", str(fresh), "--json"]) == 0
    assert_same_run(fresh, out)


def test_ctrl_c_stops_every_rank_and_saves_once(jobs, tmp_path: Path) -> None:
    from popplay.checkpoints.validation import summarize

    out = tmp_path / "run.h5"
    process = _start(jobs, out, "--json")
    _wait_for_checkpoint(process, out)
    process.send_signal(signal.SIGINT)
    code, stdout, err = jobs.finish(process, WAIT)
    assert code == 130, err
    assert err.count("Stopping after the current phase") == 1  # rank 0 speaks for all
    assert "Error:" not in err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["complete"] is False
    stored = summarize(out)
    assert not stored["complete"] and stored["progress"]["step"] == summary["agent_steps_per_trial"] // 4


def test_torchrun_max_restarts_continues_from_the_checkpoint(jobs, tmp_path: Path) -> None:
    """An injected failure (SIGKILL of a worker) under ``torchrun --max-restarts 1``: the
    restarted workers continue from the checkpoint at --out, and the finished run file
    equals an uninterrupted one-process run."""
    from popplay.cli.main import main

    budget = ["--agent-steps", "24000"]
    # a short --timeout: the surviving worker, blocked in a collective with the killed one,
    # gives up after it (SIGTERM cannot reach it there) and torchrun restarts both sooner
    base = [*LONG[:LONG.index("--agent-steps")], *budget, *LONG[LONG.index("--share-every"):LONG.index("--timeout")],
            "--timeout", "5"]
    out = tmp_path / "run.h5"
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = jobs.start(["--nproc-per-node", "2", "--max-restarts", "1", "--master-addr", "127.0.0.1",
                          "--master-port", str(port), "-m", "popplay", *base, "--out", str(out), "--json"],
                         module="torch.distributed.run")
    _wait_for_checkpoint(process, out)
    workers = subprocess.run(["ps", "-o", "pid=", "--ppid", str(process.pid)], capture_output=True, text=True,
                             timeout=30).stdout.split()
    assert workers and process.poll() is None, "the job ended before the failure could be injected"
    os.kill(int(workers[-1]), signal.SIGKILL)
    code, stdout, err = jobs.finish(process, WAIT)
    assert code == 0, err
    assert json.loads(stdout.strip().splitlines()[-1])["complete"] is True
    fresh = tmp_path / "fresh.h5"
    assert main([*base[:base.index("--checkpoint-every")], "--out", str(fresh), "--json"]) == 0
    assert_same_run(fresh, out)


def test_a_rank_s_own_usage_error_is_not_reported_as_a_lost_rank(jobs, tmp_path):
    """Rank 0 refused a run file another process is writing (exit 2): the launcher stops
    rank 1, and used to call that a lost rank ("rank 0 of 2 was lost (exit code 2)")."""
    from popplay.checkpoints.lock import RunLock
    from popplay.cli.main import main

    out = tmp_path / "locked.h5"
    # Written in this process: a run file is the whole population's whoever wrote it, and
    # the ranks of a job of its own would cost seconds before the case starts.
    assert main(["train", "bandit", "--arms", "5", "--agents", "4", "--trials", "4", "--agent-steps", "64",
                 "--out", str(out)]) == 0
    with RunLock(out):  # another process, writing this file
        code, _, err = jobs.finish(jobs.start(["train", "bandit", "--resume", str(out), "--agent-steps", "128",
                                               "--nproc", "2"]), WAIT)
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "another popplay process is writing this run file" in errors[0], errors
    assert "was lost" not in errors[0]


def test_under_torchrun_a_refused_command_line_is_said_once(jobs, tmp_path: Path) -> None:
    """Every torchrun worker runs the whole command line: rank 0 says its warnings and
    its refusal once for the job (they used to come once per worker)."""
    out = tmp_path / "taken.h5"
    out.write_bytes(b"someone else's file")
    args = ["train", "bandit", "--arms", "5", "--agents", "4", "--trials", "4", "--agent-steps", "8",
            "--share-every", "16", "--out", str(out)]
    code, _, err = jobs.finish(jobs.start(["--standalone", "--nproc-per-node", "2", "-m", "popplay", *args],
                                          module="torch.distributed.run"), WAIT)
    assert code != 0
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    warnings = [line for line in err.splitlines() if line.startswith("Warning:")]
    assert len(errors) == 1 and "file exists" in errors[0], err
    assert len(warnings) == 1 and "--share-every 16" in warnings[0], err
    assert out.read_bytes() == b"someone else's file"


@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_stopped_during_start_up_ends_the_job_within_the_timeout_naming_it(jobs, tmp_path: Path,
                                                                                  victim: int) -> None:
    """Issue 31 #7: rank 0 stopped (SIGSTOP) as the ranks start hung the job for good (its
    peer waited on the store where c10d's timeout does not reach), and a stopped rank 1
    was reported as rank 0."""
    from popplay.distributed.launch import LOST_EXIT

    out = tmp_path / "stopped.h5"
    process = jobs.start(["train", "bandit", "--agents", "8", "--trials", "8", "--agent-steps", "100000000",
                          "--nproc", "2", "--timeout", "5", "--out", str(out)])
    deadline = time.monotonic() + WAIT
    pid = None
    while pid is None:
        assert time.monotonic() < deadline, "the ranks never started"
        try:
            pid = _rank_pid(process.pid, f"popplay rank {victim}/2")
        except AssertionError:
            time.sleep(0.01)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    code, _, err = jobs.finish(process, WAIT)
    assert time.monotonic() - stopped < 5 + 10  # --timeout, and the launcher's bounded clean-up
    assert code == LOST_EXIT
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith(f"Error: rank {victim} of 2 was lost (stopped by a signal"), err

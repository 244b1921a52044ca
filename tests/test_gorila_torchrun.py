"""``popplay train gorila`` under a real ``torchrun`` (python -m torch.distributed.run):
the ranks take their roles from their rank, the run file and summary are the local
launch's, a wrong world size is one line and exit 2, and ``--max-restarts`` continues
from the last checkpoint after a rank is killed."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from popplay.checkpoints.lock import LockBusy, RunLock, lock_path
from tests._dist_helpers import WAIT
from tests.test_gorila_cli import TINY, _gorila_ranks, _roles_running

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs


def _torchrun(jobs, nproc: int, *args: str, restarts: int = 0) -> subprocess.Popen:
    return jobs.start(["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(restarts), "-m",
                       "popplay", "train", "gorila", *args], module="torch.distributed.run")


def _pid_of(marker: str, role: str) -> int | None:
    return _gorila_ranks(marker).get(role)


def test_torchrun_runs_gorila_with_roles_from_ranks(jobs, tmp_path: Path) -> None:
    from popplay.checkpoints.validation import load_run
    from popplay.cli.main import main

    out = tmp_path / "g.h5"
    process = _torchrun(jobs, 4, "--actors", "1", "--learners", "1", "--shards", "2", "--env-steps", "300",
                        "--seed", "3", *TINY, "--out", str(out), "--json")
    roles: set[str] = set()
    refused = None  # whether a second writer of OUT was refused while the ranks ran
    deadline = time.monotonic() + WAIT
    while process.poll() is None and time.monotonic() < deadline:
        roles |= _roles_running(str(out) + ".parts")
        if refused is None and "shard 0" in roles:
            try:
                RunLock(out).acquire().release()
                refused = False
            except LockBusy:
                refused = True
            if process.poll() is not None:
                refused = None  # the job had ended: the check proves nothing
        time.sleep(0.1)
    code, stdout, stderr = jobs.finish(process, WAIT)
    assert code == 0, stderr
    # One writer per run file under torchrun too: shard 0 (rank 0 after its exec) holds
    # OUT's lock while the job runs, and gives it back at the end.
    assert refused is True
    assert not lock_path(out).exists()
    # torchrun's workers became the ranks of the local layout: shards first, then learners, actors.
    assert roles == {"shard 0", "shard 1", "learner 0", "actor 0"}
    summary = json.loads(stdout.strip().splitlines()[-1])  # rank 0 alone prints
    assert summary["complete"] and summary["lost"] == [] and summary["restarts"] == 0
    assert summary["launch"] == "torchrun" and summary["world_size"] == 4
    assert summary["env_steps"] >= 300 and summary["quality"] is not None and summary["seconds"] > 0
    # No transition lost between actor and learner; every gradient sent reached both shards.
    assert summary["transitions_received"] == summary["env_steps"]
    sent = summary["gradients_sent"]
    assert sent > 0 and summary["gradients_applied"] + summary["stale_discarded"] == 2 * sent
    stored = load_run(out, expected_domain="gorila")
    assert stored.complete and stored.curves["agent_steps"][-1] == summary["env_steps"]
    assert not (tmp_path / "g.h5.parts").exists()
    assert main(["evaluate", str(out), "--episodes", "2", "--json"]) == 0


def test_torchrun_with_the_wrong_world_size_is_one_line_and_exit_2(jobs, tmp_path: Path) -> None:
    out = tmp_path / "g.h5"
    process = _torchrun(jobs, 3, "--actors", "1", "--learners", "1", "--shards", "2", "--env-steps", "300",
                        "--out", str(out))
    code, stdout, stderr = jobs.finish(process, WAIT)
    assert code != 0  # torchrun's own verdict on failed workers
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, stderr  # rank 0 says it; the others exit quietly
    assert "torchrun started 3 ranks; this layout needs 4 (2 shards + 1 learner + 1 actor" in errors[0]
    assert re.search(r"exitcode\s*:\s*2\b", stderr), stderr  # every worker exited 2
    assert not out.exists() and not (tmp_path / "g.h5.parts").exists()


def test_torchrun_max_restarts_continues_from_the_checkpoint(jobs, tmp_path: Path) -> None:
    """A killed actor ends the attempt (torchrun stops every worker); the restarted
    attempt continues from the shards' checkpoint with what is left of the budget."""
    from popplay.checkpoints.validation import load_run

    out = tmp_path / "r.h5"
    process = _torchrun(jobs, 4, "--actors", "2", "--learners", "1", "--shards", "1", "--env-steps", "3000",
                        "--seed", "1", *TINY, "--out", str(out), "--json", restarts=1)
    marker = str(out) + ".parts/attempt-0/"
    deadline = time.monotonic() + WAIT
    victim = None
    # OUT appears once every shard saved its first checkpoint: the actors are playing.
    while (victim is None or not out.exists()) and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate(timeout=30)
        victim = _pid_of(marker, "actor 1")
        time.sleep(0.05)
    assert victim is not None and out.exists(), "the job never got going"
    assert load_run(out, expected_domain="gorila").complete is False  # a checkpoint, kept current
    os.kill(victim, signal.SIGKILL)
    code, stdout, stderr = jobs.finish(process, WAIT)
    assert code == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["complete"] and summary["restarts"] == 1
    # Both attempts' episodes count: the budget is played once (give or take the last
    # episode of each actor, and the killed actor's unsaved one).
    assert 3000 <= summary["env_steps"] < 3000 + 2 * 500
    stored = load_run(out, expected_domain="gorila")
    assert stored.complete and stored.state_counters["version"] == summary["server_versions"][0]
    assert stored.curves["agent_steps"][-1] == summary["env_steps"]
    assert not (tmp_path / "r.h5.parts").exists()


def test_a_restart_plays_what_is_left_of_the_budget() -> None:
    from popplay.deep.topologies.gorila import GorilaConfig, actor_budget, remaining

    config = GorilaConfig(actors=3, env_steps=1000, episodes=0)
    left, done = remaining(config, 400, 17)
    assert (left.env_steps, left.episodes, done) == (600, 0, False)
    # Less left than actors: each still gets a share (a share of 0 would mean "no budget").
    left, done = remaining(config, 999, 40)
    assert not done and all(actor_budget(a, left)[0] >= 1 for a in range(3))
    assert remaining(config, 1000, 40)[1] and remaining(config, 1200, 40)[1]
    both = GorilaConfig(actors=2, env_steps=1000, episodes=50)
    assert remaining(both, 300, 50)[1]  # whichever budget ends first
    left, done = remaining(both, 300, 20)
    assert (left.env_steps, left.episodes, done) == (700, 30, False)


def test_a_resume_under_torchrun_continues_the_run_s_history(jobs, tmp_path: Path) -> None:
    """The budget is the run's total and the curves go on from the stored ones, under
    torchrun as in the local launch; the run file plots and exports."""
    from popplay.checkpoints.validation import load_run
    from popplay.cli.main import main

    out = tmp_path / "g.h5"
    layout = ["--actors", "1", "--learners", "1", "--shards", "1"]
    assert main(["train", "gorila", *layout, "--env-steps", "300", "--seed", "2", *TINY, "--out", str(out),
                 "--json", "--quiet"]) == 0
    first = load_run(out, expected_domain="gorila").curves["agent_steps"]
    process = _torchrun(jobs, 3, "--resume", str(out), "--env-steps", "600", "--json")
    code, stdout, stderr = jobs.finish(process, WAIT)
    assert code == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert 600 <= summary["env_steps"] < 600 + 500 and summary["complete"]
    stored = load_run(out, expected_domain="gorila")
    steps = stored.curves["agent_steps"]
    assert list(steps[:len(first)]) == list(first) and steps[-1] == summary["env_steps"] > first[-1]
    assert not lock_path(out).exists()
    assert main(["export", str(out), "--out", str(tmp_path / "g.csv")]) == 0
    assert main(["plot", str(out), "--out", str(tmp_path / "g.png")]) == 0

"""``popplay train gorila`` through the real console script, and its usage errors."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from popplay.checkpoints import runfile
from popplay.checkpoints.validation import load_run
from popplay.cli.main import main
from popplay.core.hooks import variable

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

TINY = ["--hidden", "16", "--batch-size", "16", "--learning-starts", "64", "--update-ratio", "0.5",
        "--learner-sync", "2", "--actor-sync", "20", "--target-every", "10", "--eval-episodes", "2",
        "--timeout", "15"]


def _gorila_ranks(marker: str) -> dict[str, int]:
    """Role -> pid of the gorila ranks whose command line mentions ``marker`` (what ps shows)."""
    found: dict[str, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmd and "popplay gorila " in cmd:
            words = cmd.split("popplay gorila ", 1)[1].split(" ")
            found[f"{words[0]} {words[1]}"] = int(proc.name)
    return found


def _roles_running(marker: str) -> set[str]:
    return set(_gorila_ranks(marker))


@pytest.fixture(scope="module")
def console_run(tmp_path_factory) -> dict:
    """One ``popplay train gorila`` through the console script, with injected faults,
    watched while it runs: the roles of its ranks and the addresses its launcher listens
    on. Two tests read it, as a Gorila job starts five processes."""
    out = tmp_path_factory.mktemp("console") / "g.h5"
    process = subprocess.Popen(
        ["popplay", "train", "gorila", "--env", "CartPole-v1", "--actors", "1", "--learners", "1", "--shards", "2",
         "--env-steps", "400", "--seed", "3", *TINY, "--out", str(out), "--json",
         # k = 1e6: no natural gradient is an outlier, only the injected ones below.
         "--outlier-k", "1e6", "--outlier-window", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Injected faults: every 7th gradient sent claims parameters too old; every 11th
        # computed is scaled by 1e30.
        env={**os.environ, variable("inject_stale_every"): "7", variable("inject_huge_every"): "11"})
    roles: set[str] = set()
    listening: list[str] = []
    deadline = time.monotonic() + 150
    try:
        while process.poll() is None and time.monotonic() < deadline:
            roles |= _roles_running(str(out) + ".parts")
            if not listening:
                try:
                    listening = _listening(process.pid)
                except OSError:  # it ended between the poll and the look
                    pass
            time.sleep(0.1)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return {"out": out, "code": process.returncode, "stdout": stdout, "stderr": stderr, "roles": roles,
            "listening": listening}


def test_train_gorila_cli_writes_a_run_file_that_evaluate_reads(console_run, capsys):
    out = console_run["out"]
    assert console_run["code"] == 0, console_run["stderr"]
    assert console_run["roles"] == {"shard 0", "shard 1", "learner 0", "actor 0"}  # every rank findable by role
    summary = json.loads(console_run["stdout"])
    assert summary["complete"] and summary["lost"] == []
    assert summary["env_steps"] >= 400 and summary["quality"] is not None and summary["seconds"] > 0
    # No transition lost between actor and learner; every gradient sent reached both
    # shards, applied or dropped as stale.
    assert summary["transitions_received"] == summary["env_steps"]
    sent, updates = summary["gradients_sent"], summary["learner_updates"]
    assert sent > 20
    assert summary["gradients_applied"] + summary["stale_discarded"] == 2 * sent
    assert sum(summary["staleness_histogram"]) == 2 * sent
    # Exactly the injected gradients were dropped: the huge ones by the learner's
    # outlier guard, the stale ones by both shards. One learner refreshing every 2
    # updates sends ages 0 and 1 otherwise; the injected ones land in "older than 20".
    assert summary["outliers_discarded"] == updates // 11 and sent == updates - updates // 11
    stale = sent // 7
    assert summary["stale_discarded"] == 2 * stale
    histogram = summary["staleness_histogram"]
    assert histogram[-1] == 2 * stale and sum(histogram[2:-1]) == 0
    assert summary["server_versions"] == [sent - stale, sent - stale]
    stored = load_run(out, expected_domain="gorila")
    assert stored.complete and stored.state["params"].size == 4 * 16 + 16 + 16 * 2 + 2
    assert stored.curves["agent_steps"][-1] == summary["env_steps"]
    assert not out.with_name("g.h5.parts").exists()
    assert main(["evaluate", str(out), "--episodes", "2", "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["domain"] == "gorila" and evaluated["server_version"] == sent - stale


@pytest.mark.parametrize("args, message", [
    (["--actors", "1", "--learners", "2", "--env-steps", "100"], "every learner needs an actor"),
    (["--actors", "2"], "a budget is needed: --episodes, --env-steps or --time-budget"),
    (["--env", "NoSuchEnv-v0", "--env-steps", "100"], "NoSuchEnv-v0"),
])
def test_usage_errors_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert main(["train", "gorila", *args, "--out", str(tmp_path / "x.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and message in err[0], err
    assert not (tmp_path / "x.h5").exists()


def test_a_parts_directory_gorila_did_not_make_is_refused_and_kept(tmp_path, cli):
    parts = tmp_path / "victim.h5.parts"
    parts.mkdir()
    (parts / "thesis.txt").write_text("years of work")
    code, _, err = cli(["train", "gorila", "--env-steps", "100", *TINY, "--out", str(tmp_path / "victim.h5")])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "holds no popplay gorila working files" in lines[0], lines
    assert (parts / "thesis.txt").read_text() == "years of work"
    assert not (tmp_path / "victim.h5").exists()


def test_gorila_takes_the_run_files_lock(tmp_path, cli):
    from popplay.checkpoints.lock import RunLock

    out = tmp_path / "held.h5"
    # In this process: flock refuses a second open of the file within one process too,
    # so the refusal needs no process of its own.
    with RunLock(out):  # another writer of the same run file
        code, _, err = cli(["train", "gorila", "--env-steps", "100", *TINY, "--out", str(out)])
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Error: " in err
    assert not out.exists() and not (tmp_path / "held.h5.parts").exists()


def _listening(pid: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* has them) of the sockets ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1])
    return found


def test_the_local_launch_listens_on_loopback_only(console_run):
    assert console_run["code"] == 0, console_run["stderr"]
    seen = console_run["listening"]
    assert seen, "the launcher's store was never seen listening"
    assert all(address.startswith("0100007F:") for address in seen), seen  # 127.0.0.1


def test_a_resume_plays_to_the_runs_total_and_keeps_its_history(tmp_path, cli, small_run):
    """The budget is the run's total, as in every domain: the continuation plays what is
    left, counts and curves go on from the stored ones; the file plots and exports."""
    import shutil

    out = tmp_path / "r.h5"
    shutil.copy(small_run, out)  # the damage tests below copy the original
    first = load_run(out, expected_domain="gorila")
    played = int(first.state_counters["env_steps"])
    assert played >= SMALL_STEPS and first.curves["agent_steps"][-1] == played
    code, _, err = cli(["train", "gorila", "--resume", str(out), "--env-steps", str(played)])
    assert code == 2 and "already reached this budget" in err
    code, stdout, err = cli(["train", "gorila", "--resume", str(out), "--env-steps", "600", "--json"])
    assert code == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    after = load_run(out, expected_domain="gorila")
    total = int(after.state_counters["env_steps"])
    assert 600 <= total < 600 + 200 and summary["env_steps"] == total  # what was left, whole episodes
    steps, returns = after.curves["agent_steps"], after.curves["return"]
    n = first.curves["agent_steps"].size
    assert np.array_equal(steps[:n], first.curves["agent_steps"])
    assert np.array_equal(returns[:n], first.curves["return"])
    assert steps[-1] == total and bool(np.all(np.diff(steps) > 0))  # one history, never restarting
    assert int(after.state_counters["episodes"]) == steps.size
    assert cli(["plot", str(out), "--out", str(tmp_path / "r.png")])[0] == 0 and (tmp_path / "r.png").stat().st_size
    assert cli(["export", str(out), "--csv", "--out", str(tmp_path / "r.csv")])[0] == 0
    assert len((tmp_path / "r.csv").read_text().splitlines()) == steps.size + 1


def test_a_killed_launcher_leaves_a_run_file_that_resumes(tmp_path, jobs, cli):
    out = tmp_path / "k.h5"
    process = jobs.start(["train", "gorila", "--actors", "1", "--env-steps", "10000000", *TINY, "--out", str(out)])
    deadline = time.monotonic() + 90
    while not out.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert out.exists(), "no run file while the job ran"
    ranks = _gorila_ranks(str(out) + ".parts")
    assert ranks, "no ranks seen"
    os.kill(process.pid, signal.SIGKILL)  # the launcher, without any chance to clean up
    process.wait(timeout=30)
    gone = time.monotonic() + 30
    while _gorila_ranks(str(out) + ".parts") and time.monotonic() < gone:
        time.sleep(0.1)
    assert not _gorila_ranks(str(out) + ".parts"), "ranks outlived their launcher"
    kept = load_run(out, expected_domain="gorila")
    assert not kept.complete
    played = int(kept.state_counters["env_steps"])
    code, stdout, err = cli(["train", "gorila", "--resume", str(out), "--env-steps", str(played + 200), "--json"])
    assert code == 0, err
    after = load_run(out, expected_domain="gorila")
    assert after.complete and int(after.state_counters["env_steps"]) >= played + 200
    assert not (tmp_path / "k.h5.parts").exists()


def test_an_actor_lost_while_the_group_forms_restarts_the_start_and_the_run_goes_on(tmp_path, jobs):
    """Issue 30 #4: an actor killed before the ranks' group formed left the others in
    gloo's rendezvous for its 600 s transport timeout, then stopped the run."""
    out = tmp_path / "f.h5"
    process = jobs.start(["train", "gorila", "--actors", "2", "--env-steps", "300", *TINY, "--out", str(out)])
    deadline = time.monotonic() + 60
    victim = None
    while victim is None:  # killed as soon as it exists: it is still importing, far from the rendezvous
        assert time.monotonic() < deadline and process.poll() is None, "actor 1 never started"
        victim = _gorila_ranks(str(out) + ".parts").get("actor 1")
        time.sleep(0.01)
    os.kill(victim, signal.SIGKILL)
    code, _, err = jobs.finish(process, 120)
    assert code == 0, err
    assert "gorila: actor 1 was lost (killed by SIGKILL) while the ranks were forming their group; starting them " \
           "again" in err
    run = load_run(out, expected_domain="gorila")
    assert run.complete and int(run.state_counters["env_steps"]) >= 300


def test_an_actor_stopped_by_a_signal_is_lost_after_the_timeout_and_the_run_goes_on(tmp_path, jobs):
    """A rank stopped by SIGSTOP answers nothing: the launcher counts it lost after
    --timeout (as the --nproc launcher does) and Gorila's promise holds (a lost actor
    does not stop the run: actor 0 plays on)."""
    out = tmp_path / "s.h5"
    tiny = [*TINY[:TINY.index("--timeout")], "--timeout", "5"]
    # A budget the actors cannot finish here: the test ends the run itself (Ctrl-C).
    process = jobs.start(["train", "gorila", "--actors", "2", "--env-steps", "10000000", *tiny, "--out", str(out)])
    deadline = time.monotonic() + 90
    victim = None
    while victim is None or not out.exists():  # OUT appears once the shards saved: the actors are playing
        assert time.monotonic() < deadline and process.poll() is None, process.communicate(timeout=30)
        victim = _gorila_ranks(str(out) + ".parts").get("actor 1")
        time.sleep(0.05)
    os.kill(victim, signal.SIGSTOP)
    lost_line, steps = None, []
    deadline = time.monotonic() + 60
    while len(steps) < 2 and time.monotonic() < deadline:  # progress lines come every 2 s
        line = process.stderr.readline()
        assert line, "the job ended on its own"
        if "actor 1 lost" in line:
            lost_line = line.strip()
        elif lost_line is not None and "env-steps" in line:
            steps.append(int(line.split(" env-steps")[0].split()[-1].replace(",", "")))
    assert lost_line == "gorila: actor 1 lost (stopped by a signal (SIGSTOP?) for over 5s); the run goes on"
    assert len(steps) == 2 and steps[1] > steps[0], steps  # actor 0 still plays
    process.send_signal(signal.SIGINT)
    code, _, err = jobs.finish(process, 120)
    assert code == 130, err
    run = load_run(out, expected_domain="gorila")
    assert not run.complete and "actor 1 (stopped by a signal" in run.result_attrs["lost"]
    assert int(run.state_counters["env_steps"]) >= steps[1]


@pytest.mark.disk_size("4m")
def test_a_full_disk_ends_the_job_in_one_line_and_the_run_file_resumes(small_disk, jobs, cli):
    """Issue 31 #6: on a full disk a shard's save thread died with a traceback and the
    job hung past --timeout; now the rank that cannot save leaves, the job ends within
    the grace time, and the run file keeps its last checkpoint."""
    fs = small_disk.path
    out = fs / "g.h5"
    process = jobs.start(["train", "gorila", "--actors", "2", "--env-steps", "10000000", *TINY, "--out", str(out)])
    deadline = time.monotonic() + 90
    while not out.exists():
        assert process.poll() is None and time.monotonic() < deadline, "no run file while the job ran"
        time.sleep(0.1)
    small_disk.fill()
    filled = time.monotonic()
    code, _, err = jobs.finish(process, 60)
    assert time.monotonic() - filled < 15 + 10  # --timeout, and the launcher's grace
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code == 3 and len(errors) == 1 and "no space left on device" in errors[0], err
    assert "Traceback" not in err
    assert not (fs / "g.h5.parts").exists()
    kept = load_run(out, expected_domain="gorila")
    assert not kept.complete
    (fs / "filler").unlink()
    budget = int(kept.state_counters["env_steps"]) + 300
    code, _, err = cli(["train", "gorila", "--resume", str(out), "--env-steps", str(budget), "--quiet"])
    assert code == 0, err
    assert load_run(out, expected_domain="gorila").complete


SMALL_STEPS = 150


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """One small Gorila run file, trained once for the tests that copy it: the resume test
    above continues a copy, the tests below damage copies."""
    from popplay.cli.main import main as run

    out = tmp_path_factory.mktemp("gorila") / "small.h5"
    assert run(["train", "gorila", "--actors", "1", "--env-steps", str(SMALL_STEPS), *TINY, "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("damage", ["doubled params", "negative counter", "float counter", "nan accumulator",
                                    "hidden -1", "empty config"])
def test_a_damaged_gorila_file_is_refused_in_one_line(tmp_path, cli, small_run, damage):
    import shutil

    import h5py

    out = tmp_path / "d.h5"
    shutil.copy(small_run, out)
    with h5py.File(out, "r+") as f:  # as anyone can: the content checksum recomputed
        state = f["state"]
        if damage == "doubled params":
            params = state["params"][()]
            del state["params"]
            state["params"] = np.concatenate([params, params])
        elif damage == "nan accumulator":
            accumulator = state["accumulator"][()]
            accumulator[0] = np.nan
            state["accumulator"][...] = accumulator
        elif damage in ("negative counter", "float counter"):
            state.attrs["env_steps"] = -5 if damage == "negative counter" else 2.5
        else:
            config = {} if damage == "empty config" else {**json.loads(f["config"].attrs["config_json"]),
                                                           "hidden": [-1]}
            f["config"].attrs["config_json"] = np.bytes_(json.dumps(config).encode())
        f.attrs[runfile.DIGEST] = np.bytes_(runfile.content_digest(f).encode())
    for argv in (["train", "gorila", "--resume", str(out), "--env-steps", "400"],
                 ["evaluate", str(out), "--episodes", "1"]):
        code, _, err = cli(argv)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("Error: "), (argv, code, err)
        assert "internal error" not in lines[0]

"""Hostile and unlucky inputs (issue 18): what is not ours is never replaced, crafted
files cannot drive memory or crash a command, a full disk loses nothing, lock races."""
import errno
import json
import os
import stat
import threading
import time

import h5py
import numpy as np
import pytest

from popplay.checkpoints import h5io, runfile
from popplay.checkpoints.runfile import RunFileError
from popplay.checkpoints.validation import load_run
from popplay.cli.main import main

SMALL = ["train", "bandit", "--arms", "5", "--agents", "4", "--trials", "8", "--share-every", "4"]


def _train(path, steps=64, *extra):
    return main(SMALL + ["--agent-steps", str(steps), "--out", str(path), "--json", *extra])


def _step(path):
    with h5py.File(path, "r") as f:
        return int(f["state"].attrs["step"])


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "small.h5"
    assert _train(path) == 0
    return path


@pytest.fixture
def run_copy(small_run, tmp_path):
    path = tmp_path / "run.h5"
    path.write_bytes(small_run.read_bytes())
    return path


def _error_line(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("Error: ") and "internal error" not in err, err
    return err


# -- 1. never replace what is not ours -------------------------------------------


def test_fifos_and_directories_are_never_replaced(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _train(fifo, 64, "--overwrite") == 2
    assert "not a regular file" in _error_line(capsys)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "dir.h5").mkdir()
    assert _train(tmp_path / "dir.h5", 64, "--overwrite") == 2
    assert "directory" in _error_line(capsys)
    # the writer itself refuses too, whoever calls it
    with pytest.raises(h5io.OutputError):
        with h5io.atomic_output(fifo) as tmp_name:
            open(tmp_name, "w").close()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["dir.h5", "fifo"]


def test_plot_and_lineage_do_not_overwrite_a_run_file(run_copy, tmp_path, capsys):
    other = tmp_path / "other.h5"
    other.write_bytes(run_copy.read_bytes())
    before = other.read_bytes()
    assert main(["plot", str(run_copy), "--out", str(other)]) == 2
    assert "popplay run file" in _error_line(capsys)
    assert main(["lineage", str(run_copy), "--format", "csv", "--out", str(other)]) == 2
    _error_line(capsys)
    assert other.read_bytes() == before
    # a text export replaces text (a PNG replacing a PNG: test_a_successful_write_removes_...)
    text = tmp_path / "tree.txt"
    text.write_text("an older export\n")
    assert main(["lineage", str(run_copy), "--format", "csv", "--out", str(text)]) == 2  # bandit: no ids
    capsys.readouterr()


def test_resume_through_a_symlink_writes_the_target_and_keeps_its_mode(run_copy, tmp_path, capsys):
    os.chmod(run_copy, 0o600)
    owner = (1234, 1234) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(run_copy, *owner)
    link = tmp_path / "link.h5"
    link.symlink_to(run_copy.name)
    assert main(["train", "bandit", "--resume", str(link), "--agent-steps", "128", "--json"]) == 0
    capsys.readouterr()
    assert link.is_symlink() and os.readlink(link) == run_copy.name
    info = os.stat(run_copy)
    assert _step(run_copy) == 32 and stat.S_IMODE(info.st_mode) == 0o600 and (info.st_uid, info.st_gid) == owner
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.h5", "run.h5"]  # nothing left beside it


def test_read_only_and_hard_linked_files_are_refused(run_copy, tmp_path, capsys):
    os.chmod(run_copy, 0o444)
    assert _train(run_copy, 64, "--overwrite") == 2
    assert "read-only" in _error_line(capsys)
    os.chmod(run_copy, 0o644)
    os.link(run_copy, tmp_path / "twin.h5")
    assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "128"]) == 2
    assert "hard links" in _error_line(capsys)
    assert _step(run_copy) == 16 and os.stat(run_copy).st_nlink == 2


def test_overwrite_replaces_only_regular_files(tmp_path, capsys):
    foreign = tmp_path / "notes.txt"
    foreign.write_text("mine")
    assert _train(foreign) == 2  # no --overwrite
    assert "exists" in _error_line(capsys) and foreign.read_text() == "mine"
    assert _train(foreign, 64, "--overwrite") == 0
    capsys.readouterr()
    assert load_run(foreign).complete


# -- crafted files -------------------------------------------------------------------


def _craft(path, mutate, digest=True):
    """Edit a run file with h5py and recompute its (unkeyed) checksum, as anyone can."""
    with h5py.File(path, "a") as f:
        mutate(f)
        if digest:
            f.attrs[runfile.DIGEST] = np.bytes_(runfile.content_digest(f).encode())
    return path


def _set_config(**changes):
    def mutate(f):
        config = json.loads(f["config"].attrs["config_json"].decode())
        config.update(changes)
        f["config"].attrs["config_json"] = np.bytes_(json.dumps(config).encode())
    return mutate


def _replace(name, **create):
    def mutate(f):
        del f[name]
        f.create_dataset(name, **create)
    return mutate


# -- 2. bounded memory on any file ----------------------------------------------------


def test_tiny_chunks_and_unwritten_datasets_are_refused_before_reading(run_copy, tmp_path, capsys):
    chunky = tmp_path / "chunky.h5"
    chunky.write_bytes(run_copy.read_bytes())
    # 65,536 chunks of one value: HDF5's own bookkeeping grows with the chunk count
    _craft(chunky, _replace("state/q", data=np.zeros(2**16), chunks=(1,)), digest=False)
    hollow = tmp_path / "hollow.h5"
    hollow.write_bytes(run_copy.read_bytes())
    _craft(hollow, _replace("state/q", shape=(2**27,), dtype="f8"), digest=False)  # 1 GiB declared, none stored
    assert hollow.stat().st_size < 100_000
    for path, reason in ((chunky, "chunks"), (hollow, "stores only")):
        for argv in (["evaluate", str(path)], ["inspect", str(path)], ["plot", str(path)],
                     ["lineage", str(path)], ["train", "bandit", "--resume", str(path), "--agent-steps", "128"]):
            assert main(argv) == 2, argv
            assert reason in _error_line(capsys), argv


def test_a_figure_file_declaring_a_huge_dataset_is_refused(tmp_path, capsys):
    path = tmp_path / "figure.h5"
    with h5py.File(path, "w") as f:
        f.attrs["format"] = np.bytes_(b"popplay-figure")
        f.attrs["schema_version"] = 1
        f.create_group("curve").create_dataset("y", shape=(2**27,), dtype="f8")
    assert main(["plot", str(path)]) == 2
    assert "stores only" in _error_line(capsys)


def test_a_config_declaring_a_billion_agents_is_refused(run_copy, capsys, monkeypatch):
    monkeypatch.setenv("POPPLAY_MAX_MEMORY", "4G")
    _craft(run_copy, _set_config(agents=10**9))
    assert main(["evaluate", str(run_copy)]) == 2
    err = _error_line(capsys)
    assert "needs about" in err and "4.0 GB available" in err
    assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "2000000000"]) == 2
    assert "needs about" in _error_line(capsys)


def test_loading_is_refused_when_the_arrays_exceed_available_memory(run_copy, monkeypatch):
    monkeypatch.setenv("POPPLAY_MAX_MEMORY", "1K")  # the arrays need more than half of this
    with pytest.raises(RunFileError, match="memory"):
        load_run(run_copy)
    monkeypatch.delenv("POPPLAY_MAX_MEMORY")
    assert load_run(run_copy).complete


# -- 3. disk full ------------------------------------------------------------------


def test_simulated_disk_full_keeps_the_previous_file_and_rescues_the_state(run_copy, tmp_path, capsys,
                                                                            monkeypatch):
    before = run_copy.read_bytes()
    rescue = tmp_path / "rescue"
    rescue.mkdir()
    monkeypatch.setenv("POPPLAY_RESCUE_DIR", str(rescue))
    real_fsync = os.fsync

    def fsync(fd):  # the disk fills up as the new run file is flushed beside the old one
        name = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if os.path.dirname(name) == str(tmp_path) and name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "128"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"Error: no space left on device: the run file at {run_copy} still holds step 16")
    rescued = list(rescue.iterdir())
    assert len(rescued) == 1 and str(rescued[0]) in err
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert run_copy.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rescue", "run.h5"]  # no temp, no lock left
    assert _step(rescued[0]) == 32 and load_run(rescued[0]).complete


def test_disk_full_on_a_real_small_file_system(small_run, small_disk, tmp_path, capsys, monkeypatch):
    fs = small_disk.path
    path = fs / "run.h5"
    path.write_bytes(small_run.read_bytes())
    small_disk.fill()
    monkeypatch.setenv("POPPLAY_RESCUE_DIR", str(tmp_path))
    assert main(["train", "bandit", "--resume", str(path), "--agent-steps", "128"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"no space left on device: the run file at {path} still holds step 16" in err
    assert "saved to" in err and _step(path) == 16 and load_run(path).complete
    assert sorted(p.name for p in fs.iterdir()) == ["filler", "run.h5"]
    assert len(list(tmp_path.glob("run-rescued-*.h5"))) == 1


# -- 4. everything saved is validated before training -----------------------------------


def test_unstorable_seed_and_long_names_are_handled_before_training(tmp_path, capsys):
    assert _train(tmp_path / "s.h5", 64, "--seed", str(2**64)) == 2
    assert "--seed" in _error_line(capsys) and not (tmp_path / "s.h5").exists()
    long = tmp_path / ("a" * 242 + ".h5")  # a legal name; ".NAME.XXXXXXXX.tmp" would not be
    assert _train(long, 64, "--checkpoint-every", "32") == 0
    assert main(["train", "bandit", "--resume", str(long), "--agent-steps", "128", "--checkpoint-every", "32",
                 "--json"]) == 0
    capsys.readouterr()
    assert _step(long) == 32 and sorted(p.name for p in tmp_path.iterdir()) == [long.name]


# -- 5. lock races -----------------------------------------------------------------


def test_a_writer_that_opened_the_lock_file_before_its_release_does_not_get_in(tmp_path, monkeypatch):
    from popplay.checkpoints import lock as lockmod

    path = tmp_path / "run.h5"
    first = lockmod.RunLock(path).acquire()
    opened, go_on, outcome = threading.Event(), threading.Event(), {}

    def pause():  # only the late writer waits, between opening the old lock file and locking it
        if threading.current_thread().name == "late":
            opened.set()
            assert go_on.wait(10)

    def late():
        try:
            lockmod.RunLock(path).acquire()
            outcome["late"] = "locked"
        except lockmod.LockBusy:
            outcome["late"] = "refused"

    monkeypatch.setattr(lockmod, "_BEFORE_LOCK", pause)
    thread = threading.Thread(target=late, name="late")
    thread.start()
    assert opened.wait(10)
    first.release()  # the late writer still holds the old lock file open
    third = lockmod.RunLock(path).acquire()  # a new writer takes the lock under the name
    go_on.set()
    thread.join(10)
    assert outcome == {"late": "refused"}  # one writer at a time, even across a release
    third.release()
    assert not lockmod.lock_path(path).exists()


def test_resume_takes_the_lock_before_reading(run_copy, capsys, monkeypatch):
    from popplay.training.pipeline import RunLock

    reads = []
    real = runfile.read_run
    monkeypatch.setattr(runfile, "read_run", lambda *a, **k: reads.append(a) or real(*a, **k))
    with RunLock(run_copy):
        assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "128"]) == 2
        assert "another popplay process" in _error_line(capsys)
        assert reads == []  # refused before the file was read
    assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "128", "--json"]) == 0
    capsys.readouterr()
    assert len(reads) == 1 and _step(run_copy) == 32
    with RunLock(run_copy):  # released when the command ended
        pass


# -- 6. crafted files: one line, never an internal error; nonsense refused -------------------


@pytest.fixture(scope="module")
def domain_runs(small_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("domains")
    runs = {"bandit": small_run, "cartpole": root / "cartpole.h5", "knights": root / "knights.h5"}
    assert main(["train", "cartpole", "--agents", "2", "--trials", "2", "--agent-steps", "256", "--share-every", "64",
                 "--replicate-every", "1", "--out", str(runs["cartpole"]), "--json"]) == 0
    assert main(["train", "knights", "--agents", "2", "--games-per-agent", "2", "--episodes", "4", "--hidden", "2",
                 "--eval-every", "2", "--eval-games", "2", "--snapshot-every", "2", "--out", str(runs["knights"]),
                 "--json"]) == 0
    return runs


def _attr(group, **values):
    def mutate(f):
        for name, value in values.items():
            f[group].attrs[name] = np.bytes_(value.encode()) if isinstance(value, str) else value
    return mutate


def _json_config(text):
    def mutate(f):
        f["config"].attrs["config_json"] = np.bytes_(text.encode())
    return mutate


def _without_backend(f):
    config = json.loads(f["config"].attrs["config_json"].decode())
    del config["backend"]
    f["config"].attrs["config_json"] = np.bytes_(json.dumps(config).encode())


def _dataset(name, transform):
    def mutate(f):
        data = transform(f[name][()])
        del f[name]
        f[name] = data
    return mutate


def _duplicate_ids(ids):
    ids = ids.copy()
    ids.reshape(-1)[1] = ids.reshape(-1)[0]
    return ids


# (domain, name, mutation, refused by every command that loads the population)
CRAFTED = [
    ("bandit", "config is a list", _json_config("[1, 2]"), "all"),
    ("bandit", "config is null", _json_config("null"), "all"),
    ("bandit", "config is a number", _json_config("3"), "all"),
    ("bandit", "a trillion agents", _set_config(agents=10**12), "all"),
    ("bandit", "1e30 arms", _set_config(arms=1e30), "all"),
    ("bandit", "string trials", _set_config(trials="8"), "all"),
    ("bandit", "NaN epsilon", _set_config(epsilon=float("nan")), "all"),
    ("bandit", "NaN counter", _attr("state", step=float("nan")), "all"),
    ("bandit", "string counter", _attr("state", step="16"), "all"),
    ("bandit", "negative counter", _attr("state", step=-5), "all"),
    ("bandit", "2-D curve", _dataset("curves/quality", lambda q: np.stack([q, q])), "load"),
    ("bandit", "no backend", _without_backend, False),  # resume needs it; evaluate does not
    ("cartpole", "alpha -1", _set_config(alpha=-1.0), "all"),
    ("cartpole", "lam 5", _set_config(lam=5.0), "all"),
    ("cartpole", "duplicate agent ids", _dataset("state/agent_id", _duplicate_ids), "load"),
    ("cartpole", "lineage parent out of range", _dataset("state/lineage_parent", lambda p: p + 10**6), "load"),
    ("cartpole", "negative per-agent alpha", _dataset("state/alpha", lambda a: -a), "load"),
    ("knights", "negative evaluation record", _dataset("state/eval_record", lambda r: r - 5), "load"),
    ("knights", "lam 5", _set_config(lam=5.0), "all"),
    # The 2026-11-26 campaign's internal errors (benchmarks/hostile_files.py):
    ("bandit", "given options not a JSON object", _attr("/", given_json="text"), "all"),
    ("bandit", "history not a JSON list", _attr("/", history_json='{"a": 1}'), "all"),
    ("cartpole", "a counter stored as an array", _attr("state", max_bias=np.array([1.0, 2.0])), "all"),
    ("cartpole", "a device that is a list", _set_config(device=[]), False),
]


@pytest.mark.parametrize("domain,name,mutate,refused", CRAFTED, ids=[c[1] for c in CRAFTED])
def test_crafted_files_get_one_line_refusals(domain_runs, tmp_path, capsys, domain, name, mutate, refused):
    path = tmp_path / f"{domain}.h5"
    path.write_bytes(domain_runs[domain].read_bytes())
    _craft(path, mutate)
    budget = ["--episodes", "8"] if domain == "knights" else ["--agent-steps", "100000"]
    commands = [["evaluate", str(path)] + (["--games", "2"] if domain == "knights" else []),
                ["train", domain, "--resume", str(path), *budget, "--json"],
                ["inspect", str(path)], ["lineage", str(path), "--format", "csv"]]
    if domain == "bandit":  # drawing is slow; every domain's curves load the same way
        commands.append(["plot", str(path), "--out", str(tmp_path / "p.png")])
    for argv in commands:
        code = main(argv)
        out, err = capsys.readouterr()
        assert "internal error" not in err and "Traceback" not in err, (argv, err)
        assert code in (0, 2), (argv, code, err)
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and err.startswith("Error: "), (argv, err)
        if argv[0] == "train" or (refused and argv[0] != "inspect") or refused == "all":
            assert code == 2, (argv, out)


# -- 7. memory checks from options ------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["train", "bandit", "--agents", "100000", "--trials", "10000"],
    ["train", "knights", "--agents", "20000", "--hidden", "1024"],
    ["train", "knights", "--games-per-agent", "1000000000"],
    ["train", "cartpole", "--agents", "100000", "--trials", "100000"],
])
def test_runs_too_big_for_memory_are_refused_before_allocating(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POPPLAY_MAX_MEMORY", "16G")
    assert main(argv + ["--out", str(tmp_path / "big.h5")]) == 2
    err = _error_line(capsys)
    assert "needs about" in err and "16.0 GB available" in err
    assert list(tmp_path.iterdir()) == []


def test_evaluate_games_too_many_for_memory(domain_runs, capsys, monkeypatch):
    monkeypatch.setenv("POPPLAY_MAX_MEMORY", "16G")
    assert main(["evaluate", str(domain_runs["knights"]), "--games", "10000000000"]) == 2
    assert "needs about" in _error_line(capsys)


def test_memory_estimates_grow_with_the_population():
    from popplay.games.bandit.rules import BanditParams
    from popplay.core.limits import parse_bytes
    from popplay.games.bandit import memory_bytes as bandit_bytes

    small, big = BanditParams(agents=10, trials=10), BanditParams(agents=1000, trials=1000)
    # measured: 1000 x 1000 agents, 100 arms, share every 16 took about 430 MB over an empty run
    assert 300 * 2**20 < bandit_bytes(big) - bandit_bytes(small) < 600 * 2**20
    assert parse_bytes("16G") == 16 * 2**30 and parse_bytes("512k") == 512 * 1024


# -- 8. stale temp files ------------------------------------------------------------------


def test_a_successful_write_removes_its_own_stale_temp_files(run_copy, tmp_path, capsys):
    stale = tmp_path / ".run.h5.abcd1234.tmp"
    stale.write_bytes(b"x" * 1000)
    other = tmp_path / ".other.h5.abcd1234.tmp"  # another file's: not ours
    other.write_bytes(b"x")
    assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "128", "--json"]) == 0
    capsys.readouterr()
    assert not stale.exists() and other.exists()
    # without the run file's lock (plots, exports), only temps older than an hour go
    png = tmp_path / "c.png"
    fresh, old = tmp_path / ".c.png.fresh123.tmp", tmp_path / ".c.png.old12345.tmp"
    for path in (fresh, old):
        path.write_bytes(b"x")
    os.utime(old, (1, 1))
    assert main(["plot", str(run_copy), "--out", str(png)]) == 0
    capsys.readouterr()
    assert fresh.exists() and not old.exists()


# -- 9. options ----------------------------------------------------------------------


@pytest.mark.parametrize("extra", [
    ["--checkpoint-every", "inf"], ["--checkpoint-every", "1e400"], ["--checkpoint-every", ""],
    ["--checkpoint-every", "nan"], ["--time-budget", "inf"], ["--time-budget", "nan"],
    ["--agents", str(2**63)], ["--agents", str(2**63), "--agent-steps", str(2**65)], ["--seed", str(-2**64)],
])
def test_bad_options_are_one_line_usage_errors(extra, tmp_path, capsys):
    assert main(SMALL + ["--agent-steps", "64", "--out", str(tmp_path / "o.h5"), *extra]) == 2
    _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


# -- 10. signals at start-up, extending a time-budget run ----------------------------------


def test_ctrl_c_at_start_up_is_one_line(tmp_path):
    import subprocess
    import sys
    import time

    script = ("import sys; sys.stderr.write('ready\\n'); sys.stderr.flush()\n"
              "from popplay._entry import entry_point; entry_point()")
    for delay in (0.01, 0.1, 0.3):
        proc = subprocess.Popen([sys.executable, "-c", script, *SMALL, "--agent-steps", "64", "--out",
                                 str(tmp_path / f"r{delay}.h5"), "--json"], stderr=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True)
        assert proc.stderr.readline() == "ready\n"
        time.sleep(delay)
        proc.send_signal(2)
        err = proc.communicate(timeout=120)[1]
        assert "Traceback" not in err, (delay, err)
        assert proc.returncode in (130, 0), (delay, proc.returncode, err)
        if proc.returncode == 130:
            assert "Error: interrupted" in err or "Stopped early" in err or "Interrupted" in err, err


def test_a_stop_request_in_the_last_phase_exits_130_with_a_complete_file(tmp_path, capsys, monkeypatch):
    from contextlib import contextmanager

    from popplay.training import job

    calls = []

    @contextmanager
    def stop_after_the_loop():  # the runner asks once per phase (4 here); the request comes later
        yield lambda: calls.append(1) or len(calls) > 4

    monkeypatch.setattr(job, "stop_on_signals", stop_after_the_loop)
    path = tmp_path / "r.h5"
    assert _train(path) == 130
    assert "is complete" in capsys.readouterr().err
    assert load_run(path).complete and _step(path) == 16


def test_a_time_budget_run_can_be_extended(tmp_path, capsys):
    path = tmp_path / "t.h5"
    assert main(SMALL + ["--time-budget", "0.05", "--out", str(path), "--json"]) == 0
    capsys.readouterr()
    done = _step(path)
    assert main(["train", "bandit", "--resume", str(path), "--agent-steps", str(4 * (done + 8)), "--json"]) == 0
    capsys.readouterr()  # its status lines (on stderr with --json too)
    assert _step(path) == done + 8
    learned = load_run(path).attrs["learning_seconds"]
    assert main(["train", "bandit", "--resume", str(path), "--time-budget", str(learned / 2)]) == 2
    assert "already learned" in _error_line(capsys)
    assert main(["train", "bandit", "--resume", str(path), "--time-budget", str(learned + 0.05), "--json"]) == 0
    capsys.readouterr()
    assert _step(path) > done + 8 and load_run(path).config["time_budget"] == pytest.approx(learned + 0.05)


# -- 11. inspect checks the checksum; link messages ---------------------------------------


def test_inspect_verifies_the_checksum_and_names_links_plainly(run_copy, tmp_path, capsys):
    assert main(["inspect", str(run_copy)]) == 0
    assert "verified" in capsys.readouterr().out
    _craft(run_copy, _dataset("state/q", lambda q: q + 1), digest=False)
    assert main(["inspect", str(run_copy)]) == 2
    assert "checksum" in _error_line(capsys)
    linked = tmp_path / "linked.h5"
    linked.write_bytes(run_copy.read_bytes())
    _craft(linked, lambda f: f.__setitem__("extra", h5py.ExternalLink("/etc/passwd", "/")), digest=False)
    assert main(["inspect", str(linked)]) == 2
    err = _error_line(capsys)
    assert "ExternalLink at /extra;" in err and "//" not in err


def _drop_config(*names):
    def mutate(f):
        config = json.loads(f["config"].attrs["config_json"].decode())
        for name in names:
            config.pop(name)
        f["config"].attrs["config_json"] = np.bytes_(json.dumps(config).encode())
    return mutate


def test_a_missing_setting_is_refused_not_defaulted(run_copy, capsys):
    """An 8-agent run whose config lost ``agents`` must not resume as 256 agents."""
    _craft(run_copy, _drop_config("agents"))
    assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "128"]) == 2
    assert "no agents" in _error_line(capsys)
    assert main(["evaluate", str(run_copy)]) == 2
    assert "no agents" in _error_line(capsys)


def test_files_from_before_the_mark_still_default_settings_added_later(run_copy, capsys):
    def older(f):  # as written before config_complete existed, and before --explorer-fraction did
        del f.attrs["config_complete"], f.attrs["config_settings"]
        _drop_config("explorer_fraction")(f)

    _craft(run_copy, older)
    assert main(["evaluate", str(run_copy), "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("vintage", ["settings list without it", "complete mark without a list"])
def test_a_setting_added_after_the_file_was_written_takes_its_default(run_copy, capsys, vintage):
    """A file written before --explorer-fraction existed: its writer's settings list lacks
    it (or, from before the list, the file has only the "every setting" mark, which a later
    setting made untrue): evaluate and resume give it its default instead of calling the
    file damaged (they did, for every knights run written before --start-width)."""
    def older(f):
        _drop_config("explorer_fraction")(f)
        if vintage.startswith("settings list"):
            names = json.loads(f.attrs["config_settings"])
            f.attrs["config_settings"] = json.dumps([n for n in names if n != "explorer_fraction"])
        else:
            del f.attrs["config_settings"]

    _craft(run_copy, older)
    assert main(["evaluate", str(run_copy), "--json"]) == 0
    capsys.readouterr()
    assert main(["train", "bandit", "--resume", str(run_copy), "--agent-steps", "128", "--quiet"]) == 0
    capsys.readouterr()


def test_a_settings_list_that_is_not_one_is_damage(run_copy, capsys):
    _craft(run_copy, lambda f: f.attrs.__setitem__("config_settings", "[1, 2"))
    assert main(["evaluate", str(run_copy)]) == 2
    assert "config_settings" in _error_line(capsys)


def test_inspect_shows_a_crafted_attribute_without_running_its_escapes(run_copy, capsys):
    def hostile(f):
        f.attrs["host"] = np.bytes_("vm\x1b]0;pwned\x07\x1b[2J[bold]x[/bold]".encode())

    _craft(run_copy, hostile)
    assert main(["inspect", str(run_copy)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out  # no terminal title change, no cleared screen
    assert "\\x1b]0;pwned\\x07" in out.replace("\n", "").replace("│", "").replace(" ", "")
    assert "[bold]x[/bold]" in out.replace("\n", "").replace("│", "").replace(" ", "")  # markup shown, not run


def test_crafted_share_counters_are_refused_or_cost_nothing(tmp_path, capsys):
    """shares = 10^12 made evaluate spin at 100 % CPU replaying the bias decay of every share."""
    run = tmp_path / "cp.h5"
    assert main(["train", "cartpole", "--agents", "4", "--trials", "2", "--agent-steps", "256", "--share-every", "64",
                 "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()

    def counters(**values):
        def mutate(f):
            for name, value in values.items():
                f["state"].attrs[name] = np.int64(value)
        return mutate

    impossible = tmp_path / "impossible.h5"
    impossible.write_bytes(run.read_bytes())
    _craft(impossible, counters(shares=10**12))
    for argv in (["evaluate", str(impossible)], ["inspect", str(impossible)]):
        assert main(argv) == 2
        assert "exceeds step" in _error_line(capsys)
    huge = tmp_path / "huge.h5"
    huge.write_bytes(run.read_bytes())
    _craft(huge, counters(shares=10**12, step=10**12))
    started = time.perf_counter()
    assert main(["evaluate", str(huge), "--json"]) == 0  # what the file says, measured: no loop over shares
    assert time.perf_counter() - started < 30  # a guard against the hang, not a speed goal
    capsys.readouterr()


@pytest.mark.parametrize("domain", ["dqn", "reinforce", "a2c", "td3"])
def test_a_network_too_wide_for_the_machine_is_one_line_before_any_allocation(tmp_path, capsys, domain):
    out = tmp_path / "wide.h5"
    assert main(["train", domain, "--hidden", "100000,100000", "--episodes", "1", "--out", str(out)]) == 2
    assert "GB of memory" in _error_line(capsys) and not out.exists()


def test_a_crafted_deep_width_is_damage_not_a_40_gb_allocation(tmp_path, capsys):
    run = tmp_path / "dqn.h5"
    assert main(["train", "dqn", "--episodes", "2", "--hidden", "8", "--learning-starts", "8", "--eval-episodes", "1",
                 "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    _craft(run, _set_config(hidden=[100000, 100000]))
    for argv in (["evaluate", str(run)], ["train", "dqn", "--resume", str(run), "--episodes", "4"]):
        assert main(argv) == 2
        assert "GB of memory" in _error_line(capsys)

"""Checkpoints, resume, stop requests, a second writer, kills and corrupted files."""
import json
import random
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from popplay.checkpoints.validation import load_run
from popplay.cli.main import main
from popplay.games.bandit.rules import BanditParams
from popplay.training.pipeline import RunLock, TrainOptions, train
from popplay.core.errors import UsageError

BANDIT = ["train", "bandit", "--arms", "20", "--agents", "8", "--trials", "16", "--share-every", "8"]


def _arrays(path):
    with h5py.File(path) as f:
        return {name: f[name][()] for name in ("state/q", "state/n", "curves/agent_steps", "curves/quality")}


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, capsys):
    half, whole = tmp_path / "half.h5", tmp_path / "whole.h5"
    assert main(BANDIT + ["--agent-steps", "512", "--out", str(half), "--json"]) == 0
    assert main(["train", "bandit", "--resume", str(half), "--agent-steps", "1024", "--json"]) == 0
    assert main(BANDIT + ["--agent-steps", "1024", "--out", str(whole), "--json"]) == 0
    capsys.readouterr()
    a, b = _arrays(half), _arrays(whole)
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    assert load_run(half).complete


def test_resume_refuses_changed_settings_and_shrinking_budgets(tmp_path, capsys):
    path = tmp_path / "r.h5"
    assert main(BANDIT + ["--agent-steps", "256", "--out", str(path), "--json"]) == 0
    capsys.readouterr()
    assert main(["train", "bandit", "--resume", str(path), "--epsilon", "0.3"]) == 2
    assert "--epsilon" in capsys.readouterr().err
    assert main(["train", "bandit", "--resume", str(path), "--agent-steps", "64"]) == 2
    assert "already learned" in capsys.readouterr().err
    assert main(["train", "bandit", "--resume", str(tmp_path / "none.h5")]) == 2


def test_stop_request_saves_a_resumable_checkpoint(tmp_path):
    params = BanditParams(arms=20, agents=8, trials=16, steps_per_agent=128, share_every=8)
    calls = {"n": 0}

    def stop_after_three():
        calls["n"] += 1
        return calls["n"] > 3

    out = tmp_path / "stopped.h5"
    outcome = train("bandit", params, TrainOptions(out=out), should_stop=stop_after_three)
    assert not outcome.summary["complete"]
    stored = load_run(out)
    assert not stored.complete and stored.state_counters["step"] == 24
    resumed = train("bandit", params, TrainOptions(out=out), resume=stored)
    whole = train("bandit", params, TrainOptions(out=tmp_path / "whole.h5"))
    assert np.array_equal(resumed.result.state.q, whole.result.state.q)
    assert resumed.result.curve.metrics["quality"] == whole.result.curve.metrics["quality"]


def test_checkpoint_every_progress_writes_during_the_run(tmp_path, monkeypatch):
    from popplay.checkpoints import runfile

    written = []
    original = runfile.write_run

    def spy(path, **kwargs):
        written.append((kwargs["state_counters"]["step"], kwargs["complete"]))
        original(path, **kwargs)

    monkeypatch.setattr(runfile, "write_run", spy)
    params = BanditParams(arms=10, agents=4, trials=4, steps_per_agent=64, share_every=8)
    from popplay.training.pipeline import CheckpointEvery

    train("bandit", params, TrainOptions(out=tmp_path / "c.h5", checkpoint_every=CheckpointEvery.parse("64")))
    # every 64 agent-steps per trial = every 16 steps per agent, then the final write
    assert written == [(16, False), (32, False), (48, False), (64, False), (64, True)]


def test_checkpoint_every_parsing():
    from popplay.training.pipeline import CheckpointEvery

    assert CheckpointEvery.parse("30s") == CheckpointEvery(30.0, "seconds")
    assert CheckpointEvery.parse("2m") == CheckpointEvery(120.0, "seconds")
    assert CheckpointEvery.parse("4096") == CheckpointEvery(4096.0, "progress")
    for bad in ("", "-3", "abc", "1.5", "0s"):
        with pytest.raises(UsageError):
            CheckpointEvery.parse(bad)


def test_second_writer_is_refused(tmp_path, capsys):
    path = tmp_path / "busy.h5"
    with RunLock(path):
        assert main(BANDIT + ["--agent-steps", "64", "--out", str(path)]) == 2
    assert "another popplay process" in capsys.readouterr().err
    assert not path.exists()
    assert main(BANDIT + ["--agent-steps", "64", "--out", str(path), "--json"]) == 0  # lock released


def test_non_finite_estimates_reset_the_trial_with_a_warning(tmp_path):
    from popplay.games.bandit.experiment import BanditExperiment
    from popplay.core.backend import Backend

    params = BanditParams(arms=10, agents=4, trials=3, steps_per_agent=32, share_every=8)
    experiment = BanditExperiment(params, Backend("numba", "cpu"))
    state = experiment.phase(experiment.initial_state(), time_left=None)
    state.q[1, 3] = np.nan
    events = experiment.check_finite(state, phase=1)
    assert events == ["phase 1: trial 1 had non-finite estimates; its shared table was reset"]
    assert np.isfinite(state.q).all() and state.n[1].sum() == 0 and state.n[0].sum() > 0
    assert experiment.check_finite(state, phase=2) == []
    state = experiment.phase(state, time_left=None)
    assert state.n[1].sum() == 4 * 8


def _popplay(*args, **kwargs):
    return subprocess.Popen(["popplay", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_ctrl_c_finishes_the_phase_saves_and_exits_130(tmp_path):
    path = tmp_path / "interrupted.h5"
    proc = _popplay(*BANDIT, "--agent-steps", "100000000", "--out", str(path))
    deadline = time.monotonic() + 120
    line = proc.stderr.readline()  # progress goes to stderr; its first line: learning has started
    while line and "%" not in line:  # status lines (training…, compiling…) come before it
        line = proc.stderr.readline()
    assert line and time.monotonic() < deadline
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert str(path) in err and "Traceback" not in err
    stored = load_run(path)
    assert not stored.complete and stored.state_counters["step"] > 0


def test_ctrl_c_during_a_deep_run_s_final_save_exits_130_with_the_file_complete(tmp_path):
    # 400 greedy evaluation episodes keep the final save busy for about a second: the
    # Ctrl-C lands inside it, not after the process has said everything.
    path = tmp_path / "dqn.h5"
    proc = _popplay("train", "dqn", "--episodes", "8", "--hidden", "16", "--eval-episodes", "400",
                    "--out", str(path))
    deadline = time.monotonic() + 120
    line = proc.stderr.readline()
    while line and "saving run file" not in line and time.monotonic() < deadline:
        line = proc.stderr.readline()
    assert "saving run file" in line
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Interrupted during the last phase, which finished" in err and "Traceback" not in err
    assert "quality" in out  # the summary still comes
    assert load_run(path).complete


def test_kill_9_during_checkpoints_leaves_a_resumable_file(tmp_path):
    path = tmp_path / "killed.h5"
    args = [*BANDIT, "--agent-steps", "100000000", "--checkpoint-every", "8", "--out", str(path), "--json"]
    rng = random.Random(0)
    for attempt in range(4):
        proc = _popplay(*args) if attempt == 0 else _popplay(
            "train", "bandit", "--resume", str(path), "--agent-steps", "100000000", "--checkpoint-every", "8", "--json")
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.05, 0.6))  # checkpoints are written every phase
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        stored = load_run(path)  # the last complete checkpoint, never a torn file
        assert stored.state_counters["step"] > 0
        assert not any(p.name.endswith(".tmp") and p.name.startswith("killed") for p in tmp_path.iterdir())
    step = load_run(path).state_counters["step"]
    assert main(["train", "bandit", "--resume", str(path), "--agent-steps", str((step + 16) * 8), "--json"]) == 0
    whole = tmp_path / "whole.h5"
    assert main([*BANDIT, "--agent-steps", str((step + 16) * 8), "--out", str(whole), "--json"]) == 0
    assert np.array_equal(_arrays(path)["state/q"], _arrays(whole)["state/q"])


_LOADER = (
    "import sys\n"
    "from popplay.checkpoints.runfile import RunFileError\n"
    "from popplay.checkpoints.validation import load_run\n"
    "try:\n"
    "    load_run(sys.argv[1])\n"
    "except RunFileError as e:\n"
    "    print('Error: ' + str(e), file=sys.stderr); sys.exit(2)\n"
)


def test_fuzzed_run_files_fail_cleanly(tmp_path, capsys):
    good = tmp_path / "good.h5"
    assert main(BANDIT + ["--agent-steps", "256", "--out", str(good), "--json"]) == 0
    capsys.readouterr()
    data = good.read_bytes()
    rng = random.Random(1234)
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(40):
        blob = bytearray(data)
        kind = case % 4
        if kind == 0:  # flip one bit
            i = rng.randrange(len(blob))
            blob[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate
            blob = blob[: rng.randrange(len(blob))]
        elif kind == 2:  # zero a block
            i = rng.randrange(len(blob))
            blob[i:i + 64] = bytes(len(blob[i:i + 64]))
        else:  # scribble random bytes
            i = rng.randrange(len(blob))
            blob[i:i + 16] = rng.randbytes(len(blob[i:i + 16]))
        path = tmp_path / f"fuzz{case}.h5"
        path.write_bytes(bytes(blob))
        proc = subprocess.run([sys.executable, "-c", _LOADER, str(path)], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode in (0, 2), (case, proc.returncode, proc.stderr[-500:])
        assert "Traceback" not in proc.stderr
        if proc.returncode == 2:
            assert len(proc.stderr.strip().splitlines()) == 1
        outcomes["loaded" if proc.returncode == 0 else "refused"] += 1
    assert outcomes["refused"] >= 30  # almost every corruption is caught
    # a corrupted file through the real CLI: one line, exit 2
    proc = subprocess.run(["popplay", "evaluate", str(tmp_path / "fuzz1.h5")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("Error") and "Traceback" not in proc.stderr


def test_inspect_shows_a_run_without_loading_arrays(tmp_path, capsys):
    path = tmp_path / "r.h5"
    assert main(BANDIT + ["--agent-steps", "128", "--out", str(path), "--json"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["domain"] == "bandit" and info["complete"] is True
    assert info["population"] == {"trials": 16, "agents": 8, "arms": 20}
    assert info["progress"]["step"] == 16 and "quality" in info["last"]
    assert {"numpy", "torch", "h5py"} <= set(info["versions"])
    assert main(["inspect", str(tmp_path / "missing.h5")]) == 2


def test_inspect_says_a_time_budget_ended_the_run_not_its_configured_steps(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the table's rows unwrapped
    path = tmp_path / "t.h5"
    assert main(BANDIT + ["--time-budget", "0.2", "--out", str(path), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "0.2 s of learning (time budget)" in shown
    assert "not the configured steps_per_agent=" in shown  # a 0.2 s run ends far from 16,384 steps


def test_divergence_is_handled_before_the_phase_is_measured():
    from popplay.games.bandit.experiment import BanditExperiment
    from popplay.core.backend import Backend
    from popplay.training.loop import run

    class Poisoned(BanditExperiment):
        measured: list = []

        def phase(self, state, *, time_left):
            state = super().phase(state, time_left=time_left)
            if state.shares == 2:
                state.q[0, 0] = np.nan
            return state

        def measure(self, state):
            self.measured.append(bool(np.isfinite(state.q).all()))
            return super().measure(state)

    events = []
    params = BanditParams(arms=5, agents=2, trials=2, steps_per_agent=32, share_every=8)
    run(Poisoned(params, Backend("numba", "cpu")), on_event=events.append)
    assert Poisoned.measured == [True] * 4
    assert events == ["phase 2: trial 0 had non-finite estimates; its shared table was reset"]

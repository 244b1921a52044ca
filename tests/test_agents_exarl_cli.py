"""``popplay train a2c|td3|ddpg`` (sequential workflow) and ``popplay evaluate`` on their run files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from popplay.cli.main import main

TINY_CONTINUOUS = ["--learning-starts", "100", "--update-ratio", "0.25", "--batch-size", "16", "--hidden", "16,16", "--eval-episodes", "1",
                   "--seed", "2"]
TINY_A2C = ["--hidden", "16", "--copies", "4", "--n-steps", "8", "--eval-episodes", "2", "--seed", "1"]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_td3_runs_and_resumes_exactly(tmp_path, capsys):
    whole, half = tmp_path / "whole.h5", tmp_path / "half.h5"
    assert main(["train", "td3", "--env-steps", "400", *TINY_CONTINUOUS, "--out", str(whole), "--json"]) == 0
    a = _json(capsys)
    assert a["domain"] == "td3" and a["env"] == "Pendulum-v1" and a["topology"] == "sequential"
    assert a["env_steps"] == 400 and a["episodes"] == 2 and a["complete"]
    # every transition owes 0.25 updates once 100 are stored: the first episode already has 200
    assert a["updates"] == 100
    assert -2000 < a["quality"] < 0
    assert main(["train", "td3", "--env-steps", "200", *TINY_CONTINUOUS, "--out", str(half), "--json"]) == 0
    capsys.readouterr()
    assert main(["train", "td3", "--resume", str(half), "--env-steps", "400", "--json"]) == 0
    b = _json(capsys)
    assert (b["env_steps"], b["updates"]) == (400, 100)
    assert b["quality"] == a["quality"] and b["return"] == a["return"]


@pytest.mark.parametrize("vtrace", ["--vtrace", "--no-vtrace"])
def test_a2c_runs_with_and_without_vtrace(tmp_path, capsys, vtrace):
    out = tmp_path / "a2c.h5"
    assert main(["train", "a2c", vtrace, "--episodes", "16", *TINY_A2C, "--out", str(out), "--json"]) == 0
    s = _json(capsys)
    assert s["domain"] == "a2c" and s["env"] == "CartPole-v1" and s["episodes"] == 16
    assert s["updates"] >= 4  # at least one segment per phase
    # later segments of a phase come from a policy the learner has moved past
    assert s["mean_rho"] is not None and abs(s["mean_rho"] - 1.0) > 1e-6
    assert main(["evaluate", str(out), "--episodes", "3", "--json"]) == 0
    e = _json(capsys)
    assert e["domain"] == "a2c" and e["eval_episodes"] == 3 and 1 <= e["quality"] <= 500


def test_ddpg_with_per(tmp_path, capsys):
    out = tmp_path / "ddpg.h5"
    assert main(["train", "ddpg", "--per", "--env-steps", "200", *TINY_CONTINUOUS, "--out", str(out), "--json"]) == 0
    s = _json(capsys)
    assert s["domain"] == "ddpg" and s["updates"] == 50
    import h5py

    with h5py.File(out, "r") as f:
        priority = f["state/replay.priority"][()]
    assert priority.shape == (200,)
    # TD errors replaced the initial priority of the items drawn so far
    assert len(set(priority.round(9).tolist())) > 10


@pytest.mark.parametrize("args,message", [
    (["train", "td3", "--env", "CartPole-v1", "--env-steps", "10"], "td3 needs continuous actions"),
    (["train", "a2c", "--env", "Pendulum-v1", "--episodes", "2"], "a2c needs discrete actions"),
    (["train", "ddpg", "--policy-delay", "3", "--env-steps", "10"], "No such option: --policy-delay"),
    (["train", "a2c", "--c-bar", "0", "--episodes", "2"], "--c-bar must be positive"),
    (["train", "td3", "--hidden", "a,b", "--env-steps", "10"], "--hidden"),
])
def test_usage_errors_are_one_line(tmp_path, capsys, args, message):
    assert main([*args, "--out", str(tmp_path / "x.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and message in err[0]
    assert not (tmp_path / "x.h5").exists()


def test_a2c_through_a_real_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = tmp_path / "a2c.h5"
    run = subprocess.run([sys.executable, "-m", "popplay", "train", "a2c", "--episodes", "8", *TINY_A2C,
                          "--out", str(out), "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["episodes"] == 8
    assert main(["evaluate", str(out), "--episodes", "2"]) == 0

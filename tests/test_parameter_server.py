"""``--workflow parameter-server``: the parameter-server draft's synchronous server for any
on-policy agent, through the console script on real gloo ranks."""
from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.procs

# PPO (many minibatch steps per round) through the on-policy workflow experiment, which
# REINFORCE's --topology parameter-server reaches too; A2C (one step) through its own.
LAYOUT = {"a2c": ["--workflow", "parameter-server", "--actors", "2"],
          "ppo": ["--workflow", "parameter-server", "--actors", "2"]}


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["popplay", "train", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("agent", sorted(LAYOUT))
def test_every_on_policy_agent_learns_through_the_server_with_identical_copies(tmp_path, capsys,
                                                                              agent: str) -> None:
    out = tmp_path / f"{agent}.h5"
    done = _train(agent, *LAYOUT[agent], "--episodes", "20", "--eval-episodes", "2", "--timeout", "30",
                  "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["complete"] and summary["topology"] == "parameter-server" and summary["ranks"] == 3
    assert summary["episodes"] == 20 and summary["phases"] == 10  # two workers, one episode each per round
    assert summary["topology_workers"] == 2
    # Every round began with each worker's copy equal to the server's: the same mean
    # gradients, the same optimiser steps (a worker whose schedule clock lagged was seen
    # to differ in 32 rounds of 18).
    assert summary["topology_copies_differed"] == 0
    if agent == "ppo":  # the refusal is the family's, the same for every agent
        from popplay.cli.main import main

        # In this process: refused before any rank starts, so a process of its own adds
        # only its start-up.
        capsys.readouterr()
        assert main(["train", agent, "--resume", str(out), "--episodes", "60"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("Error: --resume: a parameter-server run cannot be resumed")
        assert err.count("\n") == 1

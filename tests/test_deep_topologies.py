"""Deep topologies through real processes on gloo (tiny budgets, a timeout on every wait)."""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from popplay.checkpoints.validation import load_run

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--hidden", "16", "--learning-starts", "16", "--update-ratio", "1", "--batch-size", "8",
        "--target-every", "5", "--eval-episodes", "2", "--timeout", "60"]


def _comms() -> set[str]:
    names = set()
    for entry in Path("/proc").iterdir():
        try:
            names.add((entry / "comm").read_text().strip())
        except (OSError, ValueError):
            pass
    return names


def test_parameter_server_sums_the_workers_gradients(jobs, tmp_path: Path) -> None:
    from popplay.deep import envs
    from popplay.deep.agents import networks
    from popplay.deep.agents.reinforce import ReinforceConfig, policy_network
    from popplay.deep.agents.reinforce import worker_episode, worker_generator

    out = tmp_path / "ps.h5"
    code, stdout, err = jobs.finish(jobs.start(["train", "reinforce", "--workers", "3", "--episodes", "1",
                                                "--hidden", "8", "--eval-episodes", "1", "--timeout", "60", "--seed",
                                                "4", "--out", str(out), "--json"]))
    assert code == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["backend"] == "gloo" and summary["ranks"] == 4 and "running_reward" in summary
    served = load_run(out).state["last_gradient"]
    # Each worker's gradient computed alone, in this process, from the same start.
    env = envs.make_vector("CartPole-v1", 1)
    alone = []
    for w in range(3):
        policy = policy_network(4, 4, 2, ReinforceConfig(hidden=(8,)))
        grad, reward, steps = worker_episode(policy, env, worker_generator(4, w), 4, w, 0, 0.99, 10_000)
        alone.append(grad)
    assert not torch.equal(alone[0], alone[1])
    np.testing.assert_array_equal(served, (alone[0] + alone[1] + alone[2]).numpy())
    assert summary["env_steps"] > 0 and networks is not None


def _start_dqn(jobs, out: Path, topology: str, simulators: int, extra: dict[str, float]):
    return jobs.start(["train", "dqn", "--topology", topology, "--simulators", str(simulators), "--sync-every", "2",
                       "--episodes", "10", "--out", str(out), "--json", *TINY], hooks=extra)


@pytest.fixture(scope="module")
def pipelined_run(tmp_path_factory) -> Iterator[tuple[Path, tuple[int, str, str]]]:
    """The pipelined job of the test below and how it ended: its run file is also the
    one test_a_multi_rank_run_resumes continues, so its ranks start once for both."""
    from tests.conftest import Jobs

    out = tmp_path_factory.mktemp("pipelined") / "pipelined.h5"
    jobs = Jobs()
    try:
        yield out, jobs.finish(_start_dqn(jobs, out, "pipelined", 1, {}))
    finally:
        jobs.close()


@pytest.mark.parametrize("topology,simulators,extra", [
    ("pipelined", 1, {}),
    ("collective", 2, {}),
    # A slow learner (simulators run ahead) and slow simulators (the learner waits on
    # nobody) in one run: each process spends most of its time asleep.
    ("async", 2, {"slow_simulator": 0.05, "slow_learner": 0.01}),
])
def test_learner_receives_exactly_what_the_simulators_produced(jobs, tmp_path: Path, request, topology: str,
                                                               simulators: int, extra: dict[str, float]) -> None:
    if topology == "pipelined":
        out, (code, stdout, err) = request.getfixturevalue("pipelined_run")
    else:
        out = tmp_path / f"{topology}.h5"
        process = _start_dqn(jobs, out, topology, simulators, extra)
        seen: set[str] = set()
        if "slow_simulator" in extra:
            roles = {"learner", "simulator 1", "simulator 2"}
            deadline = time.monotonic() + 90  # three ranks start and import torch
            # Wait for all three: each rank names itself once it has started, in no set order.
            while process.poll() is None and time.monotonic() < deadline and not roles <= seen:
                seen |= _comms()
                time.sleep(0.1)
            assert roles <= seen  # roles visible to ps -e / pgrep
        code, stdout, err = jobs.finish(process)
    assert code == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["backend"] == "gloo" and summary["ranks"] == simulators + 1 and summary["topology"] == topology
    counters = load_run(out).state_counters
    assert counters["topology_sent"] == counters["topology_received"] == counters["topology_replay_added"]
    assert counters["topology_received"] == summary["env_steps"] > 0
    assert counters["topology_sent_checksum"] == counters["topology_received_checksum"]
    # async too: each simulator plays its share of the budget (5 here), then waits for the stop
    assert summary["episodes"] == 10
    if "slow_learner" in extra:
        assert summary["updates"] < summary["env_steps"]  # ε follows the (slow) learner, not simulation


def test_async_simulators_stop_at_their_share_of_either_budget(jobs, tmp_path: Path) -> None:
    """Simulators that never wait used to play on until the stop reached them (2 of
    them, asked for 6 episodes, played 107). Now each plays its share; with both
    budgets set, until both of its shares are played (so that one of the totals
    surely reaches its budget and the run ends)."""
    runs = {"episodes": ["--episodes", "6"], "both": ["--episodes", "4", "--env-steps", "400"]}
    for name, budget in runs.items():
        out = tmp_path / f"{name}.h5"
        process = jobs.start(["train", "dqn", "--topology", "async", "--simulators", "2", *budget,
                            "--out", str(out), "--json", *TINY])
        code, stdout, err = jobs.finish(process)
        assert code == 0, err
        summary = json.loads(stdout.strip().splitlines()[-1])
        if name == "episodes":
            assert summary["episodes"] == 6
        else:  # the learner stops at whichever budget it reaches first
            assert summary["episodes"] >= 4 or summary["env_steps"] >= 400
            # bounded: a simulator stops once both of its shares (2 episodes, 200 steps) are
            # played, overshooting by at most one episode (<= 500 steps, >= 8 steps each)
            assert summary["env_steps"] <= 2 * (200 + 500)
            assert summary["episodes"] <= 2 * (200 // 8 + 1)


def test_a_killed_simulator_ends_the_job_with_one_line(jobs, tmp_path: Path) -> None:
    out = tmp_path / "dead.h5"
    process = jobs.start(["train", "dqn", "--topology", "collective", "--simulators", "2", "--episodes", "100000",
                        "--out", str(out), "--checkpoint-every", "2", *TINY],
                       hooks={"slow_simulator": 0.02})
    deadline = time.monotonic() + 90  # the launcher and three ranks start up first
    victim = None
    while victim is None and time.monotonic() < deadline and process.poll() is None:
        for entry in Path("/proc").iterdir():
            try:
                # This job's simulator 2 (a child of its launcher), not another test's.
                ours = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(process.pid)
                if ours and (entry / "comm").read_text().strip() == "simulator 2" and out.exists():
                    victim = int(entry.name)
            except (OSError, ValueError, IndexError):
                pass
        time.sleep(0.1)
    assert victim is not None, "simulator 2 never showed up"
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    code, _, err = jobs.finish(process, timeout=40)
    assert time.monotonic() - started < 30
    assert code == 3, err
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    # (The launcher may name rank 0, which it had to kill, rather than rank 2: see the report.)
    assert len(lines) == 1 and "was lost" in lines[0] and str(out) in lines[0]
    assert load_run(out).domain == "dqn"  # the last checkpoint is intact


def test_a_multi_rank_run_resumes(jobs, tmp_path: Path, pipelined_run) -> None:
    """The launcher reads the run file to learn its layout, then leaves the lock to rank 0
    (it used to keep it, and rank 0 was refused)."""
    import shutil

    first, (code, _, err) = pipelined_run
    assert code == 0, err
    out = tmp_path / "p.h5"
    shutil.copy(first, out)  # the other test reads the original
    again = jobs.start(["train", "dqn", "--resume", str(out), "--episodes", "13", "--json"])
    code, stdout, err = jobs.finish(again)
    assert code == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 13 and summary["ranks"] == 2 and load_run(out).state_counters["episodes"] == 13

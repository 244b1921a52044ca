"""Gorila through real processes on gloo (tiny budgets; every wait bounded)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from popplay.topologies.gorila import GorilaConfig, GorilaJobLost, load_npz, run_gorila

TINY = dict(env="CartPole-v1", hidden=(16,), batch_size=16, learning_starts=64, update_ratio=0.5,
            learner_sync=2, actor_sync=20, chunk=25, target_every=10, timeout=15.0, eval_episodes=2,
            checkpoint_every=10, outlier_min_samples=5, outlier_window=20)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _steps(path: Path) -> int:
    try:
        return int(load_npz(path)["env_steps"])
    except (OSError, KeyError, ValueError):
        return 0


def _version(path: Path) -> int:
    try:
        return int(load_npz(path)["version"])
    except (OSError, KeyError, ValueError):
        return 0


def test_a_killed_actor_does_not_stop_the_run(tmp_path):
    config = GorilaConfig(actors=2, learners=1, shards=1, env_steps=10_000_000, seed=5, **TINY)
    pids: dict[int, int] = {}
    mark: dict[str, float] = {}
    victim = 1 + 1 + 1  # shard 0, learner 0, actor 0, then actor 1
    began = time.monotonic()

    def should_stop() -> bool:
        if time.monotonic() - began > 90:
            return True  # the assertions below then fail
        if "killed" not in mark:
            if _steps(tmp_path / "actor-1.npz") >= 100:
                os.kill(pids[victim], signal.SIGKILL)
                mark["killed"] = 1
                mark["steps0"] = _steps(tmp_path / "actor-0.npz")
                mark["version"] = _version(tmp_path / "shard-0.npz")
            return False
        # Stop once the survivors have clearly gone on without it.
        return (_steps(tmp_path / "actor-0.npz") >= mark["steps0"] + 300
                and _version(tmp_path / "shard-0.npz") >= mark["version"] + 20)

    summary = run_gorila(config, tmp_path, should_stop=should_stop, on_start=pids.update)
    assert "killed" in mark
    assert summary["lost"] == ["actor 1 (killed by SIGKILL)"]
    assert not summary["complete"]
    assert _steps(tmp_path / "actor-0.npz") >= mark["steps0"] + 300
    assert summary["server_versions"][0] >= mark["version"] + 20
    assert load_npz(tmp_path / "learner-0.npz")["updates"] > 0


def test_a_killed_shard_ends_the_job_with_a_resumable_checkpoint(tmp_path):
    first = tmp_path / "first"
    config = GorilaConfig(actors=1, learners=1, shards=2, env_steps=10_000_000, seed=7, **TINY)
    pids: dict[int, int] = {}
    mark: dict[str, float] = {}
    began = time.monotonic()

    def should_stop() -> bool:
        if "killed" not in mark and _version(first / "shard-1.npz") >= 20:
            os.kill(pids[1], signal.SIGKILL)  # rank 1: shard 1
            mark["killed"] = time.monotonic()
        return time.monotonic() - began > 90  # a bound for the test only

    with pytest.raises(GorilaJobLost, match="shard 1 was lost") as raised:
        run_gorila(config, first, should_stop=should_stop, on_start=pids.update)
    ended = time.monotonic()
    assert "killed" in mark
    assert ended - mark["killed"] < config.timeout  # within the timeout, not the test's bound
    assert "checkpoint.npz" in str(raised.value)
    checkpoint = load_npz(first / "checkpoint.npz")
    assert checkpoint["shard_versions"][1] >= 20  # shard 1's last periodic checkpoint survived
    assert checkpoint["params"].size == 4 * 16 + 16 + 16 * 2 + 2

    # Resume with another layout (one shard); no learning (learning_starts above the
    # budget), so the parameters must come back unchanged.
    again = GorilaConfig(**{**config.to_dict(), "hidden": (16,), "shards": 1, "env_steps": 50,
                            "learning_starts": 10_000, "resume": str(first / "checkpoint.npz")})
    summary = run_gorila(again, tmp_path / "second")
    resumed = load_npz(tmp_path / "second" / "checkpoint.npz")
    assert np.array_equal(resumed["params"], checkpoint["params"])
    assert np.array_equal(resumed["accumulator"], checkpoint["accumulator"])
    assert summary["server_versions"] == [int(checkpoint["version"])]
    assert summary["complete"]

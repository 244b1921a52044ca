"""Gorila through real processes on gloo (tiny budgets; every wait bounded)."""
from __future__ import annotations

import json
import os
import signal
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from popplay.core.hooks import variable
from popplay.deep.agents import networks
from popplay.deep.agents.adagrad_shard import AdaGradShard
from popplay.deep.topologies.gorila import GorilaConfig, GorilaJobLost, load_npz, run_gorila
from tests._gorila_driver import gradient_sequence

# Real ranks on gloo: `pytest -m "not procs"` leaves them out for a fast loop.
pytestmark = pytest.mark.procs

TINY = dict(env="CartPole-v1", hidden=(16,), batch_size=16, learning_starts=64, update_ratio=0.5,
            learner_sync=2, actor_sync=20, chunk=25, target_every=10, timeout=15.0, eval_episodes=2,
            checkpoint_every=10, outlier_min_samples=5, outlier_window=20)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _saved(path: Path, key: str) -> int:
    """A count a rank saved (0 until its file is there and readable)."""
    try:
        return int(load_npz(path)[key])
    except (OSError, KeyError, ValueError):
        return 0


def _steps(path: Path) -> int:
    return _saved(path, "env_steps")


def _version(path: Path) -> int:
    return _saved(path, "version")


def _received(run_dir: Path, learner: int) -> int:
    return _saved(run_dir / f"learner-{learner}.npz", "received")


def test_shard_processes_apply_exactly_the_unsharded_adagrad(tmp_path):
    """Two real shard processes (uneven slices: 107 = 54 + 53 parameters) fed one
    gradient sequence over gloo end bitwise where one unsharded server would."""
    import datetime
    import subprocess
    import sys

    import torch.distributed as dist

    from popplay.distributed.launch import rank_environment

    config = GorilaConfig(actors=1, learners=1, shards=2, hidden=(15,), env_steps=1, seed=11, lr=0.05,
                          max_staleness=1000, checkpoint_every=1000)
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps({**config.to_dict(), "obs_dim": 4, "actions": 2, "action_dim": 1,
                                       "action_low": [], "action_high": []}))
    store = dist.TCPStore("127.0.0.1", 0, config.world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    commands = [[sys.executable, "-m", "popplay.deep.topologies.gorila_ranks", f"popplay gorila shard {s}",
                 str(config_path)] for s in range(2)]
    commands += [[sys.executable, "-m", "tests._gorila_driver", role, str(config_path), str(tmp_path / "pulled.npz")]
                 for role in ("learner", "actor")]
    procs = [subprocess.Popen(cmd, env=rank_environment(rank, config.world_size, store.port, 1),
                              cwd=Path(__file__).resolve().parent.parent) for rank, cmd in enumerate(commands)]
    try:
        for p in procs[2:]:
            assert p.wait(timeout=60) == 0
        store.add("finished/clients", 2)  # what the launcher does when clients exit
        for p in procs[:2]:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    net = networks.seeded_mlp(config.seed, 4, 2, config.hidden)
    vector = networks.flat_parameters(net)
    assert vector.numel() == 107
    whole = AdaGradShard.from_vector(vector, 0, 107, config.lr, config.adagrad_eps, config.initial_accumulator)
    grads = gradient_sequence(107)
    for grad in grads:
        whole.apply(grad)
    pulled = load_npz(tmp_path / "pulled.npz")
    assert pulled["versions"].tolist() == [len(grads), len(grads)]
    assert np.array_equal(pulled["params"], whole.params.numpy())  # bitwise, through PULL
    saved = [load_npz(tmp_path / f"shard-{s}.npz") for s in range(2)]
    assert [(int(x["start"]), int(x["stop"])) for x in saved] == [(0, 54), (54, 107)]
    assert np.array_equal(np.concatenate([x["params"] for x in saved]), whole.params.numpy())
    assert np.array_equal(np.concatenate([x["accumulator"] for x in saved]), whole.accumulator.numpy())
    assert not torch.equal(whole.params, vector)


def test_a_killed_actor_and_a_killed_learner_do_not_stop_the_run(tmp_path):
    # Actors 0 and 2 feed learner 0, actor 1 feeds learner 1 (ranks: shard 0, learners
    # 1-2, actors 3-5). Kill actor 2 (learner 0 keeps actor 0) and learner 1 (actor 1
    # stops with it): actor 0, learner 0 and the shard must go on.
    config = GorilaConfig(actors=3, learners=2, shards=1, env_steps=10_000_000, seed=5, **TINY)
    pids: dict[int, int] = {}
    mark: dict[str, float] = {}
    began = time.monotonic()

    def should_stop() -> bool:
        if time.monotonic() - began > 180:  # forming the group alone can take tens of seconds
            return True  # the assertions below then fail
        if "killed" not in mark:
            if min(_steps(tmp_path / f"actor-{a}.npz") for a in range(3)) >= 100:
                os.kill(pids[5], signal.SIGKILL)  # actor 2
                os.kill(pids[2], signal.SIGKILL)  # learner 1
                mark["killed"] = 1
                mark["steps0"] = _steps(tmp_path / "actor-0.npz")
                mark["version"] = _version(tmp_path / "shard-0.npz")
            return False
        # Stop once the survivors have clearly gone on without them.
        return (_steps(tmp_path / "actor-0.npz") >= mark["steps0"] + 300
                and _version(tmp_path / "shard-0.npz") >= mark["version"] + 20)

    summary = run_gorila(config, tmp_path, should_stop=should_stop, on_start=pids.update)
    assert "killed" in mark
    assert sorted(summary["lost"]) == ["actor 1 (stopped: a peer it needs was lost)",
                                       "actor 2 (killed by SIGKILL)", "learner 1 (killed by SIGKILL)"]
    assert not summary["complete"]
    assert _steps(tmp_path / "actor-0.npz") >= mark["steps0"] + 300
    assert summary["server_versions"][0] >= mark["version"] + 20


def test_global_replay_is_one_memory_spread_over_the_learners(tmp_path):
    """Each transition is stored once (by its actor's learner), and every learner draws
    minibatch rows from the other's part: the rows fetched add up to what the draws
    over both parts' sizes give."""
    config = GorilaConfig(actors=2, learners=2, shards=1, replay="global", env_steps=1200, seed=5, **TINY)
    summary = run_gorila(config, tmp_path)
    assert summary["complete"] and summary["replay"] == "global"
    assert summary["transitions_received"] == summary["env_steps"]  # stored once, not copied
    updates = [int(load_npz(tmp_path / f"learner-{l}.npz")["updates"]) for l in range(2)]
    remote = [int(load_npz(tmp_path / f"learner-{l}.npz")["remote_rows"]) for l in range(2)]
    assert min(updates) > 50
    # Two parts of about equal size: about half of each minibatch is fetched from the
    # other learner (the first request, before any size is known, fetches nothing). The
    # parts grow as fast as their actors play, which a loaded machine can skew.
    for u, r in zip(updates, remote):
        assert 0.15 * u * config.batch_size < r < 0.85 * u * config.batch_size
    assert summary["replay_rows_remote"] == sum(remote)


def test_global_replay_survives_a_killed_learner(tmp_path):
    # Global replay (ranks: shard 0, learners 1-2, actors 3-4): actor a stores in
    # learner a's part. Kill learner 1: actor 1 moves to learner 0's part, and learner 0
    # stops asking the lost part for rows and goes on learning.
    config = GorilaConfig(actors=2, learners=2, shards=1, replay="global", env_steps=10_000_000, seed=9, **TINY)
    pids: dict[int, int] = {}
    mark: dict[str, float] = {}
    began = time.monotonic()

    received = partial(_received, tmp_path)

    def should_stop() -> bool:
        if time.monotonic() - began > 180:  # forming the group alone can take tens of seconds
            return True
        if "killed" not in mark:
            if min(received(0), received(1)) >= 200:
                os.kill(pids[2], signal.SIGKILL)  # learner 1
                mark["killed"] = 1
                mark["received0"] = received(0)
                mark["steps1"] = _steps(tmp_path / "actor-1.npz")
                mark["version"] = _version(tmp_path / "shard-0.npz")
            return False
        return (received(0) >= mark["received0"] + 600 and _steps(tmp_path / "actor-1.npz") >= mark["steps1"] + 300
                and _version(tmp_path / "shard-0.npz") >= mark["version"] + 20)

    summary = run_gorila(config, tmp_path, should_stop=should_stop, on_start=pids.update)
    assert "killed" in mark and summary["replay"] == "global"
    assert summary["lost"] == ["learner 1 (killed by SIGKILL)"]  # both actors played on
    assert received(0) >= mark["received0"] + 600
    assert _steps(tmp_path / "actor-1.npz") >= mark["steps1"] + 300
    assert summary["server_versions"][0] >= mark["version"] + 20


def test_an_actor_whose_send_times_out_feeds_the_next_learner(tmp_path, monkeypatch, capfd):
    # Learner 1 lives on but stops receiving (a hook): actor 1's next send to it can
    # only time out. gloo then closes every pair of the group the send used; were that
    # the world group, actor 1 could reach neither learner 0 nor the shard any more.
    monkeypatch.setenv(variable("deaf_learner"), "2")
    monkeypatch.setenv(variable("deaf_after"), "100")
    config = GorilaConfig(actors=2, learners=2, shards=1, replay="global", env_steps=10_000_000, seed=11,
                          **{**TINY, "timeout": 8.0})
    mark: dict[str, int] = {}
    began = time.monotonic()

    received = partial(_received, tmp_path)

    def should_stop() -> bool:
        if time.monotonic() - began > 180:
            return True
        if "deaf" not in mark:
            if received(1) >= 100:
                mark["deaf"] = 1
                mark["steps1"] = _steps(tmp_path / "actor-1.npz")
                mark["received0"] = received(0)
            return False
        return _steps(tmp_path / "actor-1.npz") >= mark["steps1"] + 600 and received(0) >= mark["received0"] + 1000

    summary = run_gorila(config, tmp_path, should_stop=should_stop)
    assert "deaf" in mark and summary["lost"] == []  # actor 1 played on
    assert _steps(tmp_path / "actor-1.npz") >= mark["steps1"] + 600
    assert received(0) >= mark["received0"] + 1000  # actor 1's transitions as well as actor 0's
    assert 100 <= received(1) < 100 + 2 * config.chunk
    assert ("gorila actor 1: learner 1 cannot take transitions (Timed out waiting 8000ms for send operation "
            "to complete); they go to learner 0 now") in capfd.readouterr().err


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

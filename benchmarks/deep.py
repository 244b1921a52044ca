"""Deep agents: Double DQN quality and throughput beside stable-baselines3, and the
seed 003 topologies' wall time against ``sequential``.

    python benchmarks/deep.py --env-steps 100000 --seeds 3          # popplay DQN, quality per seed
    python benchmarks/deep.py --env-steps 20000 --sb3                # and SB3's DQN, same settings
    python benchmarks/deep.py --topologies --episodes 100            # seed 003 Tables 1-2 style

Same network (128-128 ReLU), learning rate, replay, batch, discount, update rate (one
update per 4 environment steps), target refresh (every 250 updates = 1000 steps),
ε schedule (1 -> 0.05 over 5000 updates = 20000 steps) and gradient clipping for both.
Differences that remain: SB3's DQN is vanilla DQN (its target takes the target
network's own max; popplay's is Double DQN), and SB3 trains every 4 steps as they come
while popplay's sequential topology trains after each episode (seed 003 Algorithm 1).
``quality`` is the mean return of 100 greedy episodes at the end, played by the same
evaluation code (:func:`popplay.envs.rollout.evaluate`) for both. One torch thread per
process for both (the networks are tiny). Results: JSON on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def popplay_dqn(env_id: str, env_steps: int, seed: int, topology: str = "sequential", simulators: int = 1,
                episodes: int = 0, eval_episodes: int = 100) -> dict[str, Any]:
    from popplay.console import SilentReporter
    from popplay.topologies.dqn import DQNParams
    from popplay.topologies.run import train_deep

    params = DQNParams(env=env_id, env_steps=env_steps, episodes=episodes, seed=seed, topology=topology,
                       simulators=simulators, eval_episodes=eval_episodes)
    with tempfile.TemporaryDirectory() as tmp:
        return train_deep("dqn", params, out=Path(tmp) / "run.h5", reporter=SilentReporter())


def sb3_dqn(env_id: str, env_steps: int, seed: int, eval_episodes: int = 100) -> dict[str, Any]:
    import gymnasium
    import numpy as np
    import torch
    from stable_baselines3 import DQN

    from popplay.topologies.common import greedy_quality

    torch.set_num_threads(1)
    model = DQN("MlpPolicy", gymnasium.make(env_id), learning_rate=1e-3, buffer_size=50_000, learning_starts=1_000,
                batch_size=64, gamma=0.99, train_freq=4, gradient_steps=1, target_update_interval=1_000,
                exploration_fraction=min(1.0, 20_000 / env_steps), exploration_initial_eps=1.0,
                exploration_final_eps=0.05, max_grad_norm=10.0, policy_kwargs={"net_arch": [128, 128]},
                seed=seed, device="cpu")
    started = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    seconds = time.perf_counter() - started

    def act(obs: np.ndarray) -> np.ndarray:
        return model.predict(obs, deterministic=True)[0]

    quality = greedy_quality(env_id, act, eval_episodes, seed)[0] if eval_episodes else float("nan")
    return {"quality": quality, "env_steps": env_steps, "seconds": seconds, "env_steps_per_second": env_steps / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sb3", action="store_true", help="also stable-baselines3's DQN (pip install stable-baselines3)")
    parser.add_argument("--topologies", action="store_true", help="wall time of each topology for --episodes")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--simulators", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    report: dict[str, Any] = {"env": args.env}
    if args.topologies:
        rows = {}
        for topology, sims in (("sequential", 1), ("pipelined", 1), ("collective", args.simulators)):
            if topology == "sequential":
                rows[topology] = popplay_dqn(args.env, 0, 0, topology, sims, episodes=args.episodes, eval_episodes=10)
            else:
                rows[topology] = _launched(args.env, topology, sims, args.episodes)
            print(f"{topology}: {rows[topology]}", file=sys.stderr, flush=True)
        base = rows["sequential"]["seconds"]
        for row in rows.values():
            row["speedup"] = base / row["seconds"] if row.get("seconds") else None
        report["topologies"] = rows
    else:
        runs = []
        for seed in range(args.seeds):
            row = {"popplay": popplay_dqn(args.env, args.env_steps, seed)}
            if args.sb3:
                row["sb3"] = sb3_dqn(args.env, args.env_steps, seed)
            print(f"seed {seed}: {json.dumps(row)}", file=sys.stderr, flush=True)
            runs.append(row)
        report["runs"] = runs
    print(json.dumps(report, default=str))


def _launched(env_id: str, topology: str, simulators: int, episodes: int) -> dict[str, Any]:
    """A multi-rank topology through the CLI (its ranks are real processes)."""
    import os
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "popplay", "train", "dqn", "--env", env_id, "--topology", topology,
                "--simulators", str(simulators), "--episodes", str(episodes), "--eval-episodes", "10",
                "--out", str(Path(tmp) / "run.h5"), "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=3600)
        if done.returncode:
            return {"error": done.stderr.strip().splitlines()[-1:]}
        return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()

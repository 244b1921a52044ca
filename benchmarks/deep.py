"""Deep agents: Double DQN quality and throughput beside stable-baselines3, and the
Grandio's topologies' wall time against ``sequential``.

    python benchmarks/deep.py --env-steps 100000 --seeds 3          # popplay DQN, quality per seed
    python benchmarks/deep.py --env-steps 20000 --sb3                # and SB3's DQN, same settings
    python benchmarks/deep.py --topologies --episodes 100            # Grandio's Tables 1-2 style
    python benchmarks/deep.py --preset tuned --sb3                   # the tuned CartPole settings, both
    python benchmarks/deep.py --env LunarLander-v3 --env-steps 500000 --preset lunar   # LunarLander settings
    python benchmarks/deep.py --update-timing                        # ms per update: ours vs autograd's

``--preset tuned`` (docs/deep.md, "Double DQN on CartPole-v1"): 256-256, Adam 2.3e-3 falling
linearly to 0 over the run, 128 updates every 256 env-steps (``--train-every 256
--update-ratio 0.5``, SB3's schedule), target every 512 updates (1024 steps, refreshed
between the blocks as SB3's is), ε 1 -> 0.04 over 4000 updates (about 9000 steps), replay
100k; SB3 gets the same through its own knobs (lr schedule, train_freq 256 with 128
gradient steps, target_update_interval 1024, ε over 8000 steps). The SB3 zoo's CartPole
settings differ in three knobs: a constant rate, the target refreshed every 10 env-steps
(once per 128-update block with train_freq 256) and ε falling over 16% of the steps.

``--preset lunar`` (docs/deep.md, "Double DQN on LunarLander-v3"): the SB3 zoo's
LunarLander knobs (256-256, Adam 6.3e-4, batch 128, replay 50k, target every 250 updates,
ε 1 -> 0.1 over 12,000 updates, 4 updates every 4 env-steps) with the learning rate
falling linearly to 0 over the run, as in the CartPole preset. Without ``--preset``:

Same network (128-128 ReLU), learning rate, replay, batch, discount, update rate (one
update per 4 environment steps), target refresh (every 250 updates = 1000 steps),
ε schedule (1 -> 0.05 over 5000 updates = 20000 steps) and gradient clipping for both.
Differences that remain: SB3's DQN is vanilla DQN (its target takes the target
network's own max; popplay's is Double DQN), and SB3 trains every 4 steps as they come
while popplay's sequential topology trains after each episode (Grandio's Algorithm 1).
``quality`` is the mean return of 100 greedy episodes at the end, played by the same
evaluation code (:func:`popplay.deep.envs.rollout.evaluate`) for both. One torch thread per
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


TUNED = {"hidden": (256, 256), "lr": 2.3e-3, "lr_end": 0.0, "update_ratio": 0.5, "train_every": 256,
         "target_every": 512, "epsilon_end": 0.04, "epsilon_updates": 4_000, "replay_capacity": 100_000}
LUNAR = {"hidden": (256, 256), "lr": 6.3e-4, "lr_end": 0.0, "batch_size": 128, "update_ratio": 1.0, "train_every": 4,
         "target_every": 250, "epsilon_end": 0.1, "epsilon_updates": 12_000, "replay_capacity": 50_000}
PRESETS = {"tuned": TUNED, "lunar": LUNAR}


def popplay_dqn(env_id: str, env_steps: int, seed: int, topology: str = "sequential", simulators: int = 1,
                episodes: int = 0, eval_episodes: int = 100, preset: str = "default") -> dict[str, Any]:
    from popplay.api import train
    from popplay.deep.topologies.dqn import DQNParams

    extra: dict[str, Any] = {}
    if preset in PRESETS:  # the rate falls to lr_end over the run's updates (after 1,000 learning-start steps)
        knobs = PRESETS[preset]
        extra = {**knobs, "lr_updates": max(1, int((env_steps - 1_000) * knobs["update_ratio"]))}
    params = DQNParams(env=env_id, env_steps=env_steps, episodes=episodes, seed=seed, topology=topology,
                       simulators=simulators, eval_episodes=eval_episodes, **extra)
    with tempfile.TemporaryDirectory() as tmp:
        return train(params, out=Path(tmp) / "run.h5").summary


def sb3_dqn(env_id: str, env_steps: int, seed: int, eval_episodes: int = 100, tuned: bool = False) -> dict[str, Any]:
    import gymnasium
    import torch
    from stable_baselines3 import DQN

    from _common import sb3_learn_and_evaluate

    torch.set_num_threads(1)
    if tuned:
        lr0 = TUNED["lr"]
        knobs: dict[str, Any] = dict(
            learning_rate=lambda remaining: lr0 * remaining, buffer_size=TUNED["replay_capacity"],
            train_freq=TUNED["train_every"], gradient_steps=int(TUNED["train_every"] * TUNED["update_ratio"]),
            target_update_interval=int(TUNED["target_every"] / TUNED["update_ratio"]),
            exploration_fraction=min(1.0, 8_000 / env_steps),
            exploration_final_eps=TUNED["epsilon_end"], policy_kwargs={"net_arch": list(TUNED["hidden"])})
    else:
        knobs = dict(learning_rate=1e-3, buffer_size=50_000, train_freq=4, gradient_steps=1, target_update_interval=1_000,
                     exploration_fraction=min(1.0, 20_000 / env_steps), exploration_final_eps=0.05,
                     policy_kwargs={"net_arch": [128, 128]})
    model = DQN("MlpPolicy", gymnasium.make(env_id), learning_starts=1_000, batch_size=64, gamma=0.99,
                exploration_initial_eps=1.0, max_grad_norm=10.0, seed=seed, device="cpu", **knobs)
    return sb3_learn_and_evaluate(model, env_id, env_steps, eval_episodes, seed)


def update_timing(repeats: int = 3, updates: int = 2_000) -> dict[str, Any]:
    """Milliseconds per Double DQN update of the tuned CartPole network (256-256, batch
    64) and the LunarLander one (batch 128), one thread: popplay's written-out update
    (:mod:`popplay.deep.agents.flat`) against the same update through autograd,
    ``clip_grad_norm_`` and ``torch.optim.Adam`` (``tests/reference/dqn.py``, the
    learner before the flat update), on the same replay and minibatches; best of
    ``repeats``."""
    import torch

    from popplay.deep.agents import dqn
    from popplay.deep.agents.replay import Batch
    from tests.reference.dqn import AutogradDoubleDQN

    rows = {}
    for name, obs_dim, actions, batch_size in (("cartpole", 4, 2, 64), ("lunar", 8, 4, 128)):
        config = dqn.DQNConfig(hidden=(256, 256), batch_size=batch_size, learning_starts=0, lr_updates=10**6)
        agent = dqn.DoubleDQN(config, obs_dim, actions, seed=0)
        g = torch.Generator().manual_seed(0)
        n = 50_000
        agent.receive(Batch(torch.randn(n, obs_dim, generator=g), torch.randint(actions, (n,), generator=g),
                            torch.randn(n, generator=g), torch.randn(n, obs_dim, generator=g),
                            (torch.rand(n, generator=g) < 0.02).float()))
        reference = AutogradDoubleDQN(agent)
        row = {}
        for label, update in (("popplay_ms", agent.update), ("autograd_ms", reference.update)):
            best = float("inf")
            for _ in range(repeats):
                for _ in range(100):
                    update()
                started = time.perf_counter()
                for _ in range(updates):
                    update()
                best = min(best, (time.perf_counter() - started) / updates * 1e3)
            row[label] = best
        row["speedup"] = row["autograd_ms"] / row["popplay_ms"]
        rows[name] = row
        print(f"{name}: {row}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sb3", action="store_true", help="also stable-baselines3's DQN (pip install stable-baselines3)")
    parser.add_argument("--topologies", action="store_true", help="wall time of each topology for --episodes")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--simulators", type=lambda text: [int(n) for n in text.split(",")], default=[2],
                        help="simulator counts of the collective and async rows, e.g. 2,3")
    parser.add_argument("--preset", choices=("default", *PRESETS), default="default",
                        help="default: popplay's defaults; tuned: the tuned CartPole settings; lunar: the "
                             "LunarLander settings (see above)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--update-timing", action="store_true",
                        help="only time one Double DQN update, ours against autograd's (see update_timing)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    report: dict[str, Any] = {"env": args.env}
    if args.update_timing:
        report = {"update_timing": update_timing()}
    elif args.topologies:
        rows = {}
        layouts = [("sequential", 1), ("pipelined", 1)]
        layouts += [(topology, n) for topology in ("collective", "async") for n in args.simulators]
        for topology, sims in layouts:
            name = topology if topology in ("sequential", "pipelined") else f"{topology} x{sims}"
            if topology == "sequential":
                rows[name] = popplay_dqn(args.env, 0, args.first_seed, topology, sims, episodes=args.episodes,
                                         eval_episodes=10)
            else:
                rows[name] = _launched(args.env, topology, sims, args.episodes, args.first_seed)
            print(f"{name}: {rows[name]}", file=sys.stderr, flush=True)
        base = rows["sequential"]["seconds"]
        for row in rows.values():
            row["speedup"] = base / row["seconds"] if row.get("seconds") else None
        report["topologies"] = rows
    else:
        runs = []
        if args.sb3 and args.preset == "lunar":
            parser.error("--sb3 maps the default and tuned settings only")
        report["preset"] = args.preset
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            row = {"seed": seed, "popplay": _timed(popplay_dqn, args.env, args.env_steps, seed, preset=args.preset)}
            if args.sb3:
                row["sb3"] = _timed(sb3_dqn, args.env, args.env_steps, seed, tuned=args.preset == "tuned")
            print(f"seed {seed}: {json.dumps(row)}", file=sys.stderr, flush=True)
            runs.append(row)
        report["runs"] = runs
    print(json.dumps(report, default=str))


def _timed(run: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``run``'s result with the CPU seconds of the whole call (training and evaluation)
    and the load average before it: on a shared machine wall seconds alone mislead."""
    import os

    load = os.getloadavg()[0]
    started = time.process_time()
    result = run(*args, **kwargs)
    return {**result, "cpu_seconds": time.process_time() - started, "load_before": load}


def _launched(env_id: str, topology: str, simulators: int, episodes: int, seed: int = 0) -> dict[str, Any]:
    """A multi-rank topology through the CLI (its ranks are real processes)."""
    import os
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "popplay", "train", "dqn", "--env", env_id, "--topology", topology,
                "--simulators", str(simulators), "--episodes", str(episodes), "--eval-episodes", "10",
                "--seed", str(seed),
                "--out", str(Path(tmp) / "run.h5"), "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=3600)
        if done.returncode:
            return {"error": done.stderr.strip().splitlines()[-1:]}
        return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()

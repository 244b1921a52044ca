"""EXARL's agents learning on gymnasium tasks (not tests): short learning smokes.

    python benchmarks/exarl_agents.py td3 [--env Pendulum-v1] [--steps 5000] [--seed 0]
        [--eval-every 1000] [--eval-episodes 5] [--learning-starts 1000] [--no-cdq]
        [--delay 2] [--no-smoothing] [--json FILE]
    python benchmarks/exarl_agents.py ddpg [...same...] [--per]

One environment, one learner, one process: every environment step is stored and
followed by ``update_ratio`` (1) learner updates once ``learning-starts`` transitions
are in replay; before that the explorer acts uniformly at random. Every
``eval-every`` steps the deterministic policy plays ``eval-episodes`` episodes on a
separately seeded copy of the environment; the table shows their mean return and
spread, the wall time and the training throughput. Needs gymnasium.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from popplay.deep.agents.ddpg import DDPG, DDPGConfig, GaussianExplorer, deterministic_policy
from popplay.deep.agents.replay import Batch
from popplay.deep.agents.td3 import TD3, TD3Config


def evaluate(env_id: str, policy, episodes: int, seed: int) -> np.ndarray:
    import gymnasium

    env = gymnasium.make(env_id)
    out = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        total, done = 0.0, False
        while not done:
            action = policy(obs[None].astype(np.float32))[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        out.append(total)
    env.close()
    return np.array(out)


def run(args: argparse.Namespace) -> dict:
    import gymnasium

    torch.set_num_threads(args.threads)
    env = gymnasium.make(args.env)
    low, high = env.action_space.low.tolist(), env.action_space.high.tolist()
    obs_dim = int(np.prod(env.observation_space.shape))
    common = dict(learning_starts=args.learning_starts, batch_size=args.batch_size, hidden=tuple(args.hidden))
    if args.agent == "td3":
        config = TD3Config(clipped_double_q=args.cdq, policy_delay=args.delay, target_smoothing=args.smoothing,
                           per=args.per, **common)
        agent = TD3(config, obs_dim, tuple(low), tuple(high), args.seed)
    else:
        config = DDPGConfig(per=args.per, **common)
        agent = DDPG(config, obs_dim, tuple(low), tuple(high), args.seed)
    explorer = GaussianExplorer(agent.actor, config.exploration_noise, torch.Generator().manual_seed(args.seed + 17))
    obs, _ = env.reset(seed=args.seed)
    rows = []
    episode_returns: list[float] = []
    running = 0.0
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        explorer.uniform = agent.updates == 0
        action = explorer(obs[None].astype(np.float32))[0]
        nxt, reward, terminated, truncated, _ = env.step(action)
        running += float(reward)
        agent.receive(Batch(torch.as_tensor(obs[None], dtype=torch.float32), torch.as_tensor(action[None]),
                            torch.tensor([float(reward)]), torch.as_tensor(nxt[None], dtype=torch.float32),
                            torch.tensor([float(terminated)])))
        agent.train()
        obs = nxt
        if terminated or truncated:
            episode_returns.append(running)
            running = 0.0
            obs, _ = env.reset()
        if step % args.eval_every == 0 or step == args.steps:
            elapsed = time.perf_counter() - started
            returns = evaluate(args.env, deterministic_policy(agent.actor), args.eval_episodes, 10_000 + args.seed)
            row = {"steps": step, "updates": agent.updates, "eval_mean": float(returns.mean()),
                   "eval_std": float(returns.std()), "eval_min": float(returns.min()),
                   "train_last_episode": episode_returns[-1] if episode_returns else None,
                   "seconds": elapsed, "steps_per_s": step / elapsed}
            rows.append(row)
            print(f"{step:>7} steps {agent.updates:>7} updates  eval {row['eval_mean']:9.1f} ± {row['eval_std']:6.1f}"
                  f" (min {row['eval_min']:8.1f})  {elapsed:7.1f} s  {row['steps_per_s']:6.1f} steps/s", flush=True)
    env.close()
    return {"agent": args.agent, "env": args.env, "seed": args.seed, "config": config.to_dict(),
            "threads": args.threads, "torch": torch.__version__, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("agent", choices=["td3", "ddpg"])
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--learning-starts", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--no-cdq", dest="cdq", action="store_false")
    parser.add_argument("--delay", type=int, default=2)
    parser.add_argument("--no-smoothing", dest="smoothing", action="store_false")
    parser.add_argument("--per", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

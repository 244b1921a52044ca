"""PPO beside stable-baselines3's PPO: quality and env-steps/s, same settings and network,
one seed after another in one run.

    python benchmarks/ppo.py --env-steps 100000 --seeds 3          # popplay and SB3, seeds 0-2
    python benchmarks/ppo.py --env-steps 100000 --seeds 3 --no-sb3 # popplay alone

Settings (both sides): RL Baselines3 Zoo's CartPole-v1 PPO — 8 copies x 32 steps per
rollout, 20 epochs of minibatches of 256, γ 0.98, GAE λ 0.8, learning rate 1e-3 and clip
range 0.2 both falling linearly to 0 over the run, no entropy bonus, value weight 0.5,
gradient clip 0.5, advantages normalised per minibatch, Adam ε 1e-5. Network: separate
64-64 tanh policy and value networks (SB3's ``MlpPolicy`` for PPO). Each copy is a
``gymnasium.make(env)`` (SB3: its ``DummyVecEnv`` of ``Monitor``-wrapped copies). One torch
thread per process for both. ``quality`` is the mean return of 100 greedy episodes at
the end, played by the same evaluation code for both
(:func:`popplay.deep.topologies.common.greedy_quality`); ``env_steps_per_second`` counts
learning time only (popplay's ``seconds``; SB3's ``learn`` call). Results: JSON on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ZOO = {"copies": 8, "n_steps": 32, "batch_size": 256, "n_epochs": 20, "gamma": 0.98, "gae_lambda": 0.8,
       "lr": 1e-3, "clip_range": 0.2, "entropy_coef": 0.0, "value_coef": 0.5, "max_grad_norm": 0.5}


def popplay_ppo(env_id: str, env_steps: int, seed: int, eval_episodes: int = 100) -> dict[str, Any]:
    from popplay.api import train
    from popplay.deep.agents.ppo_params import PPOParams

    params = PPOParams(env=env_id, env_steps=env_steps, seed=seed, eval_episodes=eval_episodes, **ZOO)
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(params, out=Path(tmp) / "run.h5").summary
    return {"quality": summary["quality"], "env_steps": summary["env_steps"], "seconds": summary["seconds"],
            "env_steps_per_second": summary["env_steps_per_second"]}


def sb3_ppo(env_id: str, env_steps: int, seed: int, eval_episodes: int = 100) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from _common import sb3_learn_and_evaluate

    torch.set_num_threads(1)
    lr0, clip0 = ZOO["lr"], ZOO["clip_range"]
    model = PPO("MlpPolicy", make_vec_env(env_id, n_envs=ZOO["copies"], seed=seed), n_steps=ZOO["n_steps"],
                batch_size=ZOO["batch_size"], n_epochs=ZOO["n_epochs"], gamma=ZOO["gamma"],
                gae_lambda=ZOO["gae_lambda"], learning_rate=lambda remaining: lr0 * remaining,
                clip_range=lambda remaining: clip0 * remaining, ent_coef=ZOO["entropy_coef"],
                vf_coef=ZOO["value_coef"], max_grad_norm=ZOO["max_grad_norm"], seed=seed, device="cpu",
                policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}})
    return sb3_learn_and_evaluate(model, env_id, env_steps, eval_episodes, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--no-sb3", dest="sb3", action="store_false", help="popplay alone")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    runs = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        row: dict[str, Any] = {"seed": seed, "popplay": popplay_ppo(args.env, args.env_steps, seed, args.eval_episodes)}
        if args.sb3:
            row["sb3"] = sb3_ppo(args.env, args.env_steps, seed, args.eval_episodes)
            row["speedup"] = row["popplay"]["env_steps_per_second"] / row["sb3"]["env_steps_per_second"]
        print(f"seed {seed}: {json.dumps(row)}", file=sys.stderr, flush=True)
        runs.append(row)
    report: dict[str, Any] = {"env": args.env, "env_steps": args.env_steps, "settings": ZOO, "runs": runs}
    for side in ("popplay", "sb3"):
        if all(side in r for r in runs):
            report[f"{side}_mean_quality"] = sum(r[side]["quality"] for r in runs) / len(runs)
            report[f"{side}_mean_env_steps_per_second"] = (
                sum(r[side]["env_steps_per_second"] for r in runs) / len(runs))
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()

"""EXARL's agents beside stable-baselines3's, same settings, same evaluation (not a test).

    python benchmarks/exarl_sb3.py --agent td3 --env Pendulum-v1 --env-steps 20000 --seeds 0,1,2
    python benchmarks/exarl_sb3.py --agent ddpg --env-steps 20000 --seeds 0 --no-sb3
    python benchmarks/exarl_sb3.py --agent a2c --env CartPole-v1 --env-steps 200000 --seeds 0,1,2

TD3 and DDPG, both sides: 256-256 ReLU actor and critics, Adam 1e-3, batch 256, replay
200k, 1000 uniform-random steps first, γ 0.99, τ 0.005, Gaussian exploration noise 0.1
of the action half-range, one update per environment step; TD3 adds policy delay 2 and
target smoothing 0.2 clipped at 0.5. popplay is ``popplay train td3|ddpg`` (sequential:
an episode, then its updates); SB3 updates after every step (train_freq 1).

A2C, both sides: 8 environment copies, an update on every 16 steps of all 8 (128
transitions), separate 64-64 tanh policy and value networks, Adam 1e-3, γ 0.99, value
weight 0.5, entropy 0.01, gradient norm clip 0.5, n-step returns (SB3: ``gae_lambda=1``,
no advantage normalisation). popplay is ``popplay train a2c`` (sequential workflow,
V-trace on: it plays whole episodes on the 8 copies with the policy of the phase's
start, so later segments are off-policy); SB3 steps the 8 copies in lock-step and
resets each as it ends.

``quality`` is the mean return of ``--eval-episodes`` greedy (noiseless) episodes played
by the same code (:func:`popplay.deep.topologies.common.greedy_quality`) for both. One torch
thread each. Results: one JSON line per seed on stderr, the whole report on stdout.
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


def popplay_run(agent: str, env_id: str, env_steps: int, seed: int, eval_episodes: int) -> dict[str, Any]:
    from popplay.api import train
    from popplay.deep.topologies.exarl import A2CParams, DDPGParams, TD3Params

    params_type = {"td3": TD3Params, "ddpg": DDPGParams, "a2c": A2CParams}[agent]
    params = params_type(env=env_id, env_steps=env_steps, seed=seed, eval_episodes=eval_episodes)
    with tempfile.TemporaryDirectory() as tmp:
        out = train(params, out=Path(tmp) / "run.h5").summary
    return {"quality": out["quality"], "seconds": out["seconds"], "env_steps": out["env_steps"],
            "env_steps_per_second": out["env_steps_per_second"]}


def sb3_a2c(env_id: str, env_steps: int, seed: int, eval_episodes: int) -> dict[str, Any]:
    import torch
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    from popplay.deep.topologies.common import greedy_quality

    torch.set_num_threads(1)
    env = make_vec_env(env_id, n_envs=8, seed=seed)
    model = A2C("MlpPolicy", env, learning_rate=1e-3, n_steps=16, gamma=0.99, gae_lambda=1.0, ent_coef=0.01,
                vf_coef=0.5, max_grad_norm=0.5, normalize_advantage=False, seed=seed, device="cpu",
                policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.Tanh,
                               "optimizer_class": torch.optim.Adam})
    started = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    seconds = time.perf_counter() - started

    def act(obs: Any) -> Any:
        return model.predict(obs, deterministic=True)[0]

    quality = greedy_quality(env_id, act, eval_episodes, seed)[0]
    return {"quality": quality, "seconds": seconds, "env_steps": int(model.num_timesteps),
            "env_steps_per_second": model.num_timesteps / seconds}


def sb3_run(agent: str, env_id: str, env_steps: int, seed: int, eval_episodes: int) -> dict[str, Any]:
    if agent == "a2c":
        return sb3_a2c(env_id, env_steps, seed, eval_episodes)
    import gymnasium
    import numpy as np
    import torch
    from stable_baselines3 import DDPG, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    from popplay.deep.topologies.common import greedy_quality

    torch.set_num_threads(1)
    env = gymnasium.make(env_id)
    half_range = (env.action_space.high - env.action_space.low) / 2.0
    noise = NormalActionNoise(mean=np.zeros_like(half_range), sigma=0.1 * half_range)
    common = dict(learning_rate=1e-3, buffer_size=200_000, learning_starts=1_000, batch_size=256, tau=0.005,
                  gamma=0.99, train_freq=1, gradient_steps=1, action_noise=noise,
                  policy_kwargs={"net_arch": [256, 256]}, seed=seed, device="cpu")
    if agent == "td3":
        model = TD3("MlpPolicy", env, policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5, **common)
    else:
        model = DDPG("MlpPolicy", env, **common)
    started = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    seconds = time.perf_counter() - started

    def act(obs: np.ndarray) -> np.ndarray:
        return model.predict(obs, deterministic=True)[0]

    quality = greedy_quality(env_id, act, eval_episodes, seed)[0]
    return {"quality": quality, "seconds": seconds, "env_steps": env_steps, "env_steps_per_second": env_steps / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", choices=("td3", "ddpg", "a2c"), default="td3")
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--env-steps", type=int, default=20_000)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--no-sb3", action="store_true", help="popplay only")
    parser.add_argument("--no-popplay", action="store_true", help="stable-baselines3 only")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        row: dict[str, Any] = {"seed": seed}
        if not args.no_popplay:
            row["popplay"] = popplay_run(args.agent, args.env, args.env_steps, seed, args.eval_episodes)
        if not args.no_sb3:
            row["sb3"] = sb3_run(args.agent, args.env, args.env_steps, seed, args.eval_episodes)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    print(json.dumps({"agent": args.agent, "env": args.env, "env_steps": args.env_steps, "runs": rows}))


if __name__ == "__main__":
    main()

"""Deep populations (``train dqn --agents P``): throughput and what the operators buy (not a test).

    python benchmarks/deep_population.py throughput [--members 64] [--steps 3000] [--hidden 128,128] [--repeats 1]
    python benchmarks/deep_population.py quality [--seeds 0,1,2] [--steps 60000] [--env CartPole-v1] [--variants "A;B"]
    python benchmarks/deep_population.py reach [--seeds 0,1,2] [--steps 100000] [--check-every 5000] [--variants "A;B"]

``throughput``, side by side in one run on this machine, DQN on CartPole-v1 (with
``--env popplay/CartPole-v1`` popplay's rows run on its numba drop-in, which a
population steps as one batch; stable-baselines3 always on gymnasium's) with one network
and schedule for all (``--hidden``, batch 64, replay 50k, learning starts at 1,000
steps, one update every 4 env-steps: SB3's ``train_freq=4``), each run ``--steps``
env-steps per member:

- popplay's population engine with P members in one process, and with two;
- popplay's one-agent DQN (``--topology sequential --train-every 4``);
- stable-baselines3's DQN, two runs at once (what a one-process-per-member tool gets
  from these two cores): their combined env-steps/s is the rate at which 64 such runs
  executed two at a time would go.

``quality``: 16 members with sampled hyper-parameters (lr log-uniform in [1e-4, 3e-3],
γ in {0.98, 0.99, 0.995}, target period in {100, 250, 500}), the same 16 samples
trained independently (the population with its operators off is exactly that: member
``k`` is member ``k`` alone), PBT (truncation at every step; and its t-test form, which
copies only a clearly better parent and starts once ε has fallen), and experience-weighted
sharing, each ``--steps`` env-steps per member, per seed. Reported: the best member's greedy mean return over
100 episodes at the end, and the total env-steps at which the best member's training
mean (last 10 episodes, ε-greedy) first reached ``--threshold`` (default: the
environment's own ``reward_threshold``: 475 for CartPole-v1, −100 for Acrobot-v1,
200 for LunarLander-v3, which needs ``pip install -e ".[box2d]"``).

``reach``: the issue's measure of "reaches a 100-episode greedy mean of 475": the same
16 samples and variants, learned in chunks of ``--check-every`` env-steps per member
(each chunk a ``--resume`` of the last, which continues the run bit for bit). After each
chunk every member plays 20 greedy episodes (``popplay evaluate``); each member whose
mean reaches the threshold then plays the 100 that decide. Reported per run: the total
env-steps at the first check where some member's 100-episode greedy mean reached the
threshold (the run stops there), and every member's 20-episode greedy mean at every check.
The checks' episodes are not counted as learning env-steps, the same for every variant;
a variant that plays episodes of its own to rank members (``--rank-by greedy``) reports
them apart (``ranking_env_steps_then``), to be added to its total.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium
import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCHEDULE = ["--batch-size", "64", "--replay", "50000", "--learning-starts", "1000", "--train-every", "4",
            "--update-ratio", "0.25", "--target-every", "250", "--epsilon-updates", "5000", "--eval-episodes", "0"]
HP = ["--hp", "lr=loguniform:1e-4:3e-3", "--hp", "gamma=choice:0.98,0.99,0.995", "--hp", "target_every=choice:100,250,500"]


def popplay(args: list[str], out: Path | None = None) -> dict:
    """``popplay train dqn ARGS --json`` (into ``out``, or a file thrown away; none when resuming)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        where = [] if "--resume" in args else ["--out", str(out or Path(tmp) / "run.h5")]
        cmd = [sys.executable, "-m", "popplay", "train", "dqn", *args, "--json", *where]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


SB3_RUN = """
import json, sys, time, gymnasium, torch
from stable_baselines3 import DQN
torch.set_num_threads(1)
steps, hidden, seed = int(sys.argv[1]), [int(w) for w in sys.argv[2].split(",")], int(sys.argv[3])
model = DQN("MlpPolicy", gymnasium.make("CartPole-v1"), learning_rate=1e-3, buffer_size=50_000, learning_starts=1_000,
            batch_size=64, gamma=0.99, train_freq=4, gradient_steps=1, target_update_interval=1_000,
            exploration_fraction=0.5, exploration_final_eps=0.05, max_grad_norm=10.0, seed=seed, device="cpu",
            policy_kwargs={"net_arch": hidden})
start = time.perf_counter()
model.learn(total_timesteps=steps)
print(json.dumps({"env_steps": steps, "seconds": time.perf_counter() - start}))
"""


def sb3_pair(steps: int, hidden: str) -> dict:
    """Two SB3 DQN runs at once; their combined env-steps/s (wall time of the pair)."""
    start = time.perf_counter()
    runs = [subprocess.Popen([sys.executable, "-c", SB3_RUN, str(steps), hidden, str(seed)], stdout=subprocess.PIPE,
                             text=True) for seed in (0, 1)]
    outs = [json.loads(run.communicate(timeout=7200)[0].strip().splitlines()[-1]) for run in runs]
    wall = time.perf_counter() - start
    return {"env_steps": 2 * steps, "seconds": wall, "env_steps_per_second": 2 * steps / wall,
            "per_run_learn_seconds": [o["seconds"] for o in outs]}


def throughput(args: argparse.Namespace) -> dict:
    """The rows side by side, ``--repeats`` rounds of all of them one after another:
    rates and ratios are the median over the rounds, each ratio taken within one round
    (this machine's speed drifts between rounds; the one-agent run, under a second at
    3,000 env-steps, moved by 60 % from one run of this command to the next)."""
    common = ["--env", args.env, "--hidden", args.hidden, *SCHEDULE]  # SB3 steps gymnasium's CartPole-v1
    population = f"popplay population, {args.members} members"
    rounds = []
    for _ in range(args.repeats):
        rows = {population: popplay(["--agents", str(args.members), "--env-steps", str(args.members * args.steps),
                                     "--phase-steps", "500", *common]),
                "popplay population, 2 members": popplay(["--agents", "2", "--env-steps", str(2 * args.steps),
                                                          "--phase-steps", "500", *common]),
                "popplay one agent (sequential)": popplay(["--env-steps", str(args.steps), *common]),
                "stable-baselines3, 2 runs at once": sb3_pair(args.steps, args.hidden)}
        table = {name: round(row["env_steps_per_second"], 1) for name, row in rows.items()}
        one_agent = table["popplay one agent (sequential)"]
        rounds.append({"env_steps_per_second": table,
                       "population_over_one_agent": round(table[population] / one_agent, 2),
                       "population_over_sb3_pairs": round(table[population]
                                                          / table["stable-baselines3, 2 runs at once"], 2)})
    return {"env": args.env, "hidden": args.hidden, "steps_per_member": args.steps, "repeats": args.repeats,
            "env_steps_per_second": {name: round(statistics.median(r["env_steps_per_second"][name] for r in rounds), 1)
                                     for name in rounds[0]["env_steps_per_second"]},
            **{key: round(statistics.median(r[key] for r in rounds), 2)
               for key in ("population_over_one_agent", "population_over_sb3_pairs")},
            "rounds": rounds}


def first_reaching(path: Path, threshold: float) -> int | None:
    with h5py.File(path) as f:
        steps = np.asarray(f["curves"]["agent_steps"])
        best = np.asarray(f["curves"]["return_best"])
    hit = np.flatnonzero(best >= threshold)
    return int(steps[hit[0]]) if hit.size else None


VARIANTS = {
    "independent (random search)": [],
    "PBT": ["--replicate-every", "10000", "--replicate-fraction", "0.25", "--window", "20"],
    # PBT's t-test exploit, from the end of ε's fall (5,000 updates at 0.25 per env-step) on.
    "PBT significant, after 20k": ["--replicate-every", "10000", "--replicate-fraction", "0.25", "--window", "20",
                                   "--replicate-when", "significant", "--replicate-after", "20000"],
    # PBT whose copies are whole clones: the parent's replay memory too, so a copied
    # network goes on learning from the experience it was learning from.
    "PBT, replay copied": ["--replicate-every", "10000", "--replicate-fraction", "0.25", "--window", "20",
                           "--copy-replay"],
    # Fewer, rarer and better-founded replacements: two members every 20,000 env-steps,
    # ranked over 50 episodes, copied whole.
    "PBT, gentle": ["--replicate-every", "20000", "--replicate-fraction", "0.125", "--window", "50",
                    "--copy-replay"],
    "sharing": ["--share-every", "5000"],
    # PBT over a shared network: every member starts each 10,000-step window from the
    # same weights, so truncation ranks hyper-parameters rather than network luck.
    "PBT with sharing": ["--replicate-every", "10000", "--replicate-fraction", "0.25", "--window", "20",
                         "--share-every", "5000"],
    # PBT ranked by 5 greedy episodes per member at each step (their env-steps reported apart)
    "PBT greedy-ranked": ["--replicate-every", "10000", "--replicate-fraction", "0.25", "--rank-by", "greedy",
                          "--rank-episodes", "5"],
}


def chosen_variants(args: argparse.Namespace) -> dict[str, list[str]]:
    return {name: VARIANTS[name] for name in args.variants} if args.variants else dict(VARIANTS)


def quality(args: argparse.Namespace) -> dict:
    variants = chosen_variants(args)
    rows: dict[str, list[dict]] = {name: [] for name in variants}
    for seed in args.seeds:
        for name, extra in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "run.h5"
                summary = popplay(["--agents", "16", "--env", args.env, "--env-steps", str(16 * args.steps),
                                   "--seed", str(seed), "--phase-steps", "1000", *HP, *SCHEDULE[:-2],
                                   "--eval-episodes", "100", *extra], out)
                reached = first_reaching(out, args.threshold)
            rows[name].append({"seed": seed, "best_quality": summary["quality"], "mean_quality": summary["quality_mean"],
                               "env_steps_to_threshold_training": reached, "seconds": round(summary["seconds"], 1)})
            print(name, rows[name][-1], flush=True)
    return {"env": args.env, "steps_per_member": args.steps, "members": 16, "threshold": args.threshold, "runs": rows}


def evaluate(out: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "popplay", "evaluate", str(out), "--json", *extra]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def reach_one(args: argparse.Namespace, seed: int, extra: list[str], out: Path) -> dict:
    """One variant and seed, learned --check-every env-steps per member at a time until
    some member's 100-episode greedy mean reaches the threshold or --steps run out."""
    checks, started, reached, members = [], time.perf_counter(), None, 16
    for done in range(args.check_every, args.steps + 1, args.check_every):
        total = str(members * done)
        if done == args.check_every:
            summary = popplay(["--agents", str(members), "--env", args.env, "--env-steps", total, "--seed", str(seed),
                               "--phase-steps", "1000", *HP, *SCHEDULE, *extra], out)
        else:
            summary = popplay(["--resume", str(out), "--env-steps", total])
        screened = evaluate(out, "--episodes", "20")["member_quality"]
        decided = {}
        for member in np.flatnonzero(np.asarray(screened) >= args.threshold):
            decided[int(member)] = evaluate(out, "--episodes", "100", "--member", str(member))["quality"]
        checks.append({"env_steps": int(total), "ranking_env_steps": summary.get("ranking_env_steps", 0),
                       "best_greedy_20": max(screened), "members_greedy_20": [round(x, 1) for x in screened],
                       "decided_100": decided})
        print(f"  seed {seed} {int(total):>9,} env-steps: best of 20 greedy episodes {max(screened):.1f}"
              + (f"; 100 episodes {decided}" if decided else ""), flush=True)
        if any(value >= args.threshold for value in decided.values()):
            reached = int(total)
            break
    return {"seed": seed, "env_steps_to_threshold_greedy100": reached,
            "ranking_env_steps_then": checks[-1]["ranking_env_steps"] if checks else 0, "checks": checks,
            "wall_seconds": round(time.perf_counter() - started, 1)}


def reach(args: argparse.Namespace) -> dict:
    variants = chosen_variants(args)
    rows: dict[str, list[dict]] = {name: [] for name in variants}
    for seed in args.seeds:
        for name, extra in variants.items():
            print(name, f"seed {seed}", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                rows[name].append(reach_one(args, seed, extra, Path(tmp) / "run.h5"))
            print(name, {k: v for k, v in rows[name][-1].items() if k != "checks"}, flush=True)
    return {"env": args.env, "steps_per_member": args.steps, "check_every": args.check_every, "members": 16,
            "threshold": args.threshold, "runs": rows}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("throughput", "quality", "reach"))
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("--steps", type=int, default=None, help="env-steps per member")
    parser.add_argument("--hidden", default="128,128")
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--variants", type=lambda s: s.split(";"), default=None,
                        help="quality: only these variants, separated by ';'")
    parser.add_argument("--check-every", type=int, default=5000,
                        help="reach: env-steps per member between greedy checks")
    parser.add_argument("--repeats", type=int, default=1,
                        help="throughput: rounds of every row (medians reported, ratios taken within a round)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--threshold", type=float, default=None,
                        help="quality: the training return to reach (default: the environment's reward_threshold)")
    args = parser.parse_args(argv)
    if args.threshold is None and args.what in ("quality", "reach"):
        args.threshold = float(gymnasium.spec(args.env).reward_threshold)
    if args.steps is None:
        args.steps = 3000 if args.what == "throughput" else 100_000
    result = {"throughput": throughput, "quality": quality, "reach": reach}[args.what](args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

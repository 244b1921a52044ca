"""EXARL's multi-process A2C workflows compared (not a test): two short comparisons.

    python benchmarks/exarl_workflows.py [--episodes 300] [--seeds 0,1] [--actors 4]
        [--learners 2] [--parts selection,inference] [--json FILE]

1. Window selection (the EXARL paper, Fig. 14): ``--workflow multi-learner`` with range-based
   selection (each learner pops its own block of actors' queues) against random
   selection (any active actor's newest trajectory, read without removing it), same
   seeds and budgets. Columns: greedy quality (10 episodes), mean return of the last
   100 episodes played, trajectories read and produced (reads beyond the produced
   ones are duplicates), learner updates, wall seconds of learning.
2. Inference placement (the EXARL paper, Figs. 9-10, 17): ``central-inference`` (actors send
   observations, one rank infers for all and learns) against actor-side inference
   (``master-learner`` with one learner: actors hold a copy of the policy, send
   whole trajectories and get the weights back). Columns: point-to-point bytes moved
   (every message counted once, at its sender), bytes per env-step, env-steps/s.

Every run is a real job of ``popplay train a2c`` (gloo, one process per rank,
``--hidden 32``); each launch costs several seconds of process start-up that the
``seconds`` column does not include (it is the runner's learning time).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "popplay", "train", "a2c", *args, "--hidden", "32", "--eval-episodes", "10",
               "--json", "--out", str(Path(tmp) / "run.h5")]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--parts", default="selection,inference", help="which comparisons to run")
    parser.add_argument("--json", type=Path)
    a = parser.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    parts = set(a.parts.split(","))
    report: dict = {"selection": [], "inference": []}
    if "selection" in parts:
        _selection(a, seeds, report)
    if "inference" in parts:
        _inference(a, seeds, report)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    return report


def _selection(a: argparse.Namespace, seeds: list[int], report: dict) -> None:
    print(f"1. multi-learner, {a.learners} learners, {a.actors} actors, {a.episodes} episodes")
    print(f"{'selection':>9} {'seed':>4} {'quality':>8} {'return':>7} {'reads':>6} {'produced':>8} "
          f"{'updates':>7} {'helped':>6} {'seconds':>7}")
    for selection in ("range", "random"):
        for seed in seeds:
            s = run(["--workflow", "multi-learner", "--selection", selection, "--learners", str(a.learners),
                     "--actors", str(a.actors), "--episodes", str(a.episodes), "--seed", str(seed)])
            row = {"selection": selection, "seed": seed, "quality": s["quality"], "return": s["return"],
                   "reads": s["topology_reads"], "produced": s["topology_produced"], "updates": s["updates"],
                   "helped": s["topology_helped"], "seconds": s["seconds"]}
            report["selection"].append(row)
            print(f"{selection:>9} {seed:>4} {row['quality']:>8.1f} {row['return']:>7.1f} {row['reads']:>6} "
                  f"{row['produced']:>8} {row['updates']:>7} {row['helped']:>6} {row['seconds']:>7.1f}")



def _inference(a: argparse.Namespace, seeds: list[int], report: dict) -> None:
    print(f"\n2. inference placement, {a.actors} actors, {a.episodes} episodes")
    print(f"{'inference':>11} {'seed':>4} {'env-steps':>9} {'bytes':>10} {'bytes/step':>10} {'steps/s':>8} "
          f"{'quality':>8}")
    for seed in seeds:
        for name, args in (("central", ["--workflow", "central-inference"]),
                           ("actor-side", ["--workflow", "master-learner", "--learners", "1"])):
            s = run([*args, "--actors", str(a.actors), "--episodes", str(a.episodes), "--seed", str(seed)])
            row = {"inference": name, "seed": seed, "env_steps": s["env_steps"], "bytes": s["topology_bytes"],
                   "bytes_per_step": s["topology_bytes"] / max(1, s["env_steps"]),
                   "steps_per_second": s["env_steps_per_second"], "quality": s["quality"]}
            report["inference"].append(row)
            print(f"{name:>11} {seed:>4} {row['env_steps']:>9} {row['bytes']:>10} {row['bytes_per_step']:>10.1f} "
                  f"{row['steps_per_second']:>8.0f} {row['quality']:>8.1f}")


if __name__ == "__main__":
    main()

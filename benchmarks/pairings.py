"""Agents in the other family's topologies learn, not only move bytes (not a test).

    python benchmarks/pairings.py [--only dqn-multi-learner,...] [--json FILE]

Each row is one real job of ``popplay train AGENT`` (gloo, one process per rank) in a
pairing that issue 26's agent and topology protocols made possible: the replay agents
in the topologies of the other seed (DQN in EXARL's workflows, TD3 and DDPG in seed
003's) and REINFORCE in EXARL's workflows. Columns: greedy quality (``--eval-episodes``
episodes), the mean return of the last 100 training episodes, env-steps, the runner's
learning seconds and env-steps/s (process start-up excluded), and the exactness
counters every multi-process topology reports (what arrived equals what was played).
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

# name -> (agent, layout and budget); CartPole-v1 for the discrete agents, Pendulum-v1 for TD3/DDPG.
PAIRINGS: dict[str, tuple[str, list[str]]] = {
    "dqn-multi-learner": ("dqn", ["--topology", "multi-learner", "--learners", "2", "--simulators", "2",
                                  "--env-steps", "50000", "--eval-episodes", "20"]),
    "dqn-central-inference": ("dqn", ["--topology", "central-inference", "--simulators", "2",
                                      "--env-steps", "30000", "--eval-episodes", "20"]),
    "td3-collective": ("td3", ["--workflow", "collective", "--actors", "2", "--env-steps", "15000",
                               "--eval-episodes", "10"]),
    "ddpg-async": ("ddpg", ["--workflow", "async", "--actors", "2", "--env-steps", "15000", "--eval-episodes", "10"]),
    "reinforce-master-learner": ("reinforce", ["--topology", "master-learner", "--learners", "2", "--workers", "2",
                                               "--lr", "0.001", "--episodes", "2000", "--eval-episodes", "20"]),
}


def run(agent: str, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "popplay", "train", agent, *args, "--json", "--out", str(Path(tmp) / "run.h5")]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def exact(summary: dict) -> str:
    """The topology's own account: every transition or episode played arrived, once."""
    if "topology_sent" in summary:
        same = (summary["topology_sent"] == summary["topology_received"]
                and summary["topology_sent_checksum"] == summary["topology_received_checksum"])
        return f"sent = received: {same}"
    same = summary["topology_produced_checksum"] == summary["topology_reads_checksum"]
    identical = summary.get("topology_learners_identical")
    return f"played = read: {same}, learners identical: {bool(identical)}"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(PAIRINGS), help="comma-separated pairings to run")
    parser.add_argument("--json", type=Path)
    a = parser.parse_args(argv)
    rows = []
    print("| pairing | quality | last-100 return | env-steps | seconds | env-steps/s | exactness |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in a.only.split(","):
        agent, args = PAIRINGS[name]
        s = run(agent, args)
        rows.append({"pairing": name, **s})
        quality = "n/a" if s.get("quality") is None else f"{s['quality']:.1f}"
        print(f"| {name} | {quality} | {s['return']:.1f} | {s['env_steps']:,} | {s['seconds']:.1f} | "
              f"{s['env_steps_per_second']:,.0f} | {exact(s)} |", flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()

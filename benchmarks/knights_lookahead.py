"""Knights agents that look two plies ahead (``--lookahead 2``) against the two-ply material search.

    PYTHONPATH=. python benchmarks/knights_lookahead.py --seconds 120 --games 1000 \
        --json benchmarks/results/knights_lookahead.json

For each training lookahead (1, 2) one population is trained for ``--seconds`` of
learning (``popplay train knights``, Bell's settings otherwise), then every agent of it
plays ``--games`` games against ``search`` (the two-ply material search) with each
evaluation lookahead (1, 2) (``popplay evaluate --opponent search --lookahead``). Each row:
the training speed (agent-turns/s), episodes learned, and the best agent's score with its
Wilson 95 % interval, the mean and the worst. One run per row (learning runs on a shared
2-core machine move with whatever else runs).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine_info  # noqa: E402


def _popplay(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "popplay", *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"popplay {' '.join(args)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="learning seconds per population")
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--games", type=int, default=1000, help="games per agent in each evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-lookaheads", default="1,2")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for trained in (int(v) for v in args.train_lookaheads.split(",")):
            out = Path(tmp) / f"lookahead{trained}.h5"
            summary = _popplay("train", "knights", "--agents", str(args.agents), "--episodes", "1000000",
                               "--time-budget", str(args.seconds), "--seed", str(args.seed),
                               "--lookahead", str(trained), "--out", str(out), "--quiet")
            for played in (1, 2):
                result = _popplay("evaluate", str(out), "--opponent", "search", "--games", str(args.games),
                                  "--lookahead", str(played))
                row = {"trained_lookahead": trained, "eval_lookahead": played,
                       "episodes": summary.get("phases"),
                       "agent_turns_per_second": summary["agent_steps_per_second"],
                       "learning_seconds": summary["seconds"], "games": result["games"],
                       "best": result["best"], "best_ci95": result["best_ci95"], "mean": result["mean"],
                       "worst": result["worst"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    payload = {"machine": machine_info(), "seconds": args.seconds, "agents": args.agents, "games": args.games,
               "seed": args.seed, "opponent": "search", "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()

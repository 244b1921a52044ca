"""Knights engine speed for each agent size and move chooser, on both engines (not a test).

    PYTHONPATH=. python benchmarks/knights_sizes.py [--agents 64] [--games 64] [--budget 8]
        [--hidden 4,16,64] [--hidden2 0,16] [--lookaheads 1,2] [--engines numba,torch]
        [--json benchmarks/results/knights_sizes.json]

Each row: agent-turns per second of self-play learning (TD(λ) updates included) at
``--agents`` x ``--games`` games per agent, Bell's settings otherwise, for one network
size (``--hidden`` units, ``--hidden2`` units in a second layer, 0: none), move
chooser (``--lookahead``) and engine (numba: fused loops, all threads; torch: batched
tensors on the CPU, eager). The best of a few timed rounds after one untimed episode
(:func:`benchmarks._common.time_phases`), each round as many episodes as fit in
``--budget`` seconds. Populations start untrained, so games run long (near the turn
limit) and the rates are those of early training.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine_info, time_phases  # noqa: E402
from popplay.core.backend import Backend  # noqa: E402
from popplay.games.knights.experiment import KnightsExperiment  # noqa: E402
from popplay.games.knights.rules import KnightsParams  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def measure(args: argparse.Namespace) -> list[dict]:
    rows = []
    for lookahead in args.lookaheads:
        for hidden2 in args.hidden2:
            for hidden in args.hidden:
                for engine in args.engines:
                    params = KnightsParams(agents=args.agents, games_per_agent=args.games, episodes=10**9,
                                           hidden=hidden, hidden2=hidden2, lookahead=lookahead)
                    experiment = KnightsExperiment(params, Backend(engine, "cpu"))
                    # one untimed episode, then rounds of one episode while the budget lasts
                    started = time.perf_counter()
                    timing = time_phases(experiment, phases=1, repeats=3, budget=args.budget)
                    rows.append({"engine": engine, "hidden": hidden, "hidden2": hidden2, "lookahead": lookahead,
                                 "agent_turns_per_second": round(timing.rate),
                                 "rounds": [round(r) for r in timing.rounds],
                                 "wall_seconds": round(time.perf_counter() - started, 1)})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--games", type=int, default=64, help="games per agent per episode")
    parser.add_argument("--budget", type=float, default=8.0, help="seconds of timed episodes per row")
    parser.add_argument("--hidden", type=_ints, default=[4, 16, 64])
    parser.add_argument("--hidden2", type=_ints, default=[0, 16])
    parser.add_argument("--lookaheads", type=_ints, default=[1, 2])
    parser.add_argument("--engines", type=lambda s: s.split(","), default=["numba", "torch"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = {"machine": machine_info(), "agents": args.agents, "games_per_agent": args.games,
              "rows": measure(args)}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

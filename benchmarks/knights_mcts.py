"""The ladder with the Monte-Carlo tree searches among its rungs (not a test).

    PYTHONPATH=. python benchmarks/knights_mcts.py [--games 400] [--json benchmarks/results/knights_ladder_mcts.json]

Rates the default ladder's rungs together with ``mcts100`` … ``mcts6400`` (UCT with
that many playouts a move; docs/knights.md) in one round robin, ``--games`` games per
pair on the default board, random anchored at 0: what ``popplay evaluate RUN --ladder
--rungs ...`` rates and caches the first time it meets this set of rungs. Prints the
ratings with their standard errors and the wall time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine_info  # noqa: E402
from popplay.games.knights.rules import LADDER_RUNGS, MCTS_PLAYOUTS, KnightsParams  # noqa: E402
from popplay.tournaments.ladder import rate_rungs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=400, help="games per pair of rungs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rungs = LADDER_RUNGS + tuple(f"mcts{n}" for n in MCTS_PLAYOUTS)
    started = time.perf_counter()
    rated = rate_rungs(KnightsParams(), args.games, rungs=rungs)
    seconds = time.perf_counter() - started
    result = {"machine": machine_info(), "games_per_pair": args.games, "seconds": round(seconds, 1),
              "rungs": {name: {"elo": round(float(r), 1), "se": round(float(e), 1)}
                        for name, r, e in sorted(zip(rated.names, rated.ratings, rated.errors), key=lambda x: x[1])}}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

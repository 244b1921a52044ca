"""Knights throughput against this machine's evaluation ceiling, and learning quality.

    python benchmarks/knights.py              # throughput table (+ JSON in benchmarks/results/)
    python benchmarks/knights.py --quality    # also: 16 agents, 240 s of learning, curves and final quality
    python benchmarks/knights.py --replication-only [--replication-seconds 240] [--replication-agents 64]
            [--replication-variants none,replication,gentle,scores]
        # selective replication with variation against none, at equal learning time:
        # both runs at once, one numba thread each (so they share whatever load the
        # machine has), then 1000 games per agent against greedy

Ceiling: numpy's batched evaluation of a 70-4-1 sigmoid MLP (after-states per second),
measured here in fresh processes with one and with all BLAS threads, float32 and
float64, the best of all. An agent-turn evaluates every legal after-state (about 20
on 5 x 7 with 5 knights), so ceiling / moves-per-ply is the turn rate of a player
that only evaluated; the goal is 0.25 of it with learning included, measured on the
default CPU backend at 64 agents x 64 games per agent.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from popplay.games.knights import rules as game
from popplay.games.knights.rules import KnightsParams
from popplay.core.backend import Backend, cuda_available
from popplay.games.knights.experiment import KnightsExperiment
from popplay.training.loop import run

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, time_phases  # noqa: E402

CEILING_CODE = """
import sys, time, numpy as np
evaluations = int(sys.argv[1])
rng = np.random.default_rng(0)
best = {}
for dt in (np.float32, np.float64):
    for n in (4096, 16384, 65536):
        x = (rng.random((n, 70)) < 0.14).astype(dt)
        w1 = rng.standard_normal((70, 4)).astype(dt); b1 = np.zeros(4, dt)
        w2 = rng.standard_normal((4, 1)).astype(dt); b2 = np.zeros(1, dt)
        reps = max(3, evaluations // n)
        rate = 0.0
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(reps):
                h = x @ w1; h += b1; np.negative(h, out=h); np.exp(h, out=h); h += 1; np.reciprocal(h, out=h)
                y = h @ w2; y += b2; np.negative(y, out=y); np.exp(y, out=y); y += 1; np.reciprocal(y, out=y)
            rate = max(rate, n * reps / (time.perf_counter() - t))
        best[f"{dt.__name__} batch {n}"] = rate
print(max(best.values()))
"""


def ceiling(evaluations: int = 1_500_000) -> dict:
    """numpy 70-4-1 MLP evaluations per second, best over BLAS thread counts (each
    configuration: best of 3 rounds of about ``evaluations`` evaluations)."""
    out = {}
    for threads in ("1", str(os.cpu_count() or 1)):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        proc = subprocess.run([sys.executable, "-c", CEILING_CODE, str(evaluations)], capture_output=True, text=True,
                              check=True, env=env)
        out[f"blas threads {threads}"] = float(proc.stdout.split()[-1])
    return out


def moves_per_ply(state, params: KnightsParams, games: int = 40) -> float:
    """Mean legal moves per ply in games between the population's agents (greedy play)."""
    nets = state.networks
    counts = []
    for g in range(games):
        board = game.random_board(params.rows, params.cols, params.pieces, seed=99, game=g)
        players = {1: nets.agent(g % nets.count), -1: nets.agent((g + 1) % nets.count)}
        player = 1
        for _ in range(params.max_turns):
            moves = game.legal_moves(board, player)
            if moves:
                counts.append(len(moves))
                board = game.apply_move(board, game.best_move(players[player], board, player))
                if game.winner(board):
                    break
            player = -player
    return float(np.mean(counts))


def turn_ceiling(state, params: KnightsParams, evaluations: int = 1_500_000, games: int = 40) -> dict:
    """The turn rate of a player that only evaluated: the evaluation ceiling divided by
    the mean legal moves per ply in games between ``state``'s agents."""
    ceil = ceiling(evaluations)
    branching = moves_per_ply(state, params, games)
    return {"evaluations_per_second": ceil, "evaluations": max(ceil.values()), "moves_per_ply": branching,
            "turns_per_second": max(ceil.values()) / branching}


def learning_rate(params: KnightsParams, backend: Backend, episodes: int, warm_episodes: int = 200, *,
                  repeats: int = 1, budget: float | None = None, state=None) -> dict:
    """Agent-turns per second of learning (episodes incl. weight updates), after a warm-up
    that also lets the agents learn to finish games (early games run to the turn limit):
    the best of ``repeats`` rounds of ``episodes`` episodes (or of as many as fit in
    ``budget`` seconds), continuing ``state`` if given (then a short warm-up will do)."""
    timing = time_phases(KnightsExperiment(params, backend), phases=episodes, repeats=repeats, budget=budget,
                         warm_phases=warm_episodes, state=state)
    return {"turns_per_second": timing.rate, "seconds": timing.seconds, "turns": timing.steps,
            "episodes": timing.calls, "rounds": timing.rounds,
            "plies_per_game": timing.steps / (timing.calls * params.agents * params.games_per_agent),
            "state": timing.state}


def quality_run(seconds: float) -> dict:
    """Default settings, 16 agents, ``seconds`` of learning; then 1000 games per agent."""
    params = KnightsParams(agents=16, episodes=10**9)
    experiment = KnightsExperiment(params, Backend("numba", "cpu"))
    result = run(experiment, time_budget=seconds)
    final = experiment.evaluate(result.state, 1000, ("random", "greedy", "search"))
    curve = {name: values for name, values in result.curve.metrics.items()}
    points = [i for i, e in enumerate(curve["eval_episode"]) if i == 0 or e != curve["eval_episode"][i - 1]]
    return {
        "learning_seconds": result.learning_seconds, "episodes": result.state.episode, "turns": result.state.turns,
        "turns_per_second": result.state.turns / result.learning_seconds,
        "curve": {"seconds": [result.curve.seconds[i] for i in points],
                  "episode": [curve["eval_episode"][i] for i in points],
                  **{f"{o}_{s}": [curve[f"{o}_{s}"][i] for i in points]
                     for o in ("random", "greedy") for s in ("best", "mean", "worst")}},
        "final_1000_games": {name: q.summary() for name, q in final.items()},
    }


# The replication settings compared against none (docs/tournaments.md says why).
REPLICATION = ("--replicate-every", "5", "--replicate-fraction", "0.25", "--mutate-weights", "0.01",
               "--mutate-params", "1", "--tournament-games", "2")
VARIANTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "replication": REPLICATION,
    "gentle": ("--replicate-every", "20", "--replicate-fraction", "0.125", "--mutate-weights", "0.01",
               "--mutate-params", "1", "--tournament-games", "2"),
    "scores": ("--replicate-every", "5", "--replicate-fraction", "0.25", "--mutate-weights", "0.01",
               "--mutate-params", "1", "--tournament-games", "0"),
}


def replication_comparison(seconds: float, agents: int = 16, seed: int = 1, games: int = 1000,
                           variants: dict[str, tuple[str, ...]] | None = None,
                           workdir: Path | None = None) -> dict:
    """Runs the variants side by side (one numba thread each, same seed and time budget)
    with ``popplay train knights``, then evaluates every final population against greedy."""
    import tempfile

    import h5py

    variants = variants or {"none": (), "replication": REPLICATION}
    workdir = Path(workdir or tempfile.mkdtemp(prefix="popplay-replication-"))
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    load_before = os.getloadavg()
    procs = {}
    for name, options in variants.items():
        command = [sys.executable, "-m", "popplay", "train", "knights", "--agents", str(agents), "--episodes",
                   str(10**9), "--time-budget", str(seconds), "--seed", str(seed), "--out",
                   str(workdir / f"{name}.h5"), "--overwrite", "--json", *options]
        # to files, not pipes: progress lines would fill an undrained pipe and block a long run
        logs = (open(workdir / f"{name}.out", "w"), open(workdir / f"{name}.err", "w"))
        procs[name] = (command, subprocess.Popen(command, stdout=logs[0], stderr=logs[1], text=True, env=env))
    loads = []
    while any(p.poll() is None for _, p in procs.values()):
        loads.append(os.getloadavg()[0])
        time.sleep(10)
    report: dict = {"seconds": seconds, "agents": agents, "seed": seed, "workdir": str(workdir),
                    "load_average_1min": {"before": load_before[0], "during_mean": float(np.mean(loads or [0])),
                                          "during_max": float(np.max(loads or [0]))}, "runs": {}}
    for name, (command, proc) in procs.items():
        proc.wait()
        out, err = (workdir / f"{name}.out").read_text(), (workdir / f"{name}.err").read_text()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {err.strip().splitlines()[-1:]}")
        summary = json.loads(out.strip().splitlines()[-1])
        path = workdir / f"{name}.h5"
        evaluation = subprocess.run([sys.executable, "-m", "popplay", "evaluate", str(path), "--opponent", "greedy",
                                     "--games", str(games), "--json"], capture_output=True, text=True, check=True)
        final = json.loads(evaluation.stdout.strip().splitlines()[-1])
        with h5py.File(path) as f:
            curves = {k: f["curves"][k][()] for k in f["curves"]}
        episode = curves["eval_episode"]
        points = [i for i in range(len(episode)) if i == 0 or episode[i] != episode[i - 1]]
        report["runs"][name] = {
            "command": " ".join(command[2:]).replace(f"--out {path}", f"--out {name}.h5"),
            "episodes": summary["phases"], "turns": summary["agent_steps"], "learning_seconds": summary["seconds"],
            "turns_per_second": summary["agent_steps_per_second"],
            "final_greedy": {k: final[k] for k in ("best", "mean", "worst")}, "final_games": games,
            "curve": {"seconds": curves["seconds"][points].tolist(), "episode": episode[points].tolist(),
                      **{f"greedy_{s}": curves[f"greedy_{s}"][points].tolist() for s in ("best", "mean", "worst")}},
        }
    return report


def print_replication(report: dict, every: float = 30.0) -> None:
    runs = report["runs"]
    print(f"{report['agents']} agents, {report['seconds']:.0f} s learning each, side by side; load average "
          f"{report['load_average_1min']['during_mean']:.1f} (max {report['load_average_1min']['during_max']:.1f})")
    for name, r in runs.items():
        f = r["final_greedy"]
        print(f"  {name:<12} {r['episodes']:>7,} episodes {r['turns_per_second'] / 1e6:.2f} M turns/s; "
              f"vs greedy ({r['final_games']} games/agent) best {f['best']:.3f} mean {f['mean']:.3f} "
              f"worst {f['worst']:.3f}")
    print("  greedy mean (best) over learning time:")
    marks = np.arange(every, report["seconds"] + 1e-9, every)
    for t in marks:
        cells = []
        for name, r in runs.items():
            c = r["curve"]
            i = int(np.searchsorted(c["seconds"], t, side="right")) - 1
            cells.append(f"{name} {c['greedy_mean'][i]:.3f} ({c['greedy_best'][i]:.3f}) @ep {c['episode'][i]:.0f}"
                         if i >= 0 else f"{name} -")
        print(f"    {t:5.0f} s  " + "   ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quality", action="store_true", help="also run the 240 s learning-quality check")
    parser.add_argument("--quality-seconds", type=float, default=240.0)
    parser.add_argument("--episodes", type=int, default=100, help="timed episodes at 64 x 64")
    parser.add_argument("--replication-only", action="store_true",
                        help="only compare selective replication with variation against none")
    parser.add_argument("--replication-seconds", type=float, default=240.0)
    parser.add_argument("--replication-agents", type=int, default=16)
    parser.add_argument("--replication-seed", type=int, default=1)
    parser.add_argument("--replication-variants", default="none,replication",
                        help=f"runs side by side, some of: {', '.join(VARIANTS)}")
    args = parser.parse_args()
    if args.replication_only:
        names = [n.strip() for n in args.replication_variants.split(",") if n.strip()]
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            parser.error(f"unknown --replication-variants {unknown}; choose from {', '.join(VARIANTS)}")
        report = replication_comparison(args.replication_seconds, args.replication_agents, args.replication_seed,
                                        variants={n: VARIANTS[n] for n in names})
        print_replication(report)
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        name = (f"knights_replication_{args.replication_agents}_agents_{args.replication_seconds:.0f}s_"
                f"{'_'.join(names)}.json")
        (out / name).write_text(json.dumps(report, indent=2, default=float))
        return
    report: dict = {"machine": machine_info()}
    rows = []
    params = KnightsParams(agents=64, games_per_agent=64)
    numba_rate = learning_rate(params, Backend("numba", "cpu"), args.episodes)
    ceil = turn_ceiling(numba_rate.pop("state"), params)
    evals, branching, turns_ceiling = ceil["evaluations"], ceil["moves_per_ply"], ceil["turns_per_second"]
    report["ceiling_evaluations_per_second"] = ceil["evaluations_per_second"]
    report["moves_per_ply"] = branching
    rows.append({"case": "numpy 70-4-1 MLP, evaluations/s (ceiling)", "rate": evals})
    rows.append({"case": f"turn ceiling = ceiling / {branching:.1f} moves per ply", "rate": turns_ceiling})
    rows.append({"case": "64 agents x 64 games, numba, learning incl.", "rate": numba_rate["turns_per_second"],
                 "of ceiling": numba_rate["turns_per_second"] / turns_ceiling,
                 "of ceiling at 20 moves/ply": numba_rate["turns_per_second"] / (evals / 20), "goal": 0.25,
                 "plies/game": numba_rate["plies_per_game"]})
    torch_rate = learning_rate(params, Backend("torch", "cpu"), 3, warm_episodes=2)
    torch_rate.pop("state")
    rows.append({"case": "64 agents x 64 games, torch CPU, learning incl.", "rate": torch_rate["turns_per_second"],
                 "of ceiling": torch_rate["turns_per_second"] / turns_ceiling})
    if cuda_available():
        big = KnightsParams(agents=1024, games_per_agent=256)
        gpu = learning_rate(big, Backend("torch", "cuda"), 5, warm_episodes=2)
        gpu.pop("state")
        rows.append({"case": "1024 agents x 256 games, torch CUDA", "rate": gpu["turns_per_second"], "goal": 5e7})
    if args.quality:
        report["quality"] = quality_run(args.quality_seconds)
        q = report["quality"]
        for name, s in q["final_1000_games"].items():
            rows.append({"case": f"16 agents, {q['learning_seconds']:.0f}s learning: vs {name} (1000 games)",
                         "best": s["best"], "mean": s["mean"], "worst": s["worst"]})
    report["table"] = rows
    for row in rows:
        cells = []
        for key, value in row.items():
            if key == "case":
                continue
            cells.append(f"{key} {value / 1e6:.2f}M/s" if key == "rate" else f"{key} {value:.3g}")
        print(f"{row['case']:<62} " + "  ".join(cells))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "knights.json").write_text(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    main()

"""Does knights self-play keep improving? Ladder Elo against learning time (not a test).

    python benchmarks/knights_ladder.py [--seconds 1800] [--seeds 0,1,2] [--agents 64]
        [--settings a,b,c,d] [--eval-every 100,d=20] [--eval-every-seconds 90] [--parallel 2] [--final-games 1000]
        [--confirm-games 4000] [--out benchmarks/results/knights_ladder.json]
    python benchmarks/knights_ladder.py --confirm-runs RUN.h5[,RUN.h5...] [--final-games 1000] [--confirm-games 4000]

Settings (each `popplay train knights` with `--eval-opponents ladder`, so the curves
carry the population's ladder Elo at every evaluation):

  a  Bell's: self-play within the population, no replication
  b  a + selective replication with variation as docs/results.md measured it (every 20
     episodes, an eighth replaced, weight noise 0.01)
  c  b + a league of the last 4 snapshots (taken every 50 episodes, drawn by PFSP for
     half the games), significance-based replacement and adaptive pairing
  d  c + stronger agents (32 hidden units instead of 4, copies may switch to a two-ply
     chooser: --mutate-lookahead 0.25)

Runs go `--parallel` at a time, one numba thread each, all with the same `--seconds` of
learning (evaluation excluded). Then every final population is placed on the ladder
(`popplay evaluate --ladder`, 200 games per rung) and its best agent plays
`--final-games` games against the two-ply search (the issue's goal: a score of 0.5).
Reported per setting and seed: the ladder Elo curve (best, mean, worst), the slope of
the mean over the last third of the run with its 95 % interval (least squares), the
final ladder Elo and the best agent's score against search with its Wilson interval,
also with the agents choosing two plies deep (``evaluate --lookahead 2``). The best of the
``--agents`` agents on the (own-depth) games is picked partly for its luck on them, so its
score there is biased upwards; the agent picked then plays ``--confirm-games`` held-out
games alone at its own depth (``evaluate --member``, another seed), whose score is not.
``--confirm-runs`` does only that, for run files a study left (into its own ``--out``,
by default ``results/knights_ladder_confirm.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from popplay.reproduce.knights_ladder import CONFIRM_SEED_OFFSET, options, slope
from popplay.reproduce.knights_ladder import SETTINGS as LADDER_SETTINGS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# The settings and the slope are the reproduce figure's (`popplay reproduce knights_ladder`),
# which runs them one at a time; this script runs them --parallel at a time.
SETTINGS = {name: options(name) for name in LADDER_SETTINGS}


def popplay(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "popplay", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env or {**os.environ, "PYTHONPATH": str(ROOT)})


def versus_search(path: Path, games: int, env: dict | None = None, *extra: str) -> dict:
    """Every agent of run ``path`` against the two-ply search (``popplay evaluate --json``)."""
    done = popplay("evaluate", str(path), "--opponent", "search", "--games", str(games), "--json", *extra, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"evaluate {path} failed: {(done.stderr.strip().splitlines() or [''])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def confirm_best(path: Path, chosen: dict, games: int, env: dict | None = None) -> dict:
    """The agent ``chosen`` (``versus_search``'s payload) picked as best, replayed alone
    (``--member``) over ``games`` fresh games: another seed, so other openings and dice."""
    seed = int(chosen["seed"]) + CONFIRM_SEED_OFFSET
    again = versus_search(path, games, env, "--member", str(chosen["best_agent"]), "--seed", str(seed))
    row = again["per_agent"][0]
    return {"agent": row["agent"], "lookahead": row["lookahead"], "games": again["games"], "seed": seed,
            "score": row["quality"], "ci95": row["quality_ci95"], "score_ci95": row["score_ci95"],
            "wins": row["wins"], "draws": row["draws"],
            "losses": row["losses"], "chosen_on": {"games": chosen["games"], "seed": chosen["seed"],
                                                  "score": chosen["best"], "ci95": chosen["best_ci95"]}}


def confirm_runs(args: argparse.Namespace) -> dict:
    """``--confirm-runs``: finished run files, each one's best agent against the search
    chosen over ``--final-games`` and confirmed over ``--confirm-games`` held-out games."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    report: dict = {"final_games": args.final_games, "confirm_games": args.confirm_games, "runs": {}}
    for path in args.confirm_runs:
        chosen = versus_search(Path(path), args.final_games, env)
        report["runs"][path] = {"episode": chosen["episode"], "mean": chosen["mean"],
                                "confirmed": confirm_best(Path(path), chosen, args.confirm_games, env)}
        print(path, report["runs"][path], file=sys.stderr, flush=True)
    return report


def run_study(args: argparse.Namespace) -> dict:
    import h5py

    workdir = Path(tempfile.mkdtemp(prefix="popplay-ladder-"))
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    jobs = [(name, seed) for seed in args.seeds for name in args.settings]
    common = ["train", "knights", "--agents", str(args.agents), "--episodes", str(args.episodes), "--time-budget",
              str(args.seconds), "--eval-opponents", "ladder", "--eval-games", str(args.eval_games),
              "--eval-every-seconds", str(args.eval_every_seconds), "--overwrite", "--json"]
    from popplay.games.knights.rules import KnightsParams
    from popplay.tournaments.ladder import ladder

    ladder(KnightsParams())  # rated (or read from the cache) once, before the runs that all need it
    report: dict = {"seconds": args.seconds, "agents": args.agents, "settings": {k: SETTINGS[k] for k in args.settings},
                    "eval_every": {k: args.eval_every[k] for k in args.settings}, "eval_games": args.eval_games,
                    "eval_every_seconds": args.eval_every_seconds,
                    "runs": {}}
    running: list[tuple[str, int, subprocess.Popen]] = []
    while jobs or running:
        while jobs and len(running) < args.parallel:
            name, seed = jobs.pop(0)
            out = workdir / f"{name}-{seed}.h5"
            command = [sys.executable, "-m", "popplay", *common, "--eval-every", str(args.eval_every[name]),
                       "--seed", str(seed), "--out", str(out), *SETTINGS[name]]
            # Output goes to files, not pipes: a run prints a progress line every few episodes,
            # and an undrained pipe (64 KiB) once blocked both runs of a 30-minute study at 17.
            logs = (open(workdir / f"{name}-{seed}.out", "w"), open(workdir / f"{name}-{seed}.err", "w"))
            running.append((name, seed, subprocess.Popen(command, stdout=logs[0], stderr=logs[1], text=True, env=env,
                                                         cwd=ROOT)))
        time.sleep(5)
        for item in list(running):
            name, seed, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            out = (workdir / f"{name}-{seed}.out").read_text()
            err = (workdir / f"{name}-{seed}.err").read_text()
            if proc.returncode != 0:
                raise RuntimeError(f"setting {name} seed {seed} failed: {err.strip().splitlines()[-1:]}")
            path = workdir / f"{name}-{seed}.h5"
            summary = json.loads(out.strip().splitlines()[-1])
            with h5py.File(path) as f:
                curves = {k: f["curves"][k][()] for k in f["curves"]}
            episode = curves["eval_episode"]
            points = np.array([i for i in range(len(episode)) if i == 0 or episode[i] != episode[i - 1]])
            seconds = curves["seconds"][points]
            ladder = popplay("evaluate", str(path), "--ladder", "--games", "200", "--json", env=env)
            ladder_final = json.loads(ladder.stdout.strip().splitlines()[-1])
            best = int(ladder_final["best_agent"])
            versus = versus_search(path, args.final_games, env)
            # the same agents choosing by minimax over their V two plies deep (docs/knights.md)
            versus2 = versus_search(path, args.final_games, env, "--lookahead", "2")
            report["runs"][f"{name}-{seed}"] = {
                "setting": name, "seed": seed, "episodes": summary["phases"],
                "learning_seconds": summary["seconds"],
                "curve": {"seconds": seconds.tolist(), "episode": episode[points].tolist(),
                          **{f"ladder_elo_{s}": curves[f"ladder_elo_{s}"][points].tolist()
                             for s in ("best", "mean", "worst")}},
                "slope_mean_last_third": slope(seconds, curves["ladder_elo_mean"][points]),
                "final_ladder": {k: ladder_final[k] for k in ("elo_best", "elo_mean", "elo_worst")},
                "best_ladder_agent": best,
                "best_ladder_agent_ci95": ladder_final["per_agent"][best]["elo_ci95"],
                "versus_search": {"games": versus["games"], "best": versus["best"], "best_agent": versus["best_agent"],
                                  "best_ci95": versus["best_ci95"], "mean": versus["mean"]},
                "versus_search_two_plies": {"best": versus2["best"], "best_agent": versus2["best_agent"],
                                            "best_ci95": versus2["best_ci95"], "mean": versus2["mean"],
                                            "worst": versus2["worst"]},
            }
            if args.confirm_games:
                report["runs"][f"{name}-{seed}"]["versus_search_confirmed"] = confirm_best(
                    path, versus, args.confirm_games, env)
            print(f"{name}-{seed}: {report['runs'][f'{name}-{seed}']['final_ladder']}, vs search best "
                  f"{versus['best']:.3f} {versus['best_ci95']}", file=sys.stderr, flush=True)
    return report


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = {"a": "tab:grey", "b": "tab:blue", "c": "tab:orange", "d": "tab:green"}
    for key, run in report["runs"].items():
        c = run["curve"]
        minutes = np.array(c["seconds"]) / 60.0
        colour = colours.get(run["setting"], "black")
        ax.plot(minutes, c["ladder_elo_mean"], color=colour, label=f"{run['setting']} mean" if run["seed"] ==
                min(r["seed"] for r in report["runs"].values()) else None)
        ax.fill_between(minutes, c["ladder_elo_worst"], c["ladder_elo_best"], color=colour, alpha=0.15)
    ax.set_xlabel("learning time (minutes)")
    ax.set_ylabel("ladder Elo (random = 0)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def eval_schedule(text: str, settings: list[str]) -> dict[str, int]:
    """``--eval-every``'s episodes per setting: ``"100"``, or ``"100,d=20"``."""
    default, chosen = 100, {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, _, value = item.rpartition("=")
        if name:
            chosen[name.strip()] = int(value)
        else:
            default = int(value)
    return {name: chosen.get(name, default) for name in settings}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1800.0)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--settings", default="a,b,c,d")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=20000,
                        help="the episode budget (the time budget ends the runs first; it bounds the snapshots kept)")
    parser.add_argument("--eval-every", default="100",
                        help="episodes between ladder evaluations: N for every setting, with NAME=N overrides "
                             "(\"100,d=20\": setting d plays ~35x fewer episodes per minute than c, and a slope over "
                             "the last third needs points there)")
    parser.add_argument("--eval-every-seconds", type=float, default=90.0,
                        help="also evaluate after this much learning time since the last (0: by episodes only)")
    parser.add_argument("--eval-games", type=int, default=20)
    parser.add_argument("--final-games", type=int, default=1000)
    parser.add_argument("--confirm-games", type=int, default=4000,
                        help="held-out games of the best agent against the search, on another seed (0: none)")
    parser.add_argument("--confirm-runs", default="",
                        help="only confirm: finished run files (comma-separated), no study")
    parser.add_argument("--out", default=None, help="the report (default results/knights_ladder.json, or "
                                                    "results/knights_ladder_confirm.json with --confirm-runs)")
    args = parser.parse_args(argv)
    args.out = args.out or str(HERE / "results" / ("knights_ladder_confirm.json" if args.confirm_runs
                                                   else "knights_ladder.json"))
    if args.confirm_runs:
        args.confirm_runs = [p.strip() for p in args.confirm_runs.split(",") if p.strip()]
        report = confirm_runs(args)
    else:
        args.seeds = [int(s) for s in args.seeds.split(",")]
        args.settings = [s.strip() for s in args.settings.split(",")]
        args.eval_every = eval_schedule(args.eval_every, args.settings)
        report = run_study(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    if args.confirm_runs:
        return
    try:
        plot(report, Path(args.out).with_suffix(".png"))
    except ImportError:
        pass
    for key, run in report["runs"].items():
        s = run["slope_mean_last_third"]
        print(f"{key}: {run['episodes']} episodes; final ladder Elo best {run['final_ladder']['elo_best']:.0f} "
              f"mean {run['final_ladder']['elo_mean']:.0f}; slope of the mean over the last third "
              f"{s['elo_per_minute']} Elo/min {s['ci95']}; best vs search {run['versus_search']['best']:.3f} "
              f"{run['versus_search']['best_ci95']}")


if __name__ == "__main__":
    main()

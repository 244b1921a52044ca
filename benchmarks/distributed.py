"""Sharded populations on this machine: strong scaling, communication, a projection.

    python benchmarks/distributed.py                 # the issue's sizes, short budgets
    python benchmarks/distributed.py --quick         # tiny sizes (a smoke test)
    python benchmarks/distributed.py --json out.json
    python benchmarks/distributed.py --memory        # cart-pole memory per rank, projected to Bell's size

For each domain the same job runs three ways through the real CLI (``popplay train
... --json``, a process per rank): 1 rank x 1 numba thread, 2 ranks x 1 thread each
(``--nproc 2``), and 1 rank x 2 threads. Time is the learning time rank 0 reports
(phases only: learning, the collectives and sharing; not start-up or JIT). Parallel
efficiency of 2 ranks = T(1 rank x 1) / (2 x T(2 ranks x 1)).

Communication: rank 0's payload bytes and seconds inside collectives (the summary's
``comm_bytes`` / ``comm_seconds``) per phase (a share for bandit and cart-pole, an
episode for knights). The projection models a phase on N ranks as

    compute(N) = compute(1) / N
    comm(N)    = (N - 1) x (latency + block(N) / bandwidth),  block(N) = 2 x block(2) / N

(an all_gather where every rank receives the other N - 1 ranks' blocks; gloo and NCCL
rings move the same bytes) with an assumed bandwidth and latency per network, and reports where
communication overtakes compute, and the share interval k (phases of k x the
current ``share_every``) that keeps communication under compute there.

The machine's ceiling: the same 1-rank x 1-thread job twice at once, independent
processes sharing nothing but the machine. T(alone) / T(two at once) bounds the
efficiency any 2-way split (ranks or threads) can reach on it: two "cores" that slow
each other down (shared caches, memory bandwidth, or hardware threads of one physical
core in a virtual machine) cap it below 1 whatever the code does.

Memory (``--memory``): the peak RSS of the largest process of cart-pole jobs of 8192
agents in the trial layout, run to the end (the save included), at 16 and 32 trials
per rank and 32 and 64 trials in all. A rank's peak is modelled as
a + b x (agent-trials it holds) + c x (agent-trials of the whole population: the
bookkeeping every rank keeps), fitted to those three points and projected to Bell's
8192 agents x 1024 trials on 16, 32 and 64 ranks (one per machine).

Numbers depend on the machine's load: on a shared 2-core machine they are indicative.
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

SIZES = {
    "bandit": ["train", "bandit", "--agents", "8192", "--arms", "100", "--trials", "1", "--agent-steps",
               str(8192 * 256), "--share-every", "16"],
    # The same population in 16 trials (Bell's runs have 1024): 2 or 4 ranks take whole
    # trials (no share travels). With 4 trials the ranks' sync per phase weighs more
    # (docs/distributed.md).
    "bandit-trials": ["train", "bandit", "--agents", "8192", "--arms", "100", "--trials", "16", "--agent-steps",
                      str(8192 * 256), "--share-every", "16"],
    "cartpole": ["train", "cartpole", "--agents", "4096", "--trials", "1", "--agent-steps", str(4096 * 2000),
                 "--share-every", "50", "--test-steps", "100", "--test-starts", "2"],
    # Cart-pole's population in 16 trials: the ranks take whole trials, only the shared
    # tables travel (3.6 MB per phase gathered in the agent layout above).
    "cartpole-trials": ["train", "cartpole", "--agents", "4096", "--trials", "16", "--agent-steps",
                        str(4096 * 400), "--share-every", "50", "--test-steps", "100", "--test-starts", "2"],
    "knights": ["train", "knights", "--agents", "64", "--games-per-agent", "64", "--episodes", "3",
                "--eval-every", "1000", "--eval-games", "2", "--backend", "numba"],
}
QUICK = {
    "bandit": ["train", "bandit", "--agents", "256", "--arms", "100", "--trials", "1", "--agent-steps",
               str(256 * 32), "--share-every", "16"],
    "bandit-trials": ["train", "bandit", "--agents", "256", "--arms", "100", "--trials", "4", "--agent-steps",
                      str(256 * 32), "--share-every", "16"],
    "cartpole": ["train", "cartpole", "--agents", "256", "--trials", "1", "--agent-steps", str(256 * 200),
                 "--share-every", "50", "--test-steps", "50", "--test-starts", "2"],
    "cartpole-trials": ["train", "cartpole", "--agents", "256", "--trials", "4", "--agent-steps", str(256 * 100),
                        "--share-every", "50", "--test-steps", "50", "--test-starts", "2"],
    "knights": ["train", "knights", "--agents", "8", "--games-per-agent", "8", "--episodes", "2",
                "--eval-every", "1000", "--eval-games", "2", "--backend", "numba"],
}
WAYS = (("1 rank x 1 thread", 1, 1), ("2 ranks x 1 thread", 2, 1), ("1 rank x 2 threads", 1, 2))
# (bytes/s, latency per message in s): assumed TCP over 10 GbE and an RDMA-class 100 Gb/s fabric.
NETWORKS = {"10 Gb/s": (10e9 / 8, 50e-6), "100 Gb/s": (100e9 / 8, 10e-6)}


def run(args: list[str], nproc: int, threads: int, out: Path) -> dict:
    return run_together([(args, nproc, threads, out)])[0]


def run_together(jobs: list[tuple[list[str], int, int, Path]]) -> list[dict]:
    """Start every job at once and wait for all: their ``--json`` summaries."""
    started = []
    for args, nproc, threads, out in jobs:
        env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        command = [sys.executable, "-m", "popplay", *args, "--out", str(out), "--overwrite", "--json",
                   "--nproc", str(nproc)]
        started.append((command, subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True)))
    summaries = []
    try:
        for command, process in started:
            out, err = process.communicate(timeout=1800)
            if process.returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed: {err.strip()[-500:]}")
            summaries.append(json.loads(out.strip().splitlines()[-1]))
    finally:  # a failed or hung job must not leave the others running
        for _, process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return summaries


MEMORY_AGENTS = 8192
# (ranks, trials in all): 16 per rank twice (the whole population doubling), then 32 per rank.
MEMORY_RUNS = ((2, 32), (4, 64), (2, 64))


def peak_rss(args: list[str], nproc: int, out: Path) -> tuple[float, dict]:
    """(peak RSS in bytes of the largest process, summary) of one job, in a fresh
    process whose waited-for descendants (the launcher's ranks) are all it counts."""
    code = ("import json, resource, subprocess, sys\n"
            "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "if done.returncode: sys.exit(done.stderr[-500:])\n"
            "print(json.dumps([resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, "
            "json.loads(done.stdout.strip().splitlines()[-1])]))\n")
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-c", code, sys.executable, "-m", "popplay", *args, "--out", str(out), "--overwrite",
               "--json", "--nproc", str(nproc)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} --nproc {nproc} failed: {done.stderr.strip()[-500:]}")
    peak, summary = json.loads(done.stdout.strip().splitlines()[-1])
    return float(peak), summary


def memory(tmp: Path, quick: bool) -> dict:
    """Cart-pole's peak memory per rank in the trial layout, fitted and projected."""
    sys.path.insert(0, str(ROOT))
    from popplay.games.cartpole.rules import CartPolePopulationParams
    from popplay.core.limits import format_bytes
    from popplay.games.cartpole import memory_bytes

    agents = 256 if quick else MEMORY_AGENTS
    points = []
    for ranks, trials in MEMORY_RUNS:
        args = ["train", "cartpole", "--agents", str(agents), "--trials", str(trials), "--agent-steps",
                str(agents * 100), "--share-every", "50", "--test-steps", "50", "--test-starts", "2"]
        peak, summary = peak_rss(args, ranks, tmp / f"memory-{ranks}-{trials}.h5")
        held, whole = trials // ranks * agents, trials * agents
        points.append({"ranks": ranks, "trials": trials, "agent_trials_per_rank": held, "peak_rss_bytes": peak,
                       "learning_seconds": summary["seconds"], "quality": summary["quality"]})
        print(f"memory    {agents} agents x {trials} trials on {ranks} ranks ({trials // ranks} trials each): "
              f"peak {format_bytes(peak)} in the largest process", flush=True)
    (p1, p2, p3) = (point["peak_rss_bytes"] for point in points)
    per_whole = (p2 - p1) / (agents * (MEMORY_RUNS[1][1] - MEMORY_RUNS[0][1]))
    per_held = (p3 - p1 - per_whole * agents * (MEMORY_RUNS[2][1] - MEMORY_RUNS[0][1])) / (
        agents * (MEMORY_RUNS[2][1] // MEMORY_RUNS[2][0] - MEMORY_RUNS[0][1] // MEMORY_RUNS[0][0]))
    base = p1 - per_held * agents * (MEMORY_RUNS[0][1] // MEMORY_RUNS[0][0]) - per_whole * agents * MEMORY_RUNS[0][1]
    print(f"memory    model: {format_bytes(base)} + {per_held:.0f} B per agent-trial held + {per_whole:.0f} B per "
          "agent-trial of the population", flush=True)
    bell = CartPolePopulationParams(agents=8192, trials=1024)
    projection = {}
    for ranks in (16, 32, 64):
        peak = base + per_held * 8192 * (1024 // ranks) + per_whole * 8192 * 1024
        projection[ranks] = {"projected_peak_bytes": peak, "estimate_bytes": memory_bytes(bell, ranks, 1)}
        print(f"memory    Bell's 8192 x 1024 on {ranks} ranks: {format_bytes(peak)} per rank projected "
              f"(popplay's own estimate {format_bytes(projection[ranks]['estimate_bytes'])}; "
              f"one process would need {format_bytes(memory_bytes(bell))})", flush=True)
    return {"points": points, "bytes_fixed": base, "bytes_per_agent_trial_held": per_held,
            "bytes_per_agent_trial_of_population": per_whole, "bell_projection": projection}


def project(compute_1: float, phases: int, rank_bytes: float) -> dict:
    """Seconds per phase at 8, 64, 512 ranks on each network (see the module docstring).

    Measured collective time on this machine includes waiting for the slower rank, so
    it is reported, not fitted: the model takes the bytes measured and each network's
    assumed bandwidth and latency."""
    per_phase_compute = compute_1 / phases
    rows = {}
    for name, (bandwidth, latency) in NETWORKS.items():
        for n in (8, 64, 512):
            compute = per_phase_compute / n
            block = 2 * rank_bytes / n  # measured with 2 ranks: a rank's block shrinks as 1/N
            comm = (n - 1) * (latency + block / bandwidth)
            rows[f"{n} ranks, {name}"] = {"compute_ms": compute * 1e3, "comm_ms": comm * 1e3,
                                          "comm_over_compute": comm / compute if compute else float("inf"),
                                          "share_every_factor": max(1, int(-(-comm // compute))) if compute else None}
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--only", default="bandit,bandit-trials,cartpole,cartpole-trials,knights")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--check-model", action="store_true",
                        help="also run 4 ranks (oversubscribed: bytes only) and compare the bytes a rank "
                             "sends per phase with the model's 2 x block(2) / 4")
    parser.add_argument("--memory", action="store_true",
                        help="only the cart-pole memory per rank (trial layout), projected to Bell's size")
    options = parser.parse_args()
    sizes = QUICK if options.quick else SIZES
    report: dict = {"machine": {"cores": os.cpu_count(), "load": os.getloadavg()}, "domains": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if options.memory:
            report["memory"] = memory(Path(tmp), options.quick)
        for domain in options.only.split(",") if not options.memory else ():
            rows = {}
            for label, nproc, threads in WAYS:
                summary = run(sizes[domain], nproc, threads, Path(tmp) / f"{domain}-{nproc}-{threads}.h5")
                rows[label] = summary
                print(f"{domain:9s} {label:20s} {summary['seconds']:8.3f} s learning, "
                      f"{summary['phases']} phases" + (f", {summary['comm_bytes'] / summary['phases'] / 1e6:.3f} MB "
                                                      f"and {summary['comm_seconds'] / summary['phases'] * 1e3:.2f} ms "
                                                      "in collectives per phase" if nproc > 1 else ""), flush=True)
            # The machine's own ceiling: two independent one-thread jobs at once, nothing
            # shared between them. Their slowdown bounds what any 2-way split can reach.
            pair = run_together([(sizes[domain], 1, 1, Path(tmp) / f"{domain}-alone-{k}.h5") for k in (0, 1)])
            together = max(summary["seconds"] for summary in pair)
            print(f"{domain:9s} {'2 jobs at once':20s} {together:8.3f} s learning (the slower of the two)", flush=True)
            one, two, threads2 = (rows[label]["seconds"] for label, _, _ in WAYS)
            sharded = rows[WAYS[1][0]]
            phases = sharded["phases"]
            rank_bytes = sharded["comm_bytes"] / phases
            entry = {
                "runs": {k: {f: v[f] for f in ("seconds", "phases", "world_size", "comm_bytes", "comm_seconds",
                                                "comm_calls") if f in v} for k, v in rows.items()},
                "efficiency_2_ranks": one / (2 * two), "efficiency_2_threads": one / (2 * threads2),
                "two_jobs_at_once_seconds": together, "ceiling_2_ways": one / together,
                "bytes_per_phase": rank_bytes, "comm_ms_per_phase": sharded["comm_seconds"] / phases * 1e3,
                "projection": project(one, phases, rank_bytes),
            }
            if options.check_model:
                four = run(sizes[domain], 4, 1, Path(tmp) / f"{domain}-4-1.h5")
                measured = four["comm_bytes"] / four["phases"]
                entry["model_check_4_ranks"] = {"predicted_bytes_per_phase": rank_bytes / 2,
                                                "measured_bytes_per_phase": measured}
                print(f"{domain:9s} 4 ranks: {measured / 1e6:.4f} MB per phase sent by rank 0, model "
                      f"{rank_bytes / 2e6:.4f} MB", flush=True)
            report["domains"][domain] = entry
            print(f"{domain:9s} parallel efficiency: 2 ranks {entry['efficiency_2_ranks']:.2f}, "
                  f"2 threads {entry['efficiency_2_threads']:.2f}; ceiling of this machine "
                  f"(1 job alone / 2 jobs at once) {entry['ceiling_2_ways']:.2f}")
            for name, row in entry["projection"]["rows"].items():
                print(f"{domain:9s}   {name:20s} compute {row['compute_ms']:9.3f} ms  comm {row['comm_ms']:9.3f} ms"
                      f"  -> share every {row['share_every_factor']}x")
    if options.json:
        options.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

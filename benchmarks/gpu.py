"""The GPU table in one command (not a test).

    python benchmarks/gpu.py [--compile] [--markdown FILE] [--json FILE]
    python benchmarks/gpu.py --device cpu --quick      # the same rows on torch's CPU (a smoke run)

On CUDA (``torch.cuda.is_available()``): bandit and cart-pole at 8192 agents x 1024
trials, knights with 262,144 games per episode (``benchmarks/run.py``'s gpu section,
halving a size that runs out of memory), a DQN population of 1024 members on
CartPole-v1, each with ``torch.cuda.max_memory_allocated``; the host waits of one
phase of each engine at those sizes (:class:`popplay.core.syncs.SyncCounter`); and
the numba engine on the host's CPU at the CPU table's sizes, side by side. Writes
Markdown for docs/performance.md. Without a GPU it says so in one line and exits 0.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import run as bench_run  # noqa: E402  (benchmarks/run.py: the shared rows and tables)

from popplay.core.backend import Backend  # noqa: E402
from popplay.core.syncs import SyncCounter  # noqa: E402
from popplay.distributed.group import Dist  # noqa: E402

DQN_MEMBERS = 1024
DQN_STEPS_PER_MEMBER = 600


def phase_syncs(backend: Backend, sizes: bench_run.Sizes,
                domains: tuple[str, ...] = ("bandit", "cartpole", "knights")) -> list[dict[str, Any]]:
    """Host waits and tensor operations in one phase of each engine (after one phase)."""
    from popplay.games.bandit.experiment import BanditExperiment
    from popplay.games.bandit.rules import BanditParams
    from popplay.games.cartpole.experiment import CartPoleExperiment
    from popplay.games.cartpole.rules import CartPolePopulationParams
    from popplay.games.knights.experiment import KnightsExperiment
    from popplay.games.knights.rules import KnightsParams

    agents, trials, arms = sizes.gpu_bandit[0]
    cp_agents, cp_trials = sizes.gpu_cartpole
    kn_agents, kn_games = sizes.gpu_knights[0]
    cases = [
        ("bandit", f"{agents}x{trials}x{arms}", BanditExperiment,
         BanditParams(arms=arms, agents=agents, trials=trials, share_every=16, steps_per_agent=64)),
        ("cartpole", f"{cp_agents}x{cp_trials}", CartPoleExperiment,
         CartPolePopulationParams(agents=cp_agents, trials=cp_trials, share_every=64, steps_per_agent=256)),
        ("knights", f"{kn_agents}x{kn_games} games", KnightsExperiment,
         KnightsParams(agents=kn_agents, games_per_agent=kn_games, episodes=3)),
    ]
    rows = []
    for domain, size, experiment_type, params in (case for case in cases if case[0] in domains):
        experiment = experiment_type(params, backend, dist=Dist())
        state = experiment.phase(experiment.initial_state(), time_left=None)
        with SyncCounter() as counter:
            experiment.phase(state, time_left=None)
        rows.append({"domain": domain, "size": size, "syncs": counter.syncs, "ops": counter.ops,
                     "by_name": dict(counter.by_name)})
    return rows


def dqn_population(device: str, members: int, steps: int) -> dict[str, Any]:
    """env-steps/s of ``train dqn --agents members`` on ``device`` and its peak memory."""
    import torch

    import popplay

    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    outcome = popplay.train("dqn", device=device, agents=members, env_steps=members * steps, phase_steps=200,
                            hidden=(64, 64), batch_size=64, replay_capacity=5000, learning_starts=200,
                            eval_episodes=0)
    seconds = time.perf_counter() - start
    row = {"members": members, "env_steps": members * steps, "seconds": seconds,
           "env_steps_per_second": members * steps / seconds, "complete": outcome.summary.get("complete")}
    if device == "cuda":
        row["gpu_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return row


def numba_side_by_side(bench: bench_run.Bench) -> None:
    """The numba engine on the host's CPU at the CPU table's sizes for the same agents."""
    numba = Backend("numba", "cpu")
    s = bench.sizes
    for agents, _, arms in s.gpu_bandit:
        trials = max(1, s.bandit_population // agents)
        timing, _ = bench.bandit_popplay(numba, agents, arms, trials, s.gpu_bandit_steps)
        bench.add("gpu", "bandit", numba, timing, agents=agents, trials=trials, arms=arms,
                  notes="numba on the host CPU, CPU-table size")
    agents = max(s.cartpole_agents)
    timing, _ = bench.cartpole_popplay(numba, agents, 1, s.gpu_cartpole_steps)
    bench.add("gpu", "cartpole", numba, timing, agents=agents, trials=1, notes="numba on the host CPU")


def markdown(report: dict[str, Any]) -> str:
    lines = [f"GPU table ({report['device']}, compile={report['compile']}), {report['when']}", ""]
    lines += bench_run.table(report["rows"], markdown=True)
    lines += ["", "| engine | size | host waits per phase | tensor ops per phase |", "|---|---|---:|---:|"]
    lines += [f"| {r['domain']} | {r['size']} | {r['syncs']} | {r['ops']:,} |" for r in report["syncs"]]
    dqn = report.get("dqn_population")
    if dqn:
        memory = f", {dqn['gpu_memory_mib']:.0f} MiB" if "gpu_memory_mib" in dqn else ""
        lines += ["", f"DQN population, {dqn['members']} members: {dqn['env_steps_per_second']:,.0f} env-steps/s "
                      f"({dqn['env_steps']:,} env-steps in {dqn['seconds']:.1f} s{memory})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: the same rows on torch's CPU (smoke runs)")
    parser.add_argument("--compile", action="store_true", help="the torch engines' steps through torch.compile")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--domains", default="bandit,cartpole,knights",
                        help="the engines to measure, comma-separated")
    parser.add_argument("--skip-dqn", action="store_true", help="leave out the DQN population row")
    parser.add_argument("--skip-numba", action="store_true", help="leave out the numba rows on the host CPU")
    parser.add_argument("--markdown", help="write the tables as Markdown here")
    parser.add_argument("--json", help="write the report as JSON here")
    args = parser.parse_args(argv)
    domains = tuple(args.domains.split(","))
    unknown = sorted(set(domains) - {"bandit", "cartpole", "knights"})
    if unknown:
        print(f"benchmarks/gpu.py: --domains: unknown engine {unknown[0]!r} (bandit, cartpole, knights)",
              file=sys.stderr)
        return 2
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA GPU on this machine; nothing measured")
        return 0
    sizes = bench_run.QUICK if args.quick else bench_run.Sizes()
    started = time.perf_counter()
    bench = bench_run.Bench(sizes, lambda text: print(f"[{time.perf_counter() - started:5.0f} s] {text}",
                                                      file=sys.stderr, flush=True))
    bench.gpu(device=args.device, compile=args.compile, domains=domains)
    if not args.skip_numba:
        numba_side_by_side(bench)
    report = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "compile": args.compile,
              "when": time.strftime("%Y-%m-%d"), "rows": bench.rows, "notes": bench.notes,
              # counted uncompiled, also for a compiled table: the host waits are the phase's own
              # either way, but a dispatch mode sees no operations inside a compiled graph (and
              # torch 2.13 refuses to compile under one), so "tensor ops" are the eager path's
              "syncs": phase_syncs(Backend("torch", args.device, False), sizes, domains),
              "dqn_population": None if args.skip_dqn else dqn_population(
                  args.device, 8 if args.quick else DQN_MEMBERS, 50 if args.quick else DQN_STEPS_PER_MEMBER)}
    text = markdown(report)
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

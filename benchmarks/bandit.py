"""Bandit throughput and quality, measured in one run on this machine.

    python benchmarks/bandit.py            # throughput table (+ JSON in benchmarks/results/)
    python benchmarks/bandit.py --quality  # also Bell's Figure 2 curve at full size
    python benchmarks/bandit.py --memory   # also peak RSS of 1000 arms x 8192 agents x 64 trials

Peers: a straightforward NumPy population (vectorised over agents, sharing with
equations (1)-(4)) and the report's single-agent CPU figure (131,072 steps in 37.7 ms).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from popplay.core.backend import Backend, cuda_available
from popplay.games.bandit.experiment import BanditExperiment
from popplay.games.bandit.rules import BanditParams

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Timing, machine_info, time_loop, time_phases  # noqa: E402

REPORT_SINGLE_AGENT_STEPS_PER_SECOND = 131072 / 0.0377


def numpy_population(agents: int, arms: int, epsilon: float = 0.1, steps: int = 64, share_every: int = 16,
                     seed: int = 0, *, trials: int = 1, repeats: int = 1, budget: float | None = None) -> Timing:
    """A straightforward NumPy population: ``trials`` independent bandits, each with
    ``agents`` ε-greedy agents (vectorised over all of them, first-index argmax) that
    merge their tables with equations (1)-(4) every ``share_every`` steps.

    Timed like :func:`popplay_timing`: rounds of ``steps`` per agent, each from empty
    tables (one untimed sharing period first); the best round."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(trials, arms))
    q = np.zeros((trials * agents, arms))
    n = np.zeros((trials * agents, arms))
    rows = np.arange(trials * agents)
    trial_of = rows // agents

    def period() -> int:
        for _ in range(share_every):
            explore = rng.random(rows.size) < epsilon
            arm = np.where(explore, rng.integers(0, arms, rows.size), q.argmax(axis=1))
            reward = means[trial_of, arm] + rng.normal(size=rows.size)
            n[rows, arm] += 1
            q[rows, arm] += (reward - q[rows, arm]) / n[rows, arm]
        qs, ns = q.reshape(trials, agents, arms), n.reshape(trials, agents, arms)
        n_total = ns.sum(axis=1)
        q_total = np.where(n_total > 0, (ns * qs).sum(axis=1) / np.maximum(n_total, 1), qs.mean(axis=1))
        qs[:] = q_total[:, None, :]
        ns[:] = (n_total / agents)[:, None, :]
        return trials * agents * share_every

    def empty() -> None:
        q[:] = 0.0
        n[:] = 0.0

    return time_loop(period, calls=max(1, steps // share_every), repeats=repeats, budget=budget,
                     before_round=empty)


def popplay_timing(agents: int, arms: int, trials: int, share_every: int, backend: Backend, *, steps: int,
                   epsilon: float = 0.1, repeats: int = 3, budget: float | None = None) -> Timing:
    """Agent-steps per second of learning (sharing included): the best of ``repeats``
    whole runs of ``steps`` per agent, each from the start (as ``popplay train``
    times them), or of as many as fit in ``budget`` seconds; compilation and one
    phase (first touch of the buffers) before the first run are not timed. Compiled,
    a whole untimed run comes first: later phases build steps of their own (the
    greedy cache's scans), which the first phase never reaches."""
    params = BanditParams(arms=arms, agents=agents, trials=trials, steps_per_agent=steps,
                          share_every=share_every, epsilon=epsilon)
    phases = max(1, steps // share_every)
    return time_phases(BanditExperiment(params, backend), phases=phases, repeats=repeats, budget=budget, fresh=True,
                       warm_phases=phases if backend.compile else 1)


def popplay_rate(agents: int, arms: int, trials: int, steps: int, share_every: int, backend: Backend,
                 epsilon: float = 0.1, repeats: int = 3) -> float:
    """Best of ``repeats`` runs: agent-steps per second of learning (sharing included)."""
    return popplay_timing(agents, arms, trials, share_every, backend, steps=steps, epsilon=epsilon,
                          repeats=repeats).rate


def single_agent(backend: Backend, repeats: int = 7, budget: float | None = None) -> Timing:
    """Bell's single-agent CPU setting: 1 agent, 100 arms, whole runs of 131,072 steps
    (compare with REPORT_SINGLE_AGENT_STEPS_PER_SECOND)."""
    return popplay_timing(1, 100, 1, 131072, backend, steps=131072, repeats=repeats, budget=budget)


def throughput(table: list[dict]) -> None:
    cpu = Backend("numba", "cpu")
    numpy_rate = numpy_population(8192, 100, 0.1, steps=64, share_every=16).rate
    ours = popplay_rate(8192, 100, trials=4, steps=256, share_every=16, backend=cpu)
    table.append({"case": "100 arms, 8192 agents, eps 0.1, share every 16", "numpy": numpy_rate,
                  "popplay numba": ours, "ratio": ours / numpy_rate, "goal ratio": 5.0})
    single = single_agent(cpu).rate
    table.append({"case": "1 agent, 100 arms, 131,072 steps", "report CPU": REPORT_SINGLE_AGENT_STEPS_PER_SECOND,
                  "popplay numba": single, "ratio": single / REPORT_SINGLE_AGENT_STEPS_PER_SECOND, "goal ratio": 3.0})
    for agents in (1, 256, 8192):
        for arms in (10, 100, 1000):
            trials = max(1, 8192 // agents)
            steps = max(64, 131072 // agents // 4)
            rate = popplay_rate(agents, arms, trials, steps, min(16, steps), cpu, repeats=2)
            row = {"case": f"{arms} arms, {agents} agents x {trials} trials", "popplay numba": rate}
            if agents == 8192:
                row["numpy"] = numpy_population(agents, arms, 0.1, steps=32, share_every=16).rate
                row["ratio"] = rate / row["numpy"]
            table.append(row)
    torch_cpu = popplay_rate(256, 100, trials=16, steps=64, share_every=16, backend=Backend("torch", "cpu"), repeats=1)
    table.append({"case": "100 arms, 256 agents x 16 trials, torch CPU", "popplay torch": torch_cpu})
    if cuda_available():
        gpu = popplay_rate(8192, 100, trials=1024, steps=64, share_every=16, backend=Backend("torch", "cuda"),
                           repeats=2)
        table.append({"case": "100 arms, 8192 agents x 1024 trials, torch CUDA", "popplay torch": gpu,
                      "goal": 1e9})


def quality_curve(table: list[dict]) -> dict:
    """Figure 2 at full size (131,072 agent-time steps, 1024 trials): the curves of
    ``popplay reproduce figure2 --scale paper``, computed by the same code."""
    from popplay.reproduce.bandit import compute_figure2
    from popplay.reproduce.driver import Session

    data = compute_figure2(Session("paper", 0, Backend("numba", "cpu")))
    curves = {}
    for group in data.groups.values():
        agents, arrays = int(group.attrs["agents"]), group.arrays
        curves[agents] = {"agent_steps": arrays["agent_steps"].tolist(), "quality": arrays["quality"].tolist(),
                          "seconds": arrays["seconds_batch"].tolist()}
        table.append({"case": f"quality, {agents} agents (share every {group.attrs['share_every']})",
                      "quality": float(arrays["quality"][-1]), "seconds": float(arrays["seconds_batch"][-1])})
    return curves


def peak_memory() -> dict:
    """Peak RSS of the largest configuration, in a fresh process."""
    code = (
        "import resource, time\n"
        "from popplay.games.bandit.rules import BanditParams\n"
        "from popplay.games.bandit.experiment import BanditExperiment\n"
        "from popplay.core.backend import Backend\n"
        "from popplay.training.loop import run\n"
        "p = BanditParams(arms=1000, agents=8192, trials=64, steps_per_agent={steps}, share_every=16)\n"
        "r = run(BanditExperiment(p, Backend('numba', 'cpu')))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, r.learning_seconds)\n"
    )
    out = {}
    for steps in (32, 128):
        proc = subprocess.run([sys.executable, "-c", code.format(steps=steps)], capture_output=True, text=True,
                              check=True)
        rss_kib, seconds = proc.stdout.split()
        out[steps] = {"peak_rss_mib": int(rss_kib) / 1024, "learning_seconds": float(seconds)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quality", action="store_true")
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()
    table: list[dict] = []
    report: dict = {"machine": machine_info()}
    throughput(table)
    if args.quality:
        report["figure2"] = quality_curve(table)
    if args.memory:
        report["memory"] = peak_memory()
        for steps, row in report["memory"].items():
            table.append({"case": f"1000 arms x 8192 agents x 64 trials, {steps} steps/agent",
                          "peak RSS MiB": row["peak_rss_mib"]})
    report["table"] = table
    for row in table:
        cells = []
        for key, value in row.items():
            if key == "case":
                continue
            if isinstance(value, float) and ("ratio" in key or key in ("quality", "seconds", "peak RSS MiB")):
                cells.append(f"{key} {value:.3g}")
            elif isinstance(value, float):
                cells.append(f"{key} {value / 1e6:.1f}M/s")
        print(f"{row['case']:<55} " + "  ".join(cells))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "bandit.json").write_text(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    main()

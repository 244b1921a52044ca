"""Gorila (Nair et al. 2015) against our single-process Double DQN at equal environment steps.

    PYTHONPATH=. python benchmarks/gorila.py --env CartPole-v1 --env-steps 30000 \
        --layouts 2x1x1,1x1x1 --dqn --fault --json results/gorila.json --plot results/gorila.png
    PYTHONPATH=. python benchmarks/gorila.py --layouts 2x2x1 --replay global   # one memory over 2 learners

For each layout ``AxLxS`` (actors × learners × shards) one run of ``popplay train
gorila``'s engine; with ``--dqn`` one run of ``popplay train dqn`` (sequential, Adam)
at the same budget; with ``--fault`` the first layout again with actor 1 killed
(SIGKILL) once half the budget is played. Each row: wall seconds, env-steps/s, the
greedy quality at the end, the mean return of the last 100 training episodes, the
learning curve (return against env-steps summed over actors), the staleness histogram
and the dropped gradients, and the message counts the parameter server handled,
beside what the message-rate model predicts from the run's own counters:

    requests per shard = Σ_learners updates_sent·(1 + 1/learner_sync)·…   (see model())

One run per row, not a best-of: these are learning runs, and their times on a shared
2-core machine move with whatever else runs. Learning curves of single seeds are noisy;
read them as what they are.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine_info  # noqa: E402
from popplay.deep.topologies.gorila import (  # noqa: E402
    GorilaConfig,
    load_npz,
    spaces,
    train_gorila,
    vector_size,
)


def model(config: GorilaConfig, learner_updates: int, gradients_sent: int, env_steps: int,
          episodes: int) -> dict[str, float]:
    """Messages one shard handles, from the run's counters and the layout alone.

    Each learner update ends in one gradient slice per shard (unless the outlier guard
    drops it) and every ``learner_sync`` updates in one parameter pull per shard; each
    actor pulls once per ``actor_sync`` of its steps, and once more at each episode's
    start when the count is due then (we count pulls at step granularity, so ≈)."""
    learner_pulls = sum(-(-u // config.learner_sync) for u in _split(learner_updates, config.learners))
    actor_pulls = env_steps / config.actor_sync
    return {"gradients_per_shard": float(gradients_sent), "pulls_per_shard": learner_pulls + actor_pulls,
            "bytes_per_gradient_slice": 4.0 * _param_count(config) / config.shards}


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _param_count(config: GorilaConfig) -> int:
    return vector_size(config, spaces(config))


def project(config: GorilaConfig, measured: dict[str, Any], actors: int = 100, learners: int = 100,
            shards: int = 31) -> dict[str, float]:
    """The seed's layout (100 actors, 100 learners, 31 shards) under this run's per-process
    rates: messages per second one shard would handle."""
    seconds = measured["seconds"]
    step_rate = measured["env_steps"] / seconds / config.actors  # per actor
    update_rate = measured["learner_updates"] / seconds / config.learners  # per learner
    grads = learners * update_rate
    pulls = learners * update_rate / config.learner_sync + actors * step_rate / config.actor_sync
    return {"shard_messages_per_second": grads + pulls, "gradient_slices_per_second": grads,
            "pulls_per_second": pulls, "shard_in_bytes_per_second": grads * 4.0 * _param_count(config) / shards}


def run_layout(layout: str, args: argparse.Namespace, workdir: Path, kill_actor_at: int = 0) -> dict[str, Any]:
    actors, learners, shards = (int(v) for v in layout.split("x"))
    tuned = {name: getattr(args, name) for name in ("lr", "update_ratio", "learning_starts") if getattr(args, name)}
    config = GorilaConfig(agent=args.agent, env=args.env, actors=actors, learners=learners, shards=shards,
                          env_steps=args.env_steps, seed=args.seed, eval_episodes=args.eval_episodes, timeout=60.0,
                          replay=args.replay, **tuned)
    out = workdir / f"gorila-{layout}-{args.replay}{'-fault' if kill_actor_at else ''}.h5"
    parts = out.with_name(out.name + ".parts")
    killed: dict[str, Any] = {}

    def should_stop() -> bool:
        if kill_actor_at and not killed:
            steps = 0
            for a in range(actors):
                try:
                    steps += int(load_npz(parts / f"actor-{a}.npz")["env_steps"])
                except (OSError, KeyError, ValueError):
                    pass
            if steps >= kill_actor_at:
                pid = _pid_of("popplay gorila actor 1", str(parts))
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed.update(at_env_steps=steps, pid=pid)
        return False

    started = time.perf_counter()
    summary = train_gorila(config, out, should_stop=should_stop, log=sys.stderr, progress_every=10.0)
    wall = time.perf_counter() - started
    from popplay.checkpoints.validation import load_run

    curves = load_run(out).curves
    row = {"layout": layout if args.replay == "local" else f"{layout} global", "kind": "gorila",
           "wall_seconds": wall, **summary,
           "curve": _thin(curves["agent_steps"], curves["return"]), "killed": killed,
           "model": model(config, summary["learner_updates"], summary["gradients_sent"], summary["env_steps"],
                          summary["episodes"]),
           "measured_per_shard": {"gradients": (summary["gradients_applied"] + summary["stale_discarded"])
                                  / config.shards, "pulls": summary.get("pulls_per_shard")},
           "projection_seed_layout": project(config, summary)}
    return row


def _pid_of(role: str, marker: str) -> int | None:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if role in cmd and marker in cmd:
                return int(proc.name)
    return None


def run_sequential(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The agent's own command in one process (Adam, its own targets), same budget and widths."""
    from popplay.checkpoints.validation import load_run

    out = workdir / f"{args.agent}.h5"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "popplay", "train", args.agent, "--env", args.env, "--env-steps",
                           str(args.env_steps), "--seed", str(args.seed), "--eval-episodes", str(args.eval_episodes),
                           "--hidden", "64,64", "--out", str(out), "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"train {args.agent} failed: {done.stderr.strip()}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    curves = load_run(out).curves
    return {"layout": f"{args.agent} sequential", "kind": "sequential", "wall_seconds": wall, **summary,
            "curve": _thin(curves["agent_steps"], curves["return"]) if "return" in curves else []}


def _thin(steps: np.ndarray, returns: np.ndarray, points: int = 40) -> list[list[float]]:
    """(env-steps, mean return of the last 20 episodes) at about ``points`` places."""
    if len(returns) == 0:
        return []
    idx = np.unique(np.linspace(0, len(returns) - 1, points).astype(int))
    return [[int(steps[i]), float(np.mean(returns[max(0, i - 19):i + 1]))] for i in idx]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", default="dqn", help="dqn, ddpg or td3")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-steps", type=int, default=30_000)
    parser.add_argument("--layouts", default="2x1x1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.0, help="the shards' AdaGrad rate (0: Gorila's default)")
    parser.add_argument("--update-ratio", type=float, default=0.0, help="0: Gorila's default")
    parser.add_argument("--learning-starts", type=int, default=0, help="0: Gorila's default")
    parser.add_argument("--sequential", "--dqn", action="store_true", dest="sequential",
                        help="also the agent's own command in one process at the same budget")
    parser.add_argument("--fault", action="store_true")
    parser.add_argument("--replay", choices=("local", "global"), default="local")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path, help="a PNG of the learning curves (matplotlib)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        layouts = [x for x in args.layouts.split(",") if x]
        for layout in layouts:
            rows.append(run_layout(layout, args, workdir))
            _print(rows[-1])
        if args.fault:
            rows.append(run_layout(layouts[0], args, workdir, kill_actor_at=args.env_steps // 2))
            _print(rows[-1])
        if args.sequential:
            rows.append(run_sequential(args, workdir))
            _print(rows[-1])
    payload = {"machine": machine_info(), "agent": args.agent, "env": args.env, "env_steps": args.env_steps,
               "seed": args.seed, "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1, default=str))
    if args.plot:
        plot(payload, args.plot)


def plot(payload: dict[str, Any], path: Path) -> None:
    """Every row's learning curve (mean return of the last 20 episodes against env-steps
    summed over actors); a killed actor is marked where it died."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in payload["rows"]:
        curve = np.asarray(row["curve"], dtype=float).reshape(-1, 2)
        label = row["layout"] if row["kind"] == "sequential" else f"gorila {row['layout']} (A×L×S)"
        if row.get("killed"):
            label += ", actor 1 killed"
            ax.axvline(row["killed"]["at_env_steps"], color="grey", linestyle=":", linewidth=1)
        ax.plot(curve[:, 0], curve[:, 1], label=label)
    ax.set_xlabel("environment steps (all actors)")
    ax.set_ylabel("training return (mean of last 20 episodes)")
    ax.set_title(f"{payload['env']}, {payload['env_steps']:,} env-steps, seed {payload['seed']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print(row: dict[str, Any]) -> None:
    keys = ("layout", "wall_seconds", "env_steps", "quality", "return", "stale_discarded", "outliers_discarded",
            "staleness_histogram", "lost", "model", "measured_per_shard", "killed", "replay_rows_remote")
    print(json.dumps({k: row.get(k) for k in keys}, default=str), flush=True)


if __name__ == "__main__":
    main()

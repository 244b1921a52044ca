"""The parameter-server draft's figure: REINFORCE's running reward against episodes for 1, 5, 10 and 15
workers of a synchronous parameter server, several seeds each.

The seed trains CartPole with one server and N workers; every update each worker
plays one episode with the broadcast policy and the server sums their gradients. Its
claim is that more workers learn better, with a warning of high variance between runs.
``reinforce_workers`` runs exactly ``popplay train reinforce --topology local
--workers N --episodes U --seed S`` (the same workers one after another in one
process: the same episodes and bit-identical weights as ``--topology server``, tested)
for every worker count and seed, and keeps the running reward (R <- 0.05 reward +
0.95 R per worker, mean over workers) after each update. The x axis is the update
(= each worker's episode number), as in the seed.

Scales: ``tiny`` (1 and 2 workers, 2 seeds, 10 updates: seconds), ``small`` (1, 5, 10,
15 workers, 4 seeds, 100 updates), ``paper`` (1, 5, 10, 15 workers, 8 seeds, 200 updates).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from popplay.reproduce.data import FigureData, Group, round_finite
from popplay.reproduce.registry import Context, Figure, register

ENV = "CartPole-v1"


@dataclass(frozen=True)
class ReinforceScale:
    name: str
    workers: tuple[int, ...]
    seeds: int
    updates: int


SCALES = {
    "tiny": ReinforceScale("tiny", (1, 2), 2, 10),
    "small": ReinforceScale("small", (1, 5, 10, 15), 4, 100),
    "paper": ReinforceScale("paper", (1, 5, 10, 15), 8, 200),
}


def command_for(workers: int, updates: int, seed: int) -> str:
    return (f"popplay train reinforce --env {ENV} --topology local --workers {workers} "
            f"--episodes {updates} --seed {seed}")


def running_curve(workers: int, updates: int, seed: int) -> tuple[np.ndarray, int, float]:
    """The mean running reward after each update, the env-steps and the seconds of one run."""
    from popplay.deep.topologies.reinforce import ReinforceExperiment, ReinforceParams  # defers gymnasium, torch
    params = ReinforceParams(env=ENV, topology="local", workers=workers, episodes=updates, seed=seed,
                             eval_episodes=0)
    experiment = ReinforceExperiment(params, backend=None)
    state = experiment.initial_state()
    started = time.perf_counter()
    while not experiment.finished(state, time_mode=False):
        state = experiment.phase(state, time_left=None)
    seconds = time.perf_counter() - started
    return np.asarray(state.running_curve, dtype=np.float64), int(state.env_steps), seconds


def compute_workers(ctx: Context) -> FigureData:
    from popplay.deep.topologies.reinforce import ReinforceParams  # defers gymnasium, torch

    scale = SCALES[ctx.scale]
    defaults = ReinforceParams()
    data = FigureData(
        "reinforce_workers", "reinforce", scale.name,
        "REINFORCE with a synchronous parameter server: running reward against workers",
        attrs={"env": ENV, "workers": list(scale.workers), "seeds": scale.seeds, "updates": scale.updates,
               "first_seed": ctx.seed, "hidden": list(defaults.hidden), "lr": defaults.lr, "gamma": defaults.gamma,
               "running_reward": "R <- 0.05 reward + 0.95 R per worker (the parameter-server draft), mean over workers",
               "seed_claim": "more workers learn better; high variance between runs"})
    update = np.arange(1, scale.updates + 1, dtype=np.int64)
    for workers in scale.workers:
        curves, steps, seconds = [], 0, 0.0
        for k in range(scale.seeds):
            seed = ctx.seed + k
            ctx.note(f"reinforce_workers: {workers} workers, seed {seed} ({scale.updates} updates)")
            curve, s, t = running_curve(workers, scale.updates, seed)
            curves.append(curve)
            steps += s
            seconds += t
        stack = np.stack(curves)
        arrays = {"update": update, "mean": stack.mean(axis=0), "std": stack.std(axis=0),
                  "min": stack.min(axis=0), "max": stack.max(axis=0)}
        arrays.update({f"seed_{ctx.seed + k}": c for k, c in enumerate(curves)})
        final = stack[:, -1]
        data.groups[f"workers_{workers}"] = Group(arrays=arrays, attrs={
            "label": f"{workers} worker{'s' if workers > 1 else ''}", "workers": workers,
            "final_mean": float(final.mean()), "final_std": float(final.std()),
            "final_min": float(final.min()), "final_max": float(final.max()), "env_steps": steps,
            "learning_seconds": seconds, "command": command_for(workers, scale.updates, ctx.seed) + " (and the next seeds)"})
    return data


def draw_workers(data: FigureData, fig: Any) -> None:
    fig.set_size_inches(12.0, 5.0)
    a = data.attrs
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    for i, group in enumerate(data.groups.values()):
        colour = colours[i % len(colours)]
        x, mean, std = group.arrays["update"], group.arrays["mean"], group.arrays["std"]
        left.fill_between(x, mean - std, mean + std, color=colour, alpha=0.15, linewidth=0)
        left.plot(x, mean, color=colour, linewidth=2.0,
                  label=f"{group.attrs['label']}: {float(group.attrs['final_mean']):.0f} ± "
                        f"{float(group.attrs['final_std']):.0f}")
        for name, values in group.arrays.items():
            if name.startswith("seed_"):
                right.plot(x, values, color=colour, linewidth=0.7, alpha=0.6)
        right.plot([], [], color=colour, label=group.attrs["label"])
    left.set_title(f"mean ± std over {a['seeds']} seeds (final value in the legend)", fontsize=9)
    right.set_title("every seed", fontsize=9)
    for ax in (left, right):
        ax.set_xlabel("update (each worker's episode)")
        ax.set_ylabel("running reward")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Parameter-server draft: REINFORCE on {a['env']}, synchronous parameter server, "
                 f"{a['updates']} updates (scale {data.scale}, seeds {a['first_seed']}..{int(a['first_seed']) + int(a['seeds']) - 1})",
                 fontsize=10)


def summary_workers(data: FigureData) -> dict[str, Any]:
    out: dict[str, Any] = {"updates": int(data.attrs["updates"]), "seeds": int(data.attrs["seeds"])}
    for group in data.groups.values():
        a = group.attrs
        out[f"workers_{int(a['workers'])}"] = {
            "final_mean": _round(a["final_mean"]), "final_std": _round(a["final_std"]),
            "final_min": _round(a["final_min"]), "final_max": _round(a["final_max"]),
            "env_steps": int(a["env_steps"]), "learning_seconds": _round(a["learning_seconds"], 1)}
    return out


def _round(value: Any, digits: int = 2) -> float:
    return round_finite(value, digits)


REINFORCE_WORKERS = register(Figure(
    "reinforce_workers", "reinforce", "Parameter-server draft: REINFORCE running reward for 1, 5, 10 and 15 workers",
    "running reward against update for a synchronous parameter server with 1, 5, 10 and 15 workers on "
    "CartPole-v1, several seeds each (mean, spread and every seed).",
    compute_workers, draw_workers, summary_workers))

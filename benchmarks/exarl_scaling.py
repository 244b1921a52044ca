"""Scaling of EXARL's multi-learner workflow, and a model of it projected to 1024 processes.

    python benchmarks/exarl_scaling.py [--episodes 200] [--layouts 1x1,1x2,2x2,2x4] [--json FILE]

1. **Costs, measured one by one** on this machine (A2C on CartPole-v1, ``--hidden 32``):
   ``t_step`` an actor's environment step with its policy; ``t_learn`` a learner's A2C
   gradient and Adam step on one trajectory, per row; gloo on loopback between two
   processes: ``alpha`` (half a ping-pong of 8 bytes), ``beta`` (bytes/s of a 4 MB
   message) and a 2-rank all-reduce of the round vector.
2. **The models.** On this machine every layout is CPU-bound (2 cores, 2-6 processes):
   ``env-steps/s = (2 - b·(L + A)) / (t_step + t_learn + o / T)`` with ``o`` the CPU of
   one trajectory's messages and bookkeeping (both sides) and ``b`` the share of a core
   each process burns anyway (threads, polling); both fitted on two layouts, checked on
   the others. On a cluster (one core per process) actors and learners run in parallel
   and the slower side wins::

       actors:   A · T / (T·t_step + o/2)
       learners: L · T / (T·t_learn + o/2 + fetch + all-reduce)
       fetch = 4·alpha + 8·(P_policy + T·w) / beta
       all-reduce (n = P + 3 + 2L + A + 1 float64) = 2(L-1)·alpha + 2(L-1)/L · 8n/beta + g

   with ``g`` gloo's own cost per call beyond the ring formula, measured on loopback.
3. **Measured layouts** ``LxA`` through ``popplay train a2c --workflow multi-learner``
   beside the model's prediction for them.
4. **Projection** to 1024 processes (EXARL's largest runs) over a 10 Gb/s network
   (``beta`` 1.25 GB/s, ``alpha`` 25 us: kernel TCP) and a 100 Gb/s one (12.5 GB/s, 2 us:
   RDMA), one core per process; the latencies are assumptions, not measurements.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CORES = 2
NETWORKS = {"10 Gb/s": {"alpha": 25e-6, "beta": 1.25e9}, "100 Gb/s": {"alpha": 2e-6, "beta": 12.5e9}}


def _params(learners: int = 1, actors: int = 1) -> Any:
    from popplay.deep.topologies.exarl import A2CParams

    return A2CParams(env="CartPole-v1", hidden=(32,), seed=0, episodes=1, workflow="multi-learner",
                     learners=learners, actors=actors)


def compute_costs(episodes: int = 60) -> dict[str, float]:
    """``t_step`` and ``t_learn`` (seconds per row) and the sizes ``P`` and ``w``."""
    import torch

    from popplay.deep.agents import networks
    from popplay.deep.topologies import exarl_ranks as X

    torch.set_num_threads(1)
    params = _params()
    actor = X._Actor(params, 0)
    from popplay.deep import envs

    info = envs.describe(actor.env, params.env)
    learner = params.new_learner(info)
    rows_list, started = [], time.perf_counter()
    for _ in range(episodes):
        rows_list.append(actor.play())
    play_seconds = time.perf_counter() - started
    steps = sum(r.shape[0] for r in rows_list)
    started = time.perf_counter()
    for rows in rows_list:
        grad, _ = learner.gradients(X.rows_trajectory(rows, info.obs_dim))
        learner.apply(grad)
    learn_seconds = time.perf_counter() - started
    return {"t_step": play_seconds / steps, "t_learn": learn_seconds / steps, "mean_T": steps / episodes,
            "P": float(networks.parameter_count(learner.networks())), "w": float(X.row_width(info.obs_dim)),
            "policy_P": float(networks.parameter_count(learner.policy))}


def _gloo_worker(rank: int, port: int, n: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    small, big = torch.zeros(1, dtype=torch.float64), torch.zeros(512 * 1024, dtype=torch.float64)  # 8 B, 4 MB
    result: dict[str, float] = {}
    for name, t, reps in (("pingpong_small", small, 2000), ("pingpong_big", big, 20)):
        dist.barrier()
        started = time.perf_counter()
        for _ in range(reps):
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
        result[name] = (time.perf_counter() - started) / reps
    vec = torch.zeros(n, dtype=torch.float64)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(500):
        dist.all_reduce(vec)
    result["allreduce"] = (time.perf_counter() - started) / 500
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def gloo_costs(n: int) -> dict[str, float]:
    """alpha, beta and a 2-rank all-reduce of ``n`` float64, two processes on loopback."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "gloo.json")
        mp.spawn(_gloo_worker, args=(port, n, out), nprocs=2, join=True)
        raw = json.loads(Path(out).read_text())
    alpha = raw["pingpong_small"] / 2
    beta = 4 * 1024 * 1024 / (raw["pingpong_big"] / 2 - alpha)
    return {"alpha": alpha, "beta": beta, "allreduce_2": raw["allreduce"], "allreduce_n": float(n)}


def allreduce_time(learners: int, n: float, alpha: float, beta: float) -> float:
    if learners <= 1:
        return 0.0
    return 2 * (learners - 1) * alpha + 2 * (learners - 1) / learners * 8 * n / beta


def predict_here(costs: dict[str, float], learners: int, actors: int, T: float, overhead: float,
                 background: float) -> float:
    """env-steps/s on this machine, where every layout here is CPU-bound: ``CORES`` cores,
    less ``background`` of a core per process (its threads, polling, the scheduler),
    spent at ``t_step + t_learn + overhead / T`` CPU seconds per env-step (``overhead``:
    the messages and bookkeeping of one trajectory, both sides together)."""
    free = CORES - background * (learners + actors)
    return free / (costs["t_step"] + costs["t_learn"] + overhead / T)


def fit_here(costs: dict[str, float], a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """``(overhead, background)`` through two measured layouts (same T assumed for the pair)."""
    pa, pb = a["learners"] + a["actors"], b["learners"] + b["actors"]
    ratio = b["measured"] / a["measured"]
    background = CORES * (1 - ratio) / (pb - ratio * pa)
    per_step = (CORES - background * pa) / a["measured"]
    return (per_step - costs["t_step"] - costs["t_learn"]) * a["mean_T"], background


def predict_cluster(costs: dict[str, float], learners: int, actors: int, T: float, alpha: float, beta: float,
                    overhead: float) -> dict[str, float]:
    """One core per process: the actors' and the learners' rates, the smaller wins.
    ``overhead`` is split evenly between an actor and a learner (an assumption); a
    learner's round adds its fetch (request, the weights, the rows) and the all-reduce
    (ring, plus gloo's per-call cost measured here)."""
    n = costs["P"] + 3 + 2 * learners + actors + 1
    fetch = 4 * alpha + 8 * (costs["policy_P"] + T * costs["w"]) / beta
    reduce = allreduce_time(learners, n, alpha, beta) + (costs["gloo_call"] if learners > 1 else 0.0)
    t_round = T * costs["t_learn"] + overhead / 2 + fetch + reduce
    actor_rate = actors * T / (T * costs["t_step"] + overhead / 2)
    learner_rate = learners * T / t_round
    return {"env_steps_per_second": min(actor_rate, learner_rate),
            "bound": "actors" if actor_rate < learner_rate else "learners",
            "round_seconds": t_round, "communication_share": (fetch + reduce) / t_round}


def run_layout(learners: int, actors: int, episodes: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "popplay", "train", "a2c", "--workflow", "multi-learner", "--learners",
               str(learners), "--actors", str(actors), "--episodes", str(episodes), "--hidden", "32",
               "--eval-episodes", "1", "--json", "--out", str(Path(tmp) / "run.h5")]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--layouts", default="1x1,1x2,2x2,2x4")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    costs = compute_costs()
    layouts = [tuple(int(v) for v in x.split("x")) for x in args.layouts.split(",") if x]
    costs.update(gloo_costs(int(costs["P"] + 3 + 2 * 2 + 2 + 1)))
    print("costs:", json.dumps({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in costs.items()}))
    # The loopback all-reduce of 2 ranks against the ring formula with alpha and beta.
    formula = allreduce_time(2, costs["allreduce_n"], costs["alpha"], costs["beta"])
    print(f"2-rank all-reduce of {costs['allreduce_n']:.0f} float64: measured {costs['allreduce_2'] * 1e6:.0f} us, "
          f"ring model {formula * 1e6:.0f} us")
    costs["gloo_call"] = max(0.0, costs["allreduce_2"] - formula)
    rows = []
    for learners, actors in layouts:
        s = run_layout(learners, actors, args.episodes)
        rows.append({"learners": learners, "actors": actors, "env_steps": s["env_steps"],
                     "mean_T": s["env_steps"] / max(1, s["episodes"]), "measured": s["env_steps_per_second"],
                     "seconds": s["seconds"], "bytes": s["topology_bytes"]})
    # Two constants, fitted on the first and the last layout, checked on the others.
    overhead, background = fit_here(costs, rows[0], rows[-1])
    costs["trajectory_overhead"], costs["background_per_process"] = overhead, background
    print(f"fitted on {rows[0]['learners']}x{rows[0]['actors']} and {rows[-1]['learners']}x{rows[-1]['actors']}: "
          f"{overhead * 1e3:.2f} ms of CPU per trajectory outside the measured pieces, "
          f"{background:.3f} of a core per process")
    print(f"\n{'layout':>7} {'env-steps':>9} {'T':>6} {'measured/s':>10} {'model/s':>8} {'error':>6}")
    for row in rows:
        row["model"] = predict_here(costs, row["learners"], row["actors"], row["mean_T"], overhead, background)
        print(f"{row['learners']}x{row['actors']:<5} {row['env_steps']:>9} {row['mean_T']:>6.1f} "
              f"{row['measured']:>10.0f} {row['model']:>8.0f} {row['model'] / row['measured'] - 1:>+6.0%}")
    T = 200.0  # a mid-run CartPole episode (500 at the cap)
    projection = []
    print(f"\nprojection, 1024 processes, one core each, T = {T:.0f}:")
    print(f"{'network':>9} {'learners':>8} {'actors':>6} {'env-steps/s':>12} {'bound':>8} {'comm share':>10}")
    for name, net in NETWORKS.items():
        for learners in (1, 4, 16, 64, 256, 512):
            actors = 1024 - learners
            p = predict_cluster(costs, learners, actors, T, net["alpha"], net["beta"], overhead)
            projection.append({"network": name, "learners": learners, "actors": actors, **p})
            print(f"{name:>9} {learners:>8} {actors:>6} {p['env_steps_per_second']:>12,.0f} {p['bound']:>8} "
                  f"{p['communication_share']:>10.1%}")
    if args.json:
        args.json.write_text(json.dumps({"costs": costs, "layouts": rows, "projection": projection,
                                         "projection_T": T}, indent=1))


if __name__ == "__main__":
    main()

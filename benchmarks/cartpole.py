"""Cart-pole benchmarks (not tests): throughput, learning quality, box boundaries.

    python benchmarks/cartpole.py throughput [--agents 4096] [--steps 4096] [--rounds 3]
    python benchmarks/cartpole.py quality [--trials 256] [--agent-steps 262144] [--agents 1,16,64,256,1024]
    python benchmarks/cartpole.py boxes [--restarts 200]
    python benchmarks/cartpole.py replication [--agents 256] [--trials 256] [--seeds 0,1] [--settings JSON]

throughput: popplay learning Sarsa(λ) with traces (4096 agents, one trial, default
CPU backend, sharing included) against gymnasium's vectorised CartPole-v1 stepping
random actions with no learning, measured in the same run, alternating rounds (the
best round of each counts). Needs ``pip install gymnasium`` for the comparison; without
it the popplay number is still reported. With a CUDA GPU it also times torch at
8192 agents × 1024 trials.

quality: Bell's Figures 6–9: quality (mean steps balanced, ceiling 8192) against
agent-time steps and learning time for several population sizes, without and with
differentiation. Prints a table and, with --json FILE, writes the curves.

replication: selective replication with variation against none at equal agent-steps:
for each setting (a name and CartPolePopulationParams overrides) and seed, the
quality curve and the final per-trial steps balanced (mean ± standard error over
trials and seeds). Prints a table and, with --json FILE, writes the curves.

boxes: for several box boundaries, a hill-climbing search over the 2**36
deterministic box policies for the one that balances longest from random starts —
the measurement behind the default boundaries (docs/cartpole.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from popplay.games.cartpole import rules as game
from popplay.games.cartpole.rules import CartPolePopulationParams
from popplay.core.backend import Backend, resolve_backend
from popplay.games.cartpole.experiment import CartPoleExperiment

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Timing, time_loop, time_phases  # noqa: E402


# ---------------------------------------------------------------------------
# throughput


def popplay_rate(params: CartPolePopulationParams, backend: Backend, *, repeats: int = 1,
                 budget: float | None = None) -> tuple[Timing, dict[str, Any]]:
    """Agent-steps per second of learning phases (learning + sharing), as the runner
    times them; testing excluded. Each round is a run from the start whose first phase
    (first touch of the buffers) is not timed, then ``steps_per_agent - share_every``
    timed steps per agent; the best of ``repeats`` rounds (or of as many as fit in
    ``budget`` seconds). Compilation is not timed."""
    phases = max(1, params.steps_per_agent // params.share_every - 1)
    timing = time_phases(CartPoleExperiment(params, backend), phases=phases, repeats=repeats, budget=budget,
                         warm_phases=0, fresh=True, skip_phases=1)
    live = (timing.state.trace != 0).sum(-1)
    live = live.cpu().numpy() if hasattr(live, "cpu") else np.asarray(live)  # torch on CUDA, or NumPy
    return timing, {"live_traces_mean": float(live.mean()), "live_traces_max": int(live.max())}


def gymnasium_rate(num_envs: int, steps: int = 1000, *, repeats: int = 1, budget: float | None = None) -> Timing | None:
    """gymnasium's vectorised CartPole-v1 stepping random actions (no learning): env-steps
    per second, in rounds of ``steps`` steps (blocks of 50; one untimed block first).
    None when gymnasium is not installed."""
    try:
        import gymnasium
    except ImportError:
        return None
    env = gymnasium.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")
    env.reset(seed=0)
    block = 50
    actions = np.random.default_rng(0).integers(0, 2, size=(block, num_envs))

    def run_block() -> int:
        for a in actions:
            env.step(a)
        return block * num_envs

    try:
        return time_loop(run_block, calls=max(1, steps // block), repeats=repeats, budget=budget)
    finally:
        env.close()


def throughput(args: argparse.Namespace) -> None:
    import numba

    params = CartPolePopulationParams(agents=args.agents, trials=1, steps_per_agent=args.steps + args.share_every,
                                      share_every=args.share_every)
    backend = resolve_backend("auto", "cpu")
    print(f"popplay {backend.name} on {numba.get_num_threads()} threads; {args.agents} agents x 1 trial, "
          f"Sarsa(lambda) replacing traces, share every {args.share_every}, {args.steps} steps per agent")
    ours, gyms, info = [], [], {}
    for _ in range(args.rounds):
        timing, info = popplay_rate(params, backend)
        ours.append(timing.rate)
        gym = gymnasium_rate(args.agents, args.gym_steps)
        if gym is not None:
            gyms.append(gym.rate)
    best = max(ours)
    print(f"popplay learning: {best / 1e6:.1f} M agent-steps/s (rounds: "
          f"{', '.join(f'{r / 1e6:.1f}' for r in ours)}); live traces per agent: mean "
          f"{info['live_traces_mean']:.1f}, max {info['live_traces_max']}")
    if gyms:
        print(f"gymnasium CartPole-v1 vector env, random actions, no learning: {max(gyms) / 1e6:.1f} M steps/s "
              f"(rounds: {', '.join(f'{r / 1e6:.1f}' for r in gyms)})")
        print(f"ratio: {best / max(gyms):.2f}x (goal: at least 2.5x)")
    else:
        print("gymnasium is not installed (pip install gymnasium): no comparison made")
    if args.torch:
        timing, _ = popplay_rate(dataclasses.replace(params, steps_per_agent=4 * args.share_every),
                                 Backend("torch", "cpu"))
        print(f"torch CPU learning: {timing.rate / 1e6:.2f} M agent-steps/s")
    from popplay.core.backend import cuda_available

    if cuda_available():
        big = CartPolePopulationParams(agents=8192, trials=1024, steps_per_agent=4 * args.share_every,
                                       share_every=args.share_every)
        timing, _ = popplay_rate(big, Backend("torch", "cuda"))
        print(f"torch CUDA learning, 8192 agents x 1024 trials: {timing.rate / 1e9:.3f} G agent-steps/s")


# ---------------------------------------------------------------------------
# quality curves


def curve(params: CartPolePopulationParams) -> dict[str, list[float]]:
    from popplay.training import loop as runner

    ex = CartPoleExperiment(params, resolve_backend("auto", "cpu"))
    result = runner.run(ex)
    return {"agent_steps": list(result.curve.agent_steps), "seconds": list(result.curve.seconds),
            "quality": result.curve.metrics["quality"], "balanced": result.curve.metrics["balanced"]}


def quality(args: argparse.Namespace) -> None:
    overrides = json.loads(args.params) if args.params else {}
    results = {}
    for bias in args.bias:
        for agents in args.agents:
            share = args.share_every.get(agents, args.default_share) if isinstance(args.share_every, dict) else (
                args.share_every)
            share = min(share, args.agent_steps // agents)
            params = CartPolePopulationParams(**{
                "agents": agents, "trials": args.trials, "steps_per_agent": args.agent_steps // agents,
                "share_every": share, "bias": bias, "bias_decay": args.bias_decay, "seed": args.seed,
                **overrides})
            if agents == 1:
                params = dataclasses.replace(params, bias=0.0)
            c = curve(params)
            name = f"agents={agents} share_every={share} bias={params.bias}"
            results[name] = {"params": params.to_dict(), **c}
            points = ", ".join(f"{s}:{q:.0f}" for s, q in zip(c["agent_steps"], c["quality"])
                               if s in _milestones(c["agent_steps"]))
            print(f"{name:45s} final {c['quality'][-1]:7.1f} (balanced {c['balanced'][-1]:.3f}) "
                  f"learning {c['seconds'][-1]:6.2f}s | {points}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


def _milestones(steps: list[int]) -> set[int]:
    picks = {steps[-1]}
    for fraction in (0.125, 0.25, 0.5):
        target = steps[-1] * fraction
        picks.add(min(steps, key=lambda s: abs(s - target)))
    return picks


# ---------------------------------------------------------------------------
# replication against none

REPLICATION_SETTINGS = {
    "none": {},
    "every 1, 25%": {"replicate_every": 1, "replicate_fraction": 0.25},
    "every 1, 50%": {"replicate_every": 1, "replicate_fraction": 0.5},
    "every 1, 12.5%": {"replicate_every": 1, "replicate_fraction": 0.125},
    "every 4, 25%": {"replicate_every": 4, "replicate_fraction": 0.25},
    "every 1, 25%, q noise 0.01": {"replicate_every": 1, "replicate_fraction": 0.25, "mutate_q": 0.01},
    "every 1, 25%, params 1.2": {"replicate_every": 1, "replicate_fraction": 0.25, "mutate_params": 1.2},
    "every 4, 25%, params 1.2": {"replicate_every": 4, "replicate_fraction": 0.25, "mutate_params": 1.2},
}


def replication(args: argparse.Namespace) -> None:
    from popplay.training import loop as runner

    settings = json.loads(args.settings) if args.settings else REPLICATION_SETTINGS
    base = json.loads(args.params) if args.params else {}
    results: dict[str, Any] = {}
    print(f"{args.agents} agents, {args.trials} trials x seeds {args.seeds}, {args.agent_steps} agent-steps per "
          f"trial; base {base or 'defaults'}; quality at 1/8, 1/4, 1/2, all of the budget (mean over seeds), "
          "final mean ± standard error over trials and seeds", flush=True)
    for name, overrides in settings.items():
        curves, finals, drift = [], [], []
        started = time.perf_counter()
        for seed in args.seeds:
            params = CartPolePopulationParams(**{
                "agents": args.agents, "trials": args.trials, "steps_per_agent": args.agent_steps // args.agents,
                "seed": seed, **base, **overrides})
            ex = CartPoleExperiment(params, resolve_backend("auto", "cpu"))
            result = runner.run(ex)
            curves.append(result.curve.metrics["quality"])
            finals.append(ex.results(result.state)["balanced_steps"])
            drift.append({k: float(np.mean(np.asarray(getattr(result.state, k)))) for k in ("alpha", "lam", "epsilon")})
        steps = list(result.curve.agent_steps)
        mean_curve = np.mean(np.array(curves), axis=0)
        final = np.concatenate(finals)
        picks = sorted(_milestones(steps))
        points = " / ".join(f"{mean_curve[steps.index(s)]:.0f}" for s in picks)
        params_now = ", ".join(f"{k} {np.mean([d[k] for d in drift]):.3g}" for k in ("alpha", "lam", "epsilon"))
        print(f"{name:34s} {points:28s} final {final.mean():7.1f} ± {final.std(ddof=1) / np.sqrt(final.size):5.1f} "
              f"(seeds: {', '.join(f'{c[-1]:.0f}' for c in curves)}; {params_now}; "
              f"{time.perf_counter() - started:.0f}s)", flush=True)
        results[name] = {"overrides": overrides, "agent_steps": steps, "quality": [list(c) for c in curves],
                         "final_per_trial": final.tolist()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


# ---------------------------------------------------------------------------
# box boundaries


def policy_quality(policies: np.ndarray, position: float, angle_degrees: float, starts: int, seed: int,
                   steps: int = 8192) -> np.ndarray:
    """Mean steps balanced by each deterministic box policy (n, 36) from random starts."""
    from popplay.games.cartpole import _numba as kernels

    n = policies.shape[0]
    table = np.full((n, 72), -1.0)
    boxes = np.arange(36)
    table[:, 2 * boxes] = np.where(policies == 0, 0.0, -1.0)
    table[:, 2 * boxes + 1] = np.where(policies == 1, 0.0, -1.0)
    keys = game.test_keys(seed, np.arange(n), np.arange(starts))
    out = np.empty((n, starts), dtype=np.int64)
    p = CartPolePopulationParams(position_boundary=position, angle_boundary_degrees=angle_degrees)
    kernels._greedy_test(table, keys, tuple(p.physics().vector()), tuple(p.bounds()), steps, p.start_range, out)
    return out.mean(axis=1)


def _climb(policy: np.ndarray, position: float, angle: float, starts: int, seed: int) -> tuple[np.ndarray, float]:
    score = policy_quality(policy[None], position, angle, starts, seed)[0]
    while True:
        flips = np.repeat(policy[None], 36, axis=0)
        flips[np.arange(36), np.arange(36)] ^= 1
        scores = policy_quality(flips, position, angle, starts, seed)
        best = int(scores.argmax())
        if scores[best] <= score:
            return policy, score
        policy, score = flips[best], scores[best]


def boxes(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    for position in args.positions:
        for angle in args.angles:
            started = time.perf_counter()
            best, best_score = None, -1.0
            for _ in range(args.restarts):
                policy, score = _climb(rng.integers(0, 2, 36), position, angle, 16, 0)
                if score >= 4096:  # refine promising policies on more starts
                    policy, score = _climb(policy, position, angle, 128, 1)
                if score > best_score:
                    best, best_score = policy, score
                if best_score >= 8192:
                    break
            fresh = policy_quality(best[None], position, angle, 1024, 99)[0]
            print(f"position ±{position} m, angle ±{angle}°: best policy {fresh:7.1f} steps on 1024 fresh starts "
                  f"(search score {best_score:.0f}; {''.join(map(str, best))}; "
                  f"{time.perf_counter() - started:.0f}s)", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--agents", type=int, default=4096)
    t.add_argument("--steps", type=int, default=2048, help="timed steps per agent")
    t.add_argument("--share-every", type=int, default=CartPolePopulationParams().share_every)
    t.add_argument("--gym-steps", type=int, default=1000)
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--torch", action="store_true", help="also time the torch engine on the CPU")
    q = sub.add_parser("quality")
    q.add_argument("--trials", type=int, default=256)
    q.add_argument("--agent-steps", type=int, default=262144)
    q.add_argument("--agents", type=lambda s: [int(v) for v in s.split(",")], default=[1, 16, 64, 256, 1024])
    q.add_argument("--share-every", type=lambda s: int(s) if s.isdigit() else {
        int(k): int(v) for k, v in json.loads(s).items()},
                   default=CartPolePopulationParams().share_every,
                   help="steps per agent between shares, or a JSON map agents -> steps")
    q.add_argument("--default-share", type=int, default=CartPolePopulationParams().share_every)
    q.add_argument("--bias", type=lambda s: [float(v) for v in s.split(",")], default=[0.0])
    q.add_argument("--bias-decay", type=float, default=CartPolePopulationParams().bias_decay)
    q.add_argument("--params", help="JSON object of further CartPolePopulationParams fields")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--json", help="write the curves to this file")
    r = sub.add_parser("replication")
    r.add_argument("--agents", type=int, default=256)
    r.add_argument("--trials", type=int, default=256)
    r.add_argument("--agent-steps", type=int, default=262144)
    r.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1])
    r.add_argument("--settings", help="JSON object: setting name -> CartPolePopulationParams overrides")
    r.add_argument("--params", help="JSON object of overrides applied to every setting")
    r.add_argument("--json", help="write the curves to this file")
    b = sub.add_parser("boxes")
    b.add_argument("--positions", type=lambda s: [float(v) for v in s.split(",")], default=[0.5, 1.0, 1.6])
    b.add_argument("--angles", type=lambda s: [float(v) for v in s.split(",")], default=[1.0, 2.0, 3.0, 6.0])
    b.add_argument("--restarts", type=int, default=200)
    b.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    {"throughput": throughput, "quality": quality, "replication": replication, "boxes": boxes}[args.command](args)


if __name__ == "__main__":
    main(sys.argv[1:])

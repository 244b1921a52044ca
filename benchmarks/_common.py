"""What the benchmark scripts share: timing loops and a description of the machine.

Every throughput figure in ``benchmarks/`` is the best of a few timed rounds, each
of whole units of work (an experiment's phases, a peer's steps), with compilation
and a first, untimed unit excluded; :func:`time_loop` is that rule, once.
"""
from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Timing:
    """The best of several timed rounds: its work (agent-steps, agent-turns, …) and
    duration, and the rate of every round."""

    steps: int
    seconds: float
    calls: int  # units of work (phases, peer periods) in the best round
    rounds: list[float] = field(default_factory=list)
    state: Any = None  # an experiment's state after the last round

    @property
    def rate(self) -> float:
        return self.steps / self.seconds


def time_loop(step: Callable[[], int], *, calls: int, repeats: int = 3, budget: float | None = None,
              warm_calls: int = 1, before_round: Callable[[], None] | None = None) -> Timing:
    """Time ``step()`` (one unit of work; returns how many agent-steps it did).

    ``warm_calls`` untimed calls first; then rounds of ``calls`` calls each:
    ``repeats`` of them or, with ``budget``, as many as fit in ``budget`` seconds of
    timed work (at least one, at most ``repeats``). ``before_round`` runs untimed
    before every round. Returns the best round.
    """
    for _ in range(warm_calls):
        step()
    best: Timing | None = None
    rates: list[float] = []
    spent = 0.0
    while len(rates) < max(1, repeats) and not (rates and budget is not None and spent >= budget):
        if before_round is not None:
            before_round()
        done = 0
        started = time.perf_counter()
        for _ in range(calls):
            done += step()
        elapsed = time.perf_counter() - started
        spent += elapsed
        rates.append(done / elapsed)
        if best is None or rates[-1] > best.rate:
            best = Timing(done, elapsed, calls)
    best.rounds = rates
    return best


def time_phases(experiment: Any, *, phases: int, repeats: int = 3, budget: float | None = None,
                warm_phases: int = 1, fresh: bool = False, skip_phases: int = 0, state: Any = None) -> Timing:
    """Agent-steps (knights: agent-turns) per second of an experiment's phases —
    learning plus the population operators after it, as the runner times them —
    in rounds of ``phases`` phases (see :func:`time_loop` for ``repeats``/``budget``).

    Not timed: ``experiment.warmup()`` (JIT compilation) and ``warm_phases`` phases
    (first touch of buffers; knights: games that learn to finish). Rounds continue
    the population (from ``state`` if given) or, with ``fresh``, each starts again
    from the initial state and runs ``skip_phases`` untimed phases first. Phases run
    unbounded (``share_every`` steps each, whatever ``steps_per_agent`` says).
    """
    experiment.warmup()
    holder = [experiment.initial_state() if state is None else state]

    def one_phase() -> int:
        before = experiment.total_agent_steps(holder[0])
        holder[0] = experiment.phase(holder[0], time_left=math.inf)
        return experiment.total_agent_steps(holder[0]) - before

    def restart() -> None:
        holder[0] = experiment.initial_state()
        for _ in range(skip_phases):
            one_phase()

    timing = time_loop(one_phase, calls=phases, repeats=repeats, budget=budget, warm_calls=warm_phases,
                       before_round=restart if fresh else None)
    timing.state = holder[0]
    return timing


def thread_counts(cores: int) -> list[int]:
    """1, 2, 4, … up to ``cores``, and ``cores`` itself."""
    counts, t = [], 1
    while t < cores:
        counts.append(t)
        t *= 2
    return counts + [cores]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU, cores, numba threads, library versions (as run files record them) and the
    GPU (None without one)."""
    import numba
    import torch

    from popplay.checkpoints.runfile import library_versions

    gpu = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {"name": torch.cuda.get_device_name(0), "memory_gib": props.total_memory / 2**30,
               "cuda": torch.version.cuda}
    try:
        import gymnasium

        gym_version = gymnasium.__version__
    except ImportError:
        gym_version = None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "numba_threads": numba.get_num_threads(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform(), **library_versions(),
            "gymnasium": gym_version, "gpu": gpu}


def sb3_learn_and_evaluate(model: Any, env_id: str, env_steps: int, eval_episodes: int, seed: int) -> dict[str, Any]:
    """Train a stable-baselines3 ``model`` for ``env_steps``, then measure its greedy policy
    with popplay's own evaluation (the same episodes popplay's agents are measured on)."""
    from popplay.deep.topologies.common import greedy_quality

    started = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    seconds = time.perf_counter() - started
    quality = (greedy_quality(env_id, lambda obs: model.predict(obs, deterministic=True)[0], eval_episodes, seed)[0]
               if eval_episodes else float("nan"))
    steps = int(model.num_timesteps)
    return {"quality": quality, "env_steps": steps, "seconds": seconds, "env_steps_per_second": steps / seconds}

"""popplay's throughput beside its peers, measured in one run on this machine.

    python benchmarks/run.py                  # everything; JSON in benchmarks/results/run.json
    python benchmarks/run.py --quick          # tiny sizes and short rounds (a smoke test, well under a minute)
    python benchmarks/run.py --only bandit,knights --json out.json --markdown out.md
    python benchmarks/run.py --memory         # also the peak RSS of the largest bandit population

Sections (--only picks some; default all):
  bandit    agent-steps/s per backend (numba, torch CPU; torch CUDA when present) for
            1, 256, 8192 agents x 10, 100, 1000 arms (trials = 8192 / agents), beside a
            straightforward NumPy population of the same agents x trials x arms; and the
            single-agent run (131,072 steps) beside the report's CPU figure (37.7 ms).
  cartpole  learning agent-steps/s for 1, 256, 4096 agents (one trial) beside gymnasium's
            vectorised CartPole-v1 with as many environments stepping random actions
            with no learning (pip install gymnasium; without it no peer is shown).
  knights   agent-turns/s of learning for 16 and 64 agents x 64 games beside the
            machine's turn ceiling: numpy's batched evaluation of the 70-4-1 network
            (after-states/s) divided by the legal moves per ply.
  scaling   throughput against population size (numba, one trial) and against numba's
            thread count (1, 2, 4, ... cores; the peer is the same at 1 thread).
  gpu       on CUDA: bandit and cart-pole at 8192 agents x 1024 trials, knights with
            262,144 games per episode, with GPU memory (torch.cuda.max_memory_allocated).

Timing rule: a round is a fixed workload of whole phases (learning plus sharing or weight
updates, as the runner times them): bandit, a whole run of 256 steps per agent from empty
tables; cart-pole, a run from the start whose first phase is untimed, then 2048 steps per
agent; knights, 2 episodes continuing a population that has learned for --knights-warm
episodes (so that games learn to finish). Every figure is the best of as many rounds as
fit in --budget seconds of timed work (at least 1, at most --repeats). JIT compilation
and one phase before the first round are not timed. Peers are timed the same way, on
the same workload.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bandit as bench_bandit  # noqa: E402  (benchmarks/bandit.py)
import cartpole as bench_cartpole  # noqa: E402  (benchmarks/cartpole.py)
import knights as bench_knights  # noqa: E402  (benchmarks/knights.py)
from _common import Timing, machine_info, thread_counts  # noqa: E402

from popplay.games.cartpole.rules import CartPolePopulationParams  # noqa: E402
from popplay.games.knights.rules import KnightsParams  # noqa: E402
from popplay.core.backend import Backend  # noqa: E402

SECTIONS = ("bandit", "cartpole", "knights", "scaling", "gpu")
TITLES = {
    "bandit": "Bandit: agent-steps/s (epsilon 0.1, share every 16)",
    "cartpole": "Cart-pole: learning agent-steps/s (Sarsa(lambda), replacing traces, share every 64, one trial)",
    "knights": "Knights: agent-turns/s of self-play learning (TD(lambda), weight updates included)",
    "scaling-population": "Scaling: throughput against population size (numba)",
    "scaling-threads": "Scaling: throughput against numba threads (peer: the same at 1 thread)",
    "gpu": "GPU (torch CUDA)",
}


@dataclass(frozen=True)
class Sizes:
    """What the command measures; ``QUICK`` is the smoke-test version."""

    budget: float = 1.0  # seconds of timed work per figure: rounds stop once they add up to this
    repeats: int = 20  # at most this many rounds per figure (at least one); the best counts
    bandit_agents: tuple[int, ...] = (1, 256, 8192)
    bandit_arms: tuple[int, ...] = (10, 100, 1000)
    bandit_population: int = 8192  # trials = bandit_population // agents
    bandit_share_every: int = 16
    bandit_steps: int = 256  # steps per agent of one round (a whole run from the start)
    cartpole_agents: tuple[int, ...] = (1, 256, 4096)
    cartpole_steps: int = 2048  # timed steps per agent of one round (after one untimed phase)
    gym_steps: int = 1000
    knights_agents: tuple[int, ...] = (16, 64)
    knights_games: int = 64
    knights_episodes: int = 2  # per round
    knights_warm: int = 200  # untimed learning episodes before timing (numba), as benchmarks/knights.py
    knights_torch_warm: int = 2
    knights_ply_games: int = 40  # games that measure the legal moves per ply
    ceiling_evaluations: int = 1_500_000
    scaling_bandit_agents: tuple[int, ...] = (1, 4, 16, 64, 256, 1024, 4096, 8192)
    scaling_cartpole_agents: tuple[int, ...] = (1, 4, 16, 64, 256, 1024, 4096)
    scaling_knights_agents: tuple[int, ...] = (4, 16, 64)
    threads_bandit_agents: int = 8192  # 100 arms, one trial
    threads_cartpole_agents: int = 4096
    threads_knights_agents: int = 64
    gpu_bandit: tuple[tuple[int, int, int], ...] = ((8192, 1024, 10), (8192, 1024, 100), (8192, 64, 1000))
    gpu_bandit_steps: int = 64
    gpu_cartpole: tuple[int, int] = (8192, 1024)  # agents, trials
    gpu_cartpole_steps: int = 192
    gpu_knights: tuple[tuple[int, int], ...] = ((1024, 256), (4096, 64))  # agents, games per agent
    gpu_knights_episodes: int = 1
    gpu_knights_warm: int = 2


QUICK = Sizes(
    budget=0.01, repeats=1, bandit_agents=(1, 16, 256), bandit_arms=(10, 100), bandit_population=256,
    bandit_steps=32, cartpole_agents=(1, 64), cartpole_steps=128, gym_steps=100, knights_agents=(4, 8),
    knights_games=8, knights_episodes=1, knights_warm=1, knights_torch_warm=1, knights_ply_games=4,
    ceiling_evaluations=40_000, scaling_bandit_agents=(1, 16, 256), scaling_cartpole_agents=(1, 16, 64),
    scaling_knights_agents=(4, 8), threads_bandit_agents=256, threads_cartpole_agents=64, threads_knights_agents=8,
    gpu_bandit=((256, 16, 100),), gpu_bandit_steps=32, gpu_cartpole=(256, 16), gpu_cartpole_steps=128,
    gpu_knights=((64, 16),), gpu_knights_warm=1,
)

REPORT_SINGLE = "Bell's report, CPU (131,072 steps in 37.7 ms)"


# ---------------------------------------------------------------------------
# measuring


class Bench:
    """Runs the sections, caching every measurement (scaling reuses the sections'),
    and collects the rows."""

    def __init__(self, sizes: Sizes, progress: Callable[[str], None]) -> None:
        import numba
        import torch

        self.sizes = sizes
        self.say = progress
        self.cuda = bool(torch.cuda.is_available())
        self.compile = False  # also the torch engines through torch.compile (--compile)
        self.rows: list[dict[str, Any]] = []
        self.notes: dict[str, list[str]] = {}
        self.cache: dict[tuple, Any] = {}
        self.knights_states: dict[tuple, Any] = {}
        self.ceiling: dict[str, Any] | None = None
        self.max_threads = int(numba.config.NUMBA_NUM_THREADS)
        self.threads = numba.get_num_threads()

    # -- plumbing ---------------------------------------------------------------

    def backends(self) -> list[Backend]:
        compiled = [Backend("torch", "cpu", True)] if self.compile else []
        return [Backend("numba", "cpu"), Backend("torch", "cpu"), *compiled] + (
            [Backend("torch", "cuda", self.compile)] if self.cuda else [])

    def once(self, key: tuple, measure: Callable[[], Any]) -> Any:
        import numba

        key = key + (numba.get_num_threads(),)
        if key not in self.cache:
            self.cache[key] = measure()
        return self.cache[key]

    def timed(self, backend: Backend, measure: Callable[[], Any]) -> tuple[Any, float | None]:
        """``measure()``, and the peak GPU memory it allocated (MiB) on CUDA."""
        if backend.device != "cuda":
            return measure(), None
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        result = measure()
        return result, torch.cuda.max_memory_allocated() / 2**20

    def threads_of(self, backend: Backend) -> int | None:
        import numba
        import torch

        if backend.name == "numba":
            return numba.get_num_threads()
        return torch.get_num_threads() if backend.device == "cpu" else None

    def add(self, section: str, domain: str, backend: Backend, timing: Timing, *, agents: int,
            trials: int | None = None, arms: int | None = None, games: int | None = None,
            peer: dict[str, Any] | None = None, notes: str = "", gpu_mib: float | None = None,
            dtype: str = "float64") -> dict[str, Any]:
        """One row: what was measured, how fast, and against which peer (``dtype``: what
        a torch engine computed in, named in the backend where it is not float64)."""
        name = backend.name + ("+compile" if backend.compile else "") + ("" if dtype == "float64" else f"+{dtype}")
        row = {"section": section, "domain": domain, "backend": name, "device": backend.device,
               "threads": self.threads_of(backend),
               "agents": agents, "trials": trials, "arms": arms, "games_per_agent": games,
               "unit": "agent-turns/s" if domain == "knights" else "agent-steps/s",
               "steps": timing.steps, "seconds": timing.seconds, "rate": timing.rate, "rounds": timing.rounds,
               "peer": peer, "ratio": timing.rate / peer["rate"] if peer else None,
               "notes": notes}
        if gpu_mib is not None:
            row["gpu_memory_mib"] = gpu_mib
        self.rows.append(row)
        size = "x".join(str(v) for v in (agents, trials, arms or games) if v is not None)
        ratio = f", {row['ratio']:.2f}x {peer['name']}" if peer else ""
        self.say(f"  {section:<18} {domain:<8} {name} {backend.device} {size}: {fmt_rate(timing.rate)}/s "
                 f"({timing.seconds:.2f} s){ratio}")
        return row

    @staticmethod
    def peer(name: str, timing: Timing | None, size: str, **extra: Any) -> dict[str, Any] | None:
        if timing is None:
            return None
        return {"name": name, "size": size, "rate": timing.rate, "steps": timing.steps, "seconds": timing.seconds,
                "rounds": timing.rounds, **extra}

    # -- bandit -----------------------------------------------------------------

    def bandit_numpy(self, agents: int, arms: int, trials: int, name: str | None = None,
                     steps: int | None = None) -> dict[str, Any]:
        s = self.sizes
        steps = steps or s.bandit_steps
        timing = self.once(("numpy bandit", agents, trials, arms, steps), lambda: bench_bandit.numpy_population(
            agents, arms, 0.1, steps, s.bandit_share_every, trials=trials, repeats=s.repeats, budget=s.budget))
        return self.peer(name or "numpy population, same size", timing, f"{agents}x{trials}x{arms}")

    def bandit_popplay(self, backend: Backend, agents: int, arms: int, trials: int,
                       steps: int | None = None) -> tuple[Timing, float | None]:
        s = self.sizes
        steps = steps or s.bandit_steps

        def measure() -> Timing:
            timing = bench_bandit.popplay_timing(agents, arms, trials, s.bandit_share_every, backend, steps=steps,
                                                 repeats=s.repeats, budget=s.budget)
            timing.state = None  # free the population (GPU memory) before the next measurement
            return timing

        return self.once(("bandit", backend, agents, trials, arms, steps), lambda: self.timed(backend, measure))

    def bandit(self) -> None:
        s = self.sizes
        for agents in s.bandit_agents:
            for arms in s.bandit_arms:
                trials = max(1, s.bandit_population // agents)
                peer = self.bandit_numpy(agents, arms, trials)
                for backend in self.backends():
                    timing, mib = self.bandit_popplay(backend, agents, arms, trials)
                    self.add("bandit", "bandit", backend, timing, agents=agents, trials=trials, arms=arms,
                             peer=peer, gpu_mib=mib)
        single = bench_bandit.single_agent(Backend("numba", "cpu"), repeats=s.repeats, budget=s.budget)
        report = Timing(131072, 0.0377, 1, [bench_bandit.REPORT_SINGLE_AGENT_STEPS_PER_SECOND])
        self.add("bandit", "bandit", Backend("numba", "cpu"), single, agents=1, trials=1, arms=100,
                 peer=self.peer(REPORT_SINGLE, report, "1x1x100"),
                 notes="rounds: whole runs of 131,072 steps (share every 131,072)")
        self.notes.setdefault("bandit", []).append(
            f"trials = {s.bandit_population} / agents; a round is a whole run of {s.bandit_steps} steps per agent "
            "from empty tables; the peer is a straightforward NumPy population (vectorised over trials x agents, "
            "first-index argmax, sharing with equations (1)-(4)) running the same agents x trials x arms and steps; "
            "the last row is Bell's single-agent setting against the report's CPU figure.")

    # -- cart-pole --------------------------------------------------------------

    def gymnasium(self, envs: int) -> dict[str, Any] | None:
        s = self.sizes
        timing = self.once(("gymnasium", envs), lambda: bench_cartpole.gymnasium_rate(
            envs, s.gym_steps, repeats=s.repeats, budget=s.budget))
        return self.peer(f"gymnasium, {envs:,} env{'s' if envs != 1 else ''}", timing, f"{envs} envs")

    def cartpole_popplay(self, backend: Backend, agents: int, trials: int = 1,
                         steps: int | None = None) -> tuple[Timing, float | None]:
        s = self.sizes
        steps = steps or s.cartpole_steps
        params = CartPolePopulationParams(agents=agents, trials=trials)
        params = dataclasses.replace(params, steps_per_agent=steps + params.share_every)

        def measure() -> Timing:
            timing = bench_cartpole.popplay_rate(params, backend, repeats=s.repeats, budget=s.budget)[0]
            timing.state = None  # free the population (GPU memory) before the next measurement
            return timing

        return self.once(("cartpole", backend, agents, trials, steps), lambda: self.timed(backend, measure))

    def cartpole(self) -> None:
        for agents in self.sizes.cartpole_agents:
            peer = self.gymnasium(agents)
            for backend in self.backends():
                timing, mib = self.cartpole_popplay(backend, agents)
                self.add("cartpole", "cartpole", backend, timing, agents=agents, trials=1, peer=peer,
                         gpu_mib=mib)
        self.notes.setdefault("cartpole", []).append(
            "the peer: gymnasium.make_vec('CartPole-v1', num_envs=agents, vectorization_mode='vector_entry_point') "
            f"stepping random actions, no learning; a round: a run from the start, its first phase untimed, then "
            f"{self.sizes.cartpole_steps} timed steps per agent" + ("" if importlib.util.find_spec("gymnasium") is not None else
                                                     " (gymnasium is not installed: pip install gymnasium)"))

    # -- knights ----------------------------------------------------------------

    def knights_popplay(self, backend: Backend, agents: int, games: int, warm: int | None = None,
                        episodes: int | None = None, dtype: str = "float64") -> dict[str, Any]:
        """Learning rate; continues a population already warmed up at this size (any
        backend or dtype: the weights stay float64), so that only the first measurement
        of a size pays the warm-up."""
        s = self.sizes
        params = KnightsParams(agents=agents, games_per_agent=games, dtype=dtype)
        warm = warm if warm is not None else (s.knights_warm if backend.name == "numba" else s.knights_torch_warm)
        state = self.knights_states.get((agents, games))
        if state is not None:
            warm = 1

        def measure() -> dict[str, Any]:
            result, mib = self.timed(backend, lambda: bench_knights.learning_rate(
                params, backend, episodes or s.knights_episodes, warm, repeats=s.repeats, budget=s.budget,
                state=state))
            return {**result, "gpu_mib": mib, "warm": warm, "continued": state is not None}

        result = self.once(("knights", backend, agents, games, dtype), measure)
        self.knights_states.setdefault((agents, games), result["state"])
        return result

    def knights_ceiling(self, params: KnightsParams, state: Any) -> dict[str, Any]:
        if self.ceiling is None:
            s = self.sizes
            self.say("  knights ceiling: numpy batched 70-4-1 evaluation, legal moves per ply ...")
            self.ceiling = bench_knights.turn_ceiling(state, params, s.ceiling_evaluations, s.knights_ply_games)
            self.ceiling["measured_on"] = f"{params.agents} agents x {params.games_per_agent} games"
        c = self.ceiling
        return {"name": f"turn ceiling (MLP evals / {c['moves_per_ply']:.1f} moves)",
                "size": "70-4-1", "rate": c["turns_per_second"]}

    def knights_row(self, section: str, backend: Backend, agents: int, games: int, *,
                    peer: dict[str, Any] | None = None, warm: int | None = None,
                    episodes: int | None = None, dtype: str = "float64") -> dict[str, Any]:
        result = self.knights_popplay(backend, agents, games, warm, episodes, dtype)
        timing = Timing(result["turns"], result["seconds"], result["episodes"], result["rounds"])
        if peer is None:
            peer = self.knights_ceiling(KnightsParams(agents=agents, games_per_agent=games), result["state"])
        how = "continuing an earlier population" if result["continued"] else "after"
        notes = (f"{how} {result['warm']} untimed episode(s); {result['plies_per_game']:.0f} plies per game, "
                 f"rounds of {result['episodes']} episode(s)")
        return self.add(section, "knights", backend, timing, agents=agents, games=games, peer=peer, notes=notes,
                        gpu_mib=result["gpu_mib"], dtype=dtype)

    def knights(self) -> None:
        s = self.sizes
        order = sorted(s.knights_agents, reverse=True)  # the largest population measures the moves per ply
        first = len(self.rows)
        for agents in order:
            for backend in self.backends():
                self.knights_row("knights", backend, agents, s.knights_games)
            if self.compile:  # --dtype float32, the torch engine's other precision (the weights stay float64)
                self.knights_row("knights", Backend("torch", "cpu", True), agents, s.knights_games, dtype="float32")
        self.rows[first:] = sorted(self.rows[first:], key=lambda r: (r["agents"], _backend_order(r)))
        self.knights_notes("knights")

    def knights_notes(self, section: str) -> None:
        if self.ceiling is None or section in self.notes:
            return
        c = self.ceiling
        per = ", ".join(f"{k} {fmt_rate(v)}/s" for k, v in c["evaluations_per_second"].items())
        self.notes.setdefault(section, []).append(
            f"turn ceiling: numpy's batched evaluation of the 70-4-1 sigmoid network, {fmt_rate(c['evaluations'])} "
            f"after-states/s (best of float32/float64, batches 4096-65536; {per}), divided by "
            f"{c['moves_per_ply']:.2f} legal moves per ply (measured in {self.sizes.knights_ply_games} games "
            f"between the {c['measured_on']} population) = {fmt_rate(c['turns_per_second'])} turns/s: "
            "a player that only evaluated after-states, with no learning.")

    # -- scaling ----------------------------------------------------------------

    def scaling(self) -> None:
        import numba

        s = self.sizes
        cpu = Backend("numba", "cpu")
        for agents in s.scaling_bandit_agents:
            timing, _ = self.bandit_popplay(cpu, agents, 100, 1)
            self.add("scaling-population", "bandit", cpu, timing, agents=agents, trials=1, arms=100,
                     peer=self.bandit_numpy(agents, 100, 1))
        for agents in s.scaling_cartpole_agents:
            timing, _ = self.cartpole_popplay(cpu, agents)
            self.add("scaling-population", "cartpole", cpu, timing, agents=agents, trials=1,
                     peer=self.gymnasium(agents))
        for agents in s.scaling_knights_agents:
            self.knights_row("scaling-population", cpu, agents, s.knights_games)
        self.knights_notes("scaling-population")

        counts = thread_counts(self.max_threads)
        single: dict[str, dict[str, Any]] = {}
        try:
            for t in counts:
                numba.set_num_threads(t)
                bandit, _ = self.bandit_popplay(cpu, s.threads_bandit_agents, 100, 1)
                cart, _ = self.cartpole_popplay(cpu, s.threads_cartpole_agents)
                knights = self.knights_popplay(cpu, s.threads_knights_agents, s.knights_games)
                knights_timing = Timing(knights["turns"], knights["seconds"], knights["episodes"], knights["rounds"])
                for domain, timing, size in (("bandit", bandit, dict(trials=1, arms=100)),
                                             ("cartpole", cart, dict(trials=1)),
                                             ("knights", knights_timing, dict(games=s.knights_games))):
                    if t == 1:
                        single[domain] = self.peer("numba, 1 thread", timing, "same")
                    agents = {"bandit": s.threads_bandit_agents, "cartpole": s.threads_cartpole_agents,
                              "knights": s.threads_knights_agents}[domain]
                    self.add("scaling-threads", domain, cpu, timing, agents=agents, peer=single.get(domain),
                             **size)
        finally:
            numba.set_num_threads(self.threads)
        self.rows[:] = [r for r in self.rows if r["section"] != "scaling-threads"] + sorted(
            (r for r in self.rows if r["section"] == "scaling-threads"), key=lambda r: (r["domain"], r["threads"]))

    # -- GPU --------------------------------------------------------------------

    def gpu(self, device: str = "cuda", compile: bool = False,
            domains: tuple[str, ...] = ("bandit", "cartpole", "knights")) -> None:
        """The GPU section; ``device="cpu"`` runs the same rows on torch's CPU (the test
        suite's way of exercising this path on machines without a GPU); ``compile``:
        the engines' steps through torch.compile; ``domains``: which engines' rows."""
        import torch

        s = self.sizes
        cuda = Backend("torch", device, compile)
        largest_gym = max(s.cartpole_agents)
        for agents, trials, arms in s.gpu_bandit if "bandit" in domains else ():
            (timing, mib), used = _shrink_on_oom(
                lambda t: self.bandit_popplay(cuda, agents, arms, t, s.gpu_bandit_steps), trials, torch)
            cpu_trials = max(1, s.bandit_population // agents)
            peer = self.bandit_numpy(agents, arms, cpu_trials, f"numpy population, {agents:,} x {cpu_trials:,} trials",
                                     s.gpu_bandit_steps)
            self.add("gpu", "bandit", cuda, timing, agents=agents, trials=used, arms=arms, peer=peer,
                     gpu_mib=mib, notes=_oom_note(trials, used, "trials"))
        if "cartpole" in domains:
            agents, trials = s.gpu_cartpole
            (timing, mib), used = _shrink_on_oom(
                lambda t: self.cartpole_popplay(cuda, agents, t, s.gpu_cartpole_steps), trials, torch)
            self.add("gpu", "cartpole", cuda, timing, agents=agents, trials=used, peer=self.gymnasium(largest_gym),
                     gpu_mib=mib, notes=_oom_note(trials, used, "trials"))
        for agents, games in s.gpu_knights if "knights" in domains else ():
            _, used = _shrink_on_oom(lambda g: self.knights_popplay(cuda, agents, g, s.gpu_knights_warm,
                                                                    s.gpu_knights_episodes), games, torch)
            row = self.knights_row("gpu", cuda, agents, used, warm=s.gpu_knights_warm,
                                   episodes=s.gpu_knights_episodes)
            row["notes"] += f"; {agents * used:,} games per episode" + (
                "; " + _oom_note(games, used, "games per agent") if used != games else "")
        if "knights" in domains:
            self.knights_notes("gpu")
        self.notes.setdefault("gpu", []).append(
            "GPU memory: torch.cuda.max_memory_allocated over the measurement. Peers at CPU sizes: the NumPy "
            "bandit population at the bandit table's size for that many agents, gymnasium at its largest "
            "measured env count, the knights turn ceiling of the CPU.")


def _shrink_on_oom(measure: Callable[[int], Any], size: int, torch: Any) -> tuple[Any, int]:
    """``measure(size)``, halving ``size`` while the GPU runs out of memory."""
    while True:
        try:
            return measure(size), size
        except torch.cuda.OutOfMemoryError:
            if size <= 1:
                raise
            torch.cuda.empty_cache()
            size //= 2


def _oom_note(asked: int, used: int, what: str) -> str:
    return "" if asked == used else f"{what} halved from {asked} to {used} (GPU out of memory)"


def _backend_order(row: dict[str, Any]) -> int:
    return {("numba", "cpu"): 0, ("torch", "cpu"): 1, ("torch+compile", "cpu"): 2, ("torch+compile+float32", "cpu"): 3,
            ("torch", "cuda"): 4, ("torch+compile", "cuda"): 5}.get((row["backend"], row["device"]), 6)


# ---------------------------------------------------------------------------
# tables


def fmt_rate(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value:.3g}"


def fmt_count(value: int | None) -> str:
    if value is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value:,}"


COLUMNS = ("domain", "backend", "device", "threads", "agents", "trials", "arms/games", "steps", "seconds",
           "best of", "rate/s", "peer", "peer rate/s", "ratio")


def cells(row: dict[str, Any]) -> list[str]:
    peer = row["peer"]
    return [
        row["domain"], row["backend"], row["device"] or "-", "-" if row["threads"] is None else str(row["threads"]),
        f"{row['agents']:,}", "-" if row["trials"] is None else f"{row['trials']:,}",
        f"{row['arms']:,}" if row["arms"] else (f"{row['games_per_agent']:,} games" if row["games_per_agent"] else "-"),
        fmt_count(row["steps"]), f"{row['seconds']:.3g}", str(len(row["rounds"])), fmt_rate(row["rate"]),
        peer["name"] if peer else "-", fmt_rate(peer["rate"]) if peer else "-",
        f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-",
    ]


def table(rows: list[dict[str, Any]], markdown: bool) -> list[str]:
    gpu = any("gpu_memory_mib" in r for r in rows)
    columns = list(COLUMNS) + (["GPU MiB"] if gpu else [])
    body = [cells(r) + ([f"{r['gpu_memory_mib']:,.0f}" if "gpu_memory_mib" in r else "-"] if gpu else [])
            for r in rows]
    if markdown:
        right = {"threads", "agents", "trials", "arms/games", "steps", "seconds", "best of", "rate/s", "peer rate/s",
                 "ratio", "GPU MiB"}
        lines = ["| " + " | ".join(columns) + " |",
                 "|" + "|".join("---:" if c in right else "---" for c in columns) + "|"]
        return lines + ["| " + " | ".join(b) + " |" for b in body]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]
    left = {columns.index(c) for c in ("domain", "backend", "device", "peer")}
    line = lambda values: "  ".join(v.ljust(w) if i in left else v.rjust(w)  # noqa: E731
                                    for i, (v, w) in enumerate(zip(values, widths))).rstrip()
    return [line(columns), line(["-" * w for w in widths])] + [line(b) for b in body]


QUICK_WARNING = ("WARNING: --quick measures smoke sizes in short rounds: start-up costs dominate, so the rates "
                 "and the ratios to peers below mean nothing (run without --quick for real figures).")


def render(report: dict[str, Any], markdown: bool) -> str:
    m = report["machine"]
    gpu = m["gpu"]["name"] if m["gpu"] else "none"
    head = (f"Machine: {m['cpu']}, {m['cores']} cores, numba {m['numba']} on {m['numba_threads']} threads, "
            f"torch {m['torch']} ({m['torch_threads']} threads), numpy {m['numpy']}, "
            f"gymnasium {m['gymnasium'] or 'not installed'}; GPU: {gpu}.")
    rule = report["timing_rule"]
    out = [head, "", rule, ""] if markdown else [head, rule, ""]
    if report.get("quick"):
        out[:0] = [QUICK_WARNING, ""]
    for section in report["sections"]:
        rows = [r for r in report["rows"] if r["section"] == section]
        if not rows:
            continue
        out.append(f"### {TITLES[section]}" if markdown else f"== {TITLES[section]}")
        if markdown:
            out.append("")
        out.extend(table(rows, markdown))
        for note in report["notes"].get(section, []):
            out.extend(["", note] if markdown else [f"  note: {note}"])
        out.append("")
    for line in report.get("extra_lines", []):
        out.append(line)
    if report.get("memory"):
        for steps, row in report["memory"].items():
            out.append(f"Peak RSS, bandit 1000 arms x 8192 agents x 64 trials, {steps} steps per agent (numba, "
                       f"fresh process): {row['peak_rss_mib']:.0f} MiB ({row['learning_seconds']:.2f} s learning)")
    out.append(f"Total wall time of this command: {report['total_seconds']:.0f} s.")
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and short rounds (a smoke test)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--json", help="write the report here (default: benchmarks/results/run.json for a whole "
                                       "default run; none with --quick, --only, --markdown or --compile)")
    parser.add_argument("--markdown", help="write the tables as Markdown here")
    parser.add_argument("--budget", type=float, help="seconds of timed work per figure (rounds stop at it)")
    parser.add_argument("--repeats", type=int, help="at most this many timed rounds per figure (the best counts)")
    parser.add_argument("--knights-warm", type=int, help="untimed learning episodes before knights timing")
    parser.add_argument("--memory", action="store_true",
                        help="also the peak RSS of bandit 1000 arms x 8192 agents x 64 trials (fresh processes)")
    parser.add_argument("--compile", action="store_true",
                        help="also torch.compile'd torch engines (rows 'torch+compile'; the GPU rows compiled)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown or not wanted:
        parser.error(f"--only: unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    sizes = QUICK if args.quick else Sizes()
    overrides = {k: v for k, v in (("budget", args.budget), ("repeats", args.repeats),
                                   ("knights_warm", args.knights_warm)) if v is not None}
    sizes = dataclasses.replace(sizes, **overrides)

    started = time.perf_counter()
    say = (lambda text: None) if args.quiet else (
        lambda text: print(f"[{time.perf_counter() - started:5.0f} s] {text}", file=sys.stderr, flush=True))
    if args.quick:
        print(QUICK_WARNING, file=sys.stderr, flush=True)
    bench = Bench(sizes, say)
    bench.compile = args.compile
    extra = []
    sections = []
    for name in SECTIONS:
        if name not in wanted:
            continue
        if name == "gpu" and not bench.cuda:
            extra.append("no CUDA GPU: GPU rows skipped")
            say("no CUDA GPU: GPU rows skipped")
            continue
        say(f"{name} ...")
        getattr(bench, name)()
        sections.extend(["scaling-population", "scaling-threads"] if name == "scaling" else [name])
    report: dict[str, Any] = {
        "command": " ".join(["python benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])]),
        "quick": args.quick,
        "timing_rule": (f"Each figure is the best of as many rounds as fit in {sizes.budget:g} s of timed work "
                        f"(at least 1, at most {sizes.repeats}; 'best of' says how many), a round being a fixed "
                        "workload of whole phases (learning plus sharing or weight updates, as the runner times "
                        "them). Not timed: JIT compilation and one phase before the first round (knights: "
                        f"{sizes.knights_warm} learning episodes so that games learn to finish, torch "
                        f"{sizes.knights_torch_warm}, 1 when continuing a population already warm). Peers are "
                        "timed the same way. Ratio = popplay rate / peer rate."),
        "machine": machine_info(), "sizes": dataclasses.asdict(sizes), "sections": sections,
        "rows": bench.rows, "notes": bench.notes, "knights_ceiling": bench.ceiling, "extra_lines": extra,
    }
    if args.memory:
        say("memory ...")
        report["memory"] = bench_bandit.peak_memory()
    report["total_seconds"] = time.perf_counter() - started
    print(render(report, markdown=False), end="")
    json_path = report_path(args, wanted)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2, default=_jsonable))
        say(f"wrote {json_path}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(render(report, markdown=True))
        say(f"wrote {args.markdown}")
    return report


def report_path(args: argparse.Namespace, wanted: list[str]) -> str | None:
    """Where the JSON report goes: ``--json``, else the project's figures
    (results/run.json), which are only ever a whole default run's: a smoke run, some
    sections, a Markdown export or the compiled rows write only what was asked."""
    whole_run = not (args.quick or args.markdown or args.compile or set(wanted) != set(SECTIONS))
    return args.json or (str(HERE / "results" / "run.json") if whole_run else None)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


if __name__ == "__main__":
    main()

"""Memory: what this machine has available, and what a run or an evaluation needs.

Every estimate here counts the arrays that dominate a domain's memory (state,
scratch buffers, traces, snapshots, the batch of games), from its parameters alone,
so that a command can refuse with one line *before* allocating instead of growing
past the machine's memory or dying in ``MemoryError``. Estimates are deliberately a
little generous (constant overheads of a Python process are not counted: they are
covered by refusing only what exceeds the memory *available*).

``POPPLAY_MAX_MEMORY`` (bytes, or with a K/M/G/T suffix) lowers the limit below what
the machine has, e.g. on a shared machine.
"""
from __future__ import annotations

import math
import os
from typing import Any

MAX_MEMORY_ENV = "POPPLAY_MAX_MEMORY"
_SUFFIXES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


class MemoryLimitError(ValueError):
    """A run or a file needs more memory than is available; the message is one line."""


def format_bytes(n: float) -> str:
    """``1.5 GB``-style sizes (binary multiples, as ``free -h``)."""
    n = float(n)
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.3g} EB"  # pragma: no cover


def parse_bytes(text: str) -> int:
    """``"512M"`` -> 536870912; raises ValueError."""
    raw = text.strip().lower().removesuffix("b")
    suffix = raw[-1:] if raw[-1:] in _SUFFIXES else ""
    value = float(raw[: len(raw) - len(suffix)])
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return int(value * _SUFFIXES[suffix])


def available_bytes() -> int:
    """Memory a new allocation can get without swapping: MemAvailable (Linux), else
    the free physical pages; capped by ``POPPLAY_MAX_MEMORY`` when set."""
    found = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            found = 2**63
    cap = os.environ.get(MAX_MEMORY_ENV)
    if cap:
        try:
            found = min(found, parse_bytes(cap))
        except ValueError:
            pass
    return found


def check_fits(needed: float, what: str) -> None:
    """Raise :class:`MemoryLimitError` if ``needed`` bytes exceed what is available."""
    available = available_bytes()
    if needed > available:
        raise MemoryLimitError(f"{what} needs about {format_bytes(needed)} of memory; this machine has "
                               f"{format_bytes(available)} available")


# ---------------------------------------------------------------------------
# Estimates per domain (bytes), from the parameter dataclasses' fields.

_F8 = 8


def bandit_bytes(p: Any) -> int:
    trials, agents, arms = int(p.trials), int(p.agents), int(p.arms)
    per_trial = arms * _F8 * 6  # q, n, means, ranking order and rank, a copy when saving
    # the per-phase buffers of touched arms: trials x agents x min(arms, steps per phase), three int64 each
    touched = min(arms, int(p.share_every))
    per_agent = 3 * _F8 * touched + 6 * _F8  # plus epsilon, top-k and group per agent
    return trials * per_trial + trials * agents * per_agent


def cartpole_bytes(p: Any, world: int = 1, local: int = 1) -> int:
    """One machine's need: ``local`` of the job's ``world`` ranks run on it. A rank of
    the trial layout holds its trials' tables and the whole population's small
    bookkeeping (α, λ, ε, ids, fitness, the lineage's founders); a rank of the agent
    layout holds everything."""
    from popplay.games.cartpole import STATE_ACTIONS
    from popplay.populations.base import shard_layout

    trials, agents = int(p.trials), int(p.agents)
    # q, trace, weight and three recycled buffers of the same size, plus positions and counters
    per_agent = 7 * STATE_ACTIONS * _F8 + 12 * _F8  # measured within 15% (100 x 1000 agents)
    whole = trials * agents * per_agent + trials * STATE_ACTIONS * _F8 * 2
    if shard_layout(trials, world) != "trials":
        return local * whole
    # ids, α, λ, ε, fitness, the lineage's founders and, on the writer, the save's
    # compact copies of every rank's trials: measured 553 B per agent-trial
    # (benchmarks/distributed.py --memory)
    bookkeeping = trials * agents * 75 * _F8 + trials * STATE_ACTIONS * _F8 * 2
    return local * ((trials // world) * agents * (7 * STATE_ACTIONS * _F8 + 7 * _F8) + bookkeeping)


def knights_bytes(p: Any) -> int:
    from popplay.games.knights import parameter_count

    size = parameter_count(2 * int(p.rows) * int(p.cols), int(p.hidden))
    agents = int(p.agents)
    games = agents * int(p.games_per_agent)
    networks = agents * size * _F8 * 4  # weights, a copy for replication, deltas summed, a checkpoint copy
    deltas = games * 2 * size * _F8  # one TD(λ) change per game copy and side
    per_game = 64 + 2 * int(p.max_turns) * 4  # board, dice and result of every game in the batch
    snapshots = 0
    if int(p.snapshot_every) > 0:
        snapshots = (int(p.episodes) // int(p.snapshot_every) + 1) * agents * size * _F8
    evaluation = knights_games_bytes(agents * max(int(p.eval_games), 2))
    return networks + deltas + games * per_game + snapshots + evaluation


def knights_games_bytes(games: int) -> int:
    """A batch of ``games`` greedy games (evaluations, tournaments): pairs, keys, results."""
    return int(games) * 160  # measured: about 140 bytes a game (evaluate, 4e6 games)


ESTIMATES = {"bandit": bandit_bytes, "cartpole": cartpole_bytes, "knights": knights_bytes}


def run_bytes(domain: str, params: Any, world: int = 1, local: int = 1) -> int:
    """The memory a run of ``domain`` with ``params`` needs on one machine, where
    ``local`` of the job's ``world`` ranks run (0 for an unknown domain). Domains
    without a per-rank estimate count the whole run once per machine."""
    estimate = ESTIMATES.get(domain)
    if estimate is None:
        return 0
    return int(estimate(params, world, local)) if domain == "cartpole" else int(estimate(params))


def ranks_here() -> tuple[int, int]:
    """(ranks in the job, ranks on this machine) inside a rank (the launchers' variables),
    else (1, 1)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    except ValueError:
        return 1, 1
    return (world, local) if world >= 1 and 1 <= local <= world else (1, 1)


def check_run_fits(domain: str, params: Any, what: str | None = None) -> None:
    """Refuse (:class:`MemoryLimitError`) a run that cannot fit in this machine's memory
    (inside a rank: this machine's ranks together)."""
    world, local = ranks_here() if "RANK" in os.environ else (1, 1)
    needed = run_bytes(domain, params, world, local)
    where = f" ({local} of its {world} ranks here)" if world > 1 else ""
    check_fits(needed, (what or f"a {domain} run with these settings") + where)

"""Memory: what this machine has available, and what a run or an evaluation needs; and
the cores a process should use.

Every domain estimates (its spec's ``memory``) the arrays that dominate its memory
(state, scratch buffers, traces, snapshots, the batch of games), from its parameters
alone, so that a command can refuse with one line *before* allocating instead of
growing past the machine's memory or dying in ``MemoryError``. Estimates are
deliberately a little generous (constant overheads of a Python process are not
counted: they are covered by refusing only what exceeds the memory *available*).

``POPPLAY_MAX_MEMORY`` (bytes, or with a K/M/G/T suffix) lowers the limit below what
the machine has, e.g. on a shared machine.
"""
from __future__ import annotations

import math
import os
from typing import Any

from popplay.core import registry
from popplay.core.errors import UsageError

MAX_MEMORY_ENV = "POPPLAY_MAX_MEMORY"
_SUFFIXES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


class MemoryLimitError(UsageError):
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


def ranks_here() -> tuple[int, int]:
    """(ranks in the job, ranks on this machine) inside a rank (the launchers' variables),
    else (1, 1)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    except ValueError:
        return 1, 1
    return (world, local) if world >= 1 and 1 <= local <= world else (1, 1)


def cores_per_process(variable: str = "OMP_NUM_THREADS") -> int:
    """The threads one process should run: ``variable`` when set to a count (``--nproc``
    sets it for each rank, torchrun sets ``OMP_NUM_THREADS``), else the cores this
    process may run on, shared between the ranks on this machine."""
    given = os.environ.get(variable, "").strip()
    if given.isdigit() and int(given) >= 1:
        return int(given)
    local = ranks_here()[1] if "RANK" in os.environ else 1
    return max(1, usable_cores() // local)


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask, capped by a CPU quota
    (a container's ``--cpus``, whose mask still lists every core of the host)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not every platform has affinity masks
        cores = os.cpu_count() or 1
    quota = _cpu_quota()
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


#: Where a cgroup states its CPU quota: v2's ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD"),
#: v1's quota and period files.
CPU_QUOTA_FILES: tuple[tuple[str, str | None], ...] = (
    ("/sys/fs/cgroup/cpu.max", None),
    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def _cpu_quota() -> float | None:
    """The cgroup's CPU quota in cores, or None (no quota, or none readable)."""
    for path, period_path in CPU_QUOTA_FILES:
        try:
            with open(path) as f:
                fields = f.read().split()
            if period_path is not None:
                with open(period_path) as f:
                    fields.append(f.read().strip())
            quota, period = fields[0], fields[1]
            if quota in ("max", "-1"):
                return None
            return float(quota) / float(period) if float(quota) > 0 else None
        except (OSError, ValueError, IndexError, ZeroDivisionError):
            continue
    return None


def check_run_fits(domain: str, params: Any, what: str | None = None) -> None:
    """Refuse (:class:`MemoryLimitError`) a run that cannot fit in this machine's memory
    (inside a rank: this machine's ranks together), by the domain's own estimate."""
    world, local = ranks_here() if "RANK" in os.environ else (1, 1)
    needed = registry.get(domain).memory_bytes(params, world, local)
    where = f" ({local} of its {world} ranks here)" if world > 1 else ""
    check_fits(needed, (what or f"a {domain} run with these settings") + where)

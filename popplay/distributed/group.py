"""The process group of this job, started from the torchrun-style environment.

Both launchers (``popplay ... --nproc N`` and ``torchrun``) set ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; :func:`init_from_env`
reads them and starts c10d with gloo on the CPU or NCCL on CUDA and a short timeout
(default 60 s instead of c10d's 30 minutes), so that a lost peer ends the job soon.
Without those variables the job is one process and nothing is started.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import signal
import sys
from dataclasses import dataclass
from typing import Iterator

DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Dist:
    """Where this process stands in its job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "none"  # "gloo", "nccl" or "none" (one process)
    timeout: float = DEFAULT_TIMEOUT
    device: str = "cpu"  # where collective buffers live ("cuda:K" for NCCL)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_writer(self) -> bool:
        """Only rank 0 prints and writes files."""
        return self.rank == 0


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when the launcher dies, so that a killed
    launcher never leaves orphan ranks behind (best effort elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    launcher = os.environ.get("POPPLAY_LAUNCHER_PID", "")
    if launcher.isdigit() and os.getppid() != int(launcher):  # it died before the request: nobody waits for us
        os._exit(1)


_SINGLE = Dist()
_current: Dist = _SINGLE


def env_world() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` from the environment, or None outside a job."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
    if not (world >= 1 and 0 <= rank < world):
        raise ValueError(f"RANK {rank} is outside WORLD_SIZE {world}")
    return rank, world, local


def current() -> Dist:
    """The job this process belongs to (world size 1 when no group was started)."""
    return _current


def init_from_env(*, device: str = "cpu", timeout: float = DEFAULT_TIMEOUT) -> Dist:
    """Start the process group the environment describes (idempotent).

    ``device`` "cpu" uses gloo; a CUDA device uses NCCL with one GPU per local rank.
    Every collective, and the rendezvous itself, gives up after ``timeout`` seconds.
    Returns the :class:`Dist` (world size 1 and no group when the environment names
    no job or a job of one).
    """
    global _current
    if _current.distributed:
        return _current
    found = env_world()
    if found is None or found[1] == 1:
        _current = Dist(timeout=timeout)
        return _current
    if not timeout > 0:
        raise ValueError(f"timeout must be positive (got {timeout})")
    rank, world, local = found
    die_with_parent()  # under torchrun too: a killed agent must not leave its workers running

    import torch  # defers torch
    import torch.distributed as c10d  # defers torch

    if str(device).startswith("cuda"):
        backend = "nccl"
        torch.cuda.set_device(local)
        where = f"cuda:{local}"
    else:
        backend, where = "gloo", "cpu"
    limit = datetime.timedelta(seconds=timeout)
    if os.environ.get("POPPLAY_LAUNCHED") == "1":
        # Our launcher: the store listens on the loopback socket it bound for rank 0.
        port = int(os.environ["MASTER_PORT"])
        fd = os.environ.get("POPPLAY_STORE_FD") if rank == 0 else None
        store = c10d.TCPStore("127.0.0.1", port, world, rank == 0, limit, wait_for_workers=False,
                              **({"master_listen_fd": int(fd)} if fd is not None else {}))
        c10d.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=limit)
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store across --max-restarts attempts, so a restarted
        # rank could read the previous attempt's addresses and connect to a dead peer
        # (seen: "Connection refused" in gloo's connectFullMesh). A prefix per attempt.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = c10d.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False, limit)
        c10d.init_process_group(backend=backend, store=c10d.PrefixStore(f"popplay/attempt_{attempt}", store),
                                rank=rank, world_size=world, timeout=limit)
    else:
        c10d.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world, timeout=limit)
    _current = Dist(rank=rank, world_size=world, local_rank=local, backend=backend, timeout=timeout,
                    device=where)
    if rank != 0:
        # Only rank 0 prints: the others' progress would repeat it N times.
        sys.stdout = open(os.devnull, "w")
    return _current


def shutdown() -> None:
    """Leave the process group (if any); the job is one process again afterwards."""
    global _current
    if _current.distributed:
        import torch.distributed as c10d  # defers torch

        if c10d.is_initialized():
            try:
                c10d.destroy_process_group()
            except Exception:  # a broken group (lost peer) cannot always be torn down cleanly
                pass
    _current = _SINGLE


@contextlib.contextmanager
def session(*, device: str = "cpu", timeout: float = DEFAULT_TIMEOUT) -> Iterator[Dist]:
    """``with session() as dist:`` -- the group for the duration of the block."""
    dist = init_from_env(device=device, timeout=timeout)
    try:
        yield dist
    finally:
        shutdown()


def set_role(role: str) -> None:
    """Show ``role`` as this process's name (``ps -e``, ``pgrep``, ``top``); Linux keeps
    15 bytes. The launcher's command line already says ``popplay rank R/N``."""
    name = role[:15].encode()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_NAME = 15
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass

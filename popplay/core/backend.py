"""What every population experiment shares: backends and the phase schedule."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from popplay.core.errors import UsageError

BACKENDS = ("auto", "numba", "torch")
DEVICES = ("auto", "cpu", "cuda")


class BackendError(UsageError):
    """A backend or device that cannot be used here (a usage error)."""


@dataclass(frozen=True)
class Backend:
    """Where a population runs: ``numba`` (CPU) or ``torch`` (CPU or CUDA)."""

    name: str
    device: str
    compile: bool = False  # torch: run the engine's steps through torch.compile

    def synchronize(self) -> None:
        """Wait for queued device work, so that wall-clock timings are honest."""
        if self.name == "torch" and self.device.startswith("cuda"):
            import torch  # defers torch

            torch.cuda.synchronize()

    def chunks(self, items: int) -> int:
        """How many blocks to split ``items`` independent agents into for threads."""
        import numba  # defers numba

        return max(1, min(items, numba.get_num_threads() * 16))


# Device nodes (and driver files) a visible NVIDIA or ROCm GPU leaves on Linux; with
# none of them there is no GPU for torch to find, and the seconds that importing
# torch costs are saved (``--backend auto`` on a CPU machine then starts at once).
_GPU_MARKERS = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")


def cuda_available() -> bool:
    if sys.platform.startswith("linux") and "torch" not in sys.modules \
            and not any(os.path.exists(marker) for marker in _GPU_MARKERS):
        return False
    import torch  # defers torch

    return bool(torch.cuda.is_available())


def resolve_backend(backend: str = "auto", device: str = "auto", compile: bool | None = None) -> Backend:
    """Turn the user's ``--backend``/``--device``/``--compile`` into a usable :class:`Backend`.

    ``auto`` picks torch on CUDA when a GPU is present and numba on the CPU otherwise.
    ``compile=None`` compiles where it paid when measured: the torch engine on CUDA
    (1.1x to 19x on an H200, docs/performance.md), not on the CPU, where compiled steps
    lost to eager ones for the bandit and every compiled engine stayed far behind numba.
    Raises :class:`BackendError` for an unknown name or a GPU that is not there.
    """
    if backend not in BACKENDS:
        raise BackendError(f"--backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    if device not in DEVICES:
        raise BackendError(f"--device must be one of {', '.join(DEVICES)} (got {device!r})")
    if device == "cuda" and not cuda_available():
        raise BackendError("--device cuda: no CUDA GPU is available on this machine")
    if backend == "numba" and device == "cuda":
        raise BackendError("--backend numba runs on the CPU only; use --backend torch for --device cuda")
    if device == "auto":
        device = "cuda" if backend != "numba" and cuda_available() else "cpu"
    if backend == "auto":
        backend = "torch" if device == "cuda" or compile else "numba"
    if compile and backend != "torch":
        # said of the engine, not of an option: a resumed run takes its backend from its file
        raise BackendError("--compile compiles the torch engine, and this run is on the numba engine, compiled "
                           "already (--backend torch to compile)")
    if compile is None:
        compile = backend == "torch" and device == "cuda"
    return Backend(backend, device, bool(compile))


@dataclass(frozen=True)
class PhasePlan:
    """Learning phases of ``share_every`` steps per agent, the last one shortened to
    end exactly on the step budget (so every run ends on a sharing point)."""

    steps_per_agent: int
    share_every: int

    def next_length(self, done: int, *, unbounded: bool = False) -> int:
        if unbounded:
            return self.share_every
        return max(0, min(self.share_every, self.steps_per_agent - done))


def shard_layout(trials: int, world_size: int) -> str:
    """How a population splits over ``world_size`` ranks: ``"trials"`` when the ranks
    divide the trials (trials never share, so nothing travels inside a phase), else
    ``"agents"`` (a block of every trial's agents, gathered for each share)."""
    return "trials" if world_size > 1 and trials % world_size == 0 else "agents"

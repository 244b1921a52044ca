"""Counting the torch operations that make the host wait for the device.

On a GPU, an operation whose result the host needs in order to go on (a tensor's
value in an ``if``, the size of ``nonzero``'s answer, ``.item()``) stalls the whole
queue of kernels behind it. On the CPU nothing stalls, but the same operations are
dispatched, so counting them here tells how a phase would behave on a GPU without
one. The counter sees every aten operation through a ``TorchDispatchMode``.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

# aten operations whose result's size or value the host must know: each is one
# device-to-host round trip on CUDA. Copies to the CPU (reading a phase's results)
# are counted apart, as ``reads``.
SYNC_OPS = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal", "masked_select",
    "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim", "bincount",
    "repeat_interleave", "histc", "allclose", "_assert_async",
})


class SyncCounter:
    """``with SyncCounter() as c: ...`` then ``c.syncs`` (host waits), ``c.ops`` (all
    tensor operations), ``c.by_name`` (the host waits by aten name)."""

    def __init__(self) -> None:
        self.syncs = 0
        self.ops = 0
        self.reads = 0
        self.by_name: Counter[str] = Counter()
        self._mode: Any = None

    def __enter__(self) -> "SyncCounter":
        from torch.utils._python_dispatch import TorchDispatchMode  # defers torch

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                counter._see(func, args, kwargs or {})
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def _see(self, func: Any, args: tuple, kwargs: dict) -> None:
        self.ops += 1
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.syncs += 1
            self.by_name[name] += 1
        elif name in ("_to_copy", "copy_") and _to_host(args, kwargs):
            self.reads += 1


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether a copy moves a device tensor to the CPU."""
    source = args[0] if args else None
    device = kwargs.get("device")
    on_device = getattr(getattr(source, "device", None), "type", "cpu") != "cpu"
    return on_device and (device is None or str(device).startswith("cpu"))

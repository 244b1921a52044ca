"""Torch tensor namespace (see :mod:`popplay.xp`)."""
from __future__ import annotations

from typing import Any, Callable

import torch

vectorized = True


def fn(function: Callable) -> Callable:
    return function


# torch's int64 arithmetic wraps modulo 2**64 on every device.
def add64(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    return a + b


def mul64(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    return a * b


def to_float(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def to_int(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64)


floor = torch.floor
frexp = torch.frexp
ldexp = torch.ldexp
where = torch.where
abs = torch.abs  # noqa: A001


# Array plumbing for rules that run a state machine over pending lanes (the ziggurat).
def broadcast(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.broadcast_tensors(*tensors))


def nonzero(mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return mask.nonzero(as_tuple=True)


def size(x: torch.Tensor) -> int:
    return x.numel()


def arange(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(n, device=like.device)


def empty_float(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(like.shape, dtype=torch.float64, device=like.device)


def zeros_bool(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like, dtype=torch.bool)


zeros_like = torch.zeros_like


def zeros_float(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(like.shape, dtype=torch.float64, device=like.device)


def compact(mask: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flat indices of ``mask``'s true lanes packed into ``capacity`` slots, without
    asking the device how many there are: (lanes, valid, overflow), where ``valid``
    marks the slots in use (the others hold lane 0) and ``overflow`` (0-d) says some
    true lanes did not fit."""
    flat = mask.reshape(-1)
    if flat.device.type == "cpu" and not torch.compiler.is_compiling():
        # Eager on a CPU one library pass finds the lanes, about 9x faster than the
        # running count on a large mask (a block of reward noise). Compiled steps and
        # GPUs keep the running count, whose graphs and sync-free queues their tests
        # check; a test holds the two to the same answers.
        return _compact_by_library(flat, capacity)
    return _compact_by_count(flat, capacity)


def _compact_by_library(flat: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _packed(torch.nonzero_static(flat, size=capacity, fill_value=0)[:, 0], flat.sum(), capacity)


def _compact_by_count(flat: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rank = flat.cumsum(0) - 1
    slot = torch.where(flat & (rank < capacity), rank, capacity)  # the rest share a spare slot
    lanes = torch.zeros(capacity + 1, dtype=torch.int64, device=flat.device)
    lanes.scatter_(0, slot, torch.arange(flat.numel(), device=flat.device))
    count = rank[-1] + 1 if flat.numel() else torch.zeros((), dtype=torch.int64, device=flat.device)
    return _packed(lanes[:capacity], count, capacity)


def _packed(lanes: torch.Tensor, count: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`compact`'s answer from the packed lanes and the number of true lanes."""
    return lanes, torch.arange(capacity, device=lanes.device) < count, count > capacity


class Rooms:
    """Empty int8 tensors whose length is a step's room for packed lanes
    (:func:`compact`'s capacity): a size a compiled step takes as an input. From length
    2 on it is marked dynamic, so one compiled step serves every room; passed as a
    Python int, each new room would build the step again (seconds each on a CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._held: dict[int, torch.Tensor] = {}

    def __call__(self, size: int) -> torch.Tensor:
        room = self._held.get(size)
        if room is None:
            room = self._held[size] = torch.empty(size, dtype=torch.int8, device=self.device)
            if size > 1:  # dynamo specialises sizes 0 and 1
                torch._dynamo.maybe_mark_dynamic(room, 0)
        return room


def nth_true(mask: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Along the last axis, the index of the ``rank``-th (from 0) True of ``mask``; 0
    where there are not that many. Counted, not searched: the number of slots whose
    running count of Trues is at most ``rank``. Compiled on a CPU a count runs in vector
    lanes, where an ``argmax`` over the running count goes one slot at a time."""
    before = (mask.cumsum(dim=-1) <= rank[..., None]).sum(dim=-1)
    return torch.where(before < mask.shape[-1], before, 0)


def flat_take(x: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1)[lanes]


def flat_put(x: torch.Tensor, lanes: torch.Tensor, valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` with ``values`` written at the valid ``lanes`` (flat indices)."""
    out = torch.cat([x.reshape(-1), x.new_zeros(1)])
    out.scatter_(0, torch.where(valid, lanes, x.numel()), values.to(x.dtype))
    return out[:x.numel()].view(x.shape)


class _Table:
    """A float64 table copied once to each device that indexes it."""

    def __init__(self, values: Any) -> None:
        self._values = values
        self._by_device: dict[Any, torch.Tensor] = {}

    def on(self, device: Any) -> torch.Tensor:
        if device not in self._by_device:
            self._by_device[device] = torch.as_tensor(self._values, dtype=torch.float64, device=device)
        return self._by_device[device]

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        # take: advanced indexing ran 3-5x slower on a CPU for millions of look-ups
        return self.on(index.device).take(index)


def table(values: Any) -> _Table:
    """A float64 look-up table indexed by tensors on any device."""
    return _Table(values)


sigmoid = torch.sigmoid


def put_along(table: torch.Tensor, index: torch.Tensor, value: torch.Tensor,
              columns: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """``table`` with ``value`` written at ``index`` along axis ``dim`` (``index`` and
    ``value`` shaped like ``table`` with 1 there).

    With ``columns`` (``arange`` of that axis, shaped to broadcast along it) a one-hot select into a new tensor:
    compiled, an in-place write into a step's input costs a copy of the whole table and
    a write-back, where the select fuses into the step's one pass over it. Without,
    ``scatter_`` in place: eager, that touches one element a row where the select is a
    dense pass. The values written are the same either way; so that they are, ``value``
    must have ``table``'s dtype (``where`` would promote silently where ``scatter_`` refuses)."""
    if value.dtype != table.dtype:
        raise TypeError(f"put_along: a {value.dtype} value into a {table.dtype} table")
    if columns is None:
        return table.scatter_(dim, index, value)
    return torch.where(columns == index, value, table)


def compiled(step: Callable, enabled: bool) -> Callable:
    """``step`` through ``torch.compile`` as one graph (``fullgraph``: a graph break is an
    error, not a silent fall-back to Python), shapes fixed (every step of an engine
    has the same shapes); ``step`` itself when not ``enabled``."""
    if not enabled:
        return step
    compiled_step = torch.compile(step, fullgraph=True, dynamic=False)
    # Every engine (population size, side to move) is its own graph of the same code;
    # past dynamo's default of 8 graphs per code, later engines would run uncompiled.
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 64)
    return compiled_step

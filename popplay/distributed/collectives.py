"""Tensor-only collectives whose results do not depend on the number of ranks.

Every function takes NumPy arrays or torch tensors and gives back the same kind; in
a one-process job each is the identity (or the plain local computation), so callers
need no second code path. Every call is bounded by the group's timeout; a lost or
silent peer turns into one :class:`CollectiveError` naming this rank and the
operation. Nothing here pickles: only tensors cross the wire.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from popplay.core.backend import shard_layout
from popplay.core.errors import PopplayError
from popplay.distributed.group import Dist, current

#: What a rank exits with when a collective failed because a peer vanished.
from popplay.distributed.launch import PEER_LOST_EXIT  # noqa: E402  (re-exported)

_TRAFFIC = {"calls": 0, "bytes": 0, "seconds": 0.0}


class CollectiveError(PopplayError, RuntimeError):
    """A collective did not complete: a peer rank was lost or did not answer in time."""

    exit_code = PEER_LOST_EXIT


def traffic(reset: bool = False) -> dict[str, float]:
    """Collectives so far in this process: ``calls``, payload ``bytes`` sent by this
    rank, and wall ``seconds`` spent inside them (for benchmarks)."""
    snapshot = dict(_TRAFFIC)
    if reset:
        _TRAFFIC.update(calls=0, bytes=0, seconds=0.0)
    return snapshot


def shard(n: int, dist: Dist | None = None) -> slice:
    """This rank's contiguous block of an axis of length ``n`` (rank order = agent order)."""
    dist = dist or current()
    if n % dist.world_size:
        raise ValueError(f"{n} agents cannot be split evenly over {dist.world_size} ranks "
                         "(the number of ranks must divide the number of agents)")
    size = n // dist.world_size
    return slice(dist.rank * size, (dist.rank + 1) * size)


# -- plumbing -----------------------------------------------------------------------

def _to_tensor(array: Any, dist: Dist) -> tuple[Any, bool, Any]:
    """(tensor on the group's device, was NumPy, original dtype)."""
    import torch  # defers torch

    if isinstance(array, torch.Tensor):
        tensor, numpy_in, dtype = array, False, array.dtype
    else:
        array = np.ascontiguousarray(array)
        dtype = array.dtype
        if dtype == np.uint64:  # gloo has no unsigned 64-bit type: send the bits as int64
            array = array.view(np.int64)
        tensor, numpy_in = torch.from_numpy(array), True
    if str(tensor.device) != dist.device and dist.backend == "nccl":
        tensor = tensor.to(dist.device)
    return tensor, numpy_in, dtype


def _from_tensor(tensor: Any, numpy_in: bool, dtype: Any, like: Any = None) -> Any:
    if not numpy_in:
        return tensor.to(like.device) if like is not None and tensor.device != like.device else tensor
    out = tensor.cpu().numpy()
    if dtype == np.uint64:
        out = out.view(np.uint64)
    return out


def guarded(dist: Dist, name: str, fn: Callable[[], Any], payload_bytes: int = 0) -> Any:
    """``fn()`` (one c10d call named ``name``), its failure turned into one
    :class:`CollectiveError` naming this rank, the operation and the group's timeout;
    counted in :func:`traffic`. Every wait on another rank goes through here."""
    started = time.perf_counter()
    try:
        result = fn()
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CollectiveError(
            f"rank {dist.rank} of {dist.world_size}: {name} failed: a peer rank was lost or did not answer "
            f"within {dist.timeout:g}s ({first[:200]})") from None
    _TRAFFIC["calls"] += 1
    _TRAFFIC["bytes"] += int(payload_bytes)
    _TRAFFIC["seconds"] += time.perf_counter() - started
    return result


# -- collectives --------------------------------------------------------------------

def all_gather_axis(local: Any, axis: int, dist: Dist | None = None) -> Any:
    """Every rank's ``local`` concatenated in rank order along ``axis``.

    All ranks must pass the same shape and dtype. With contiguous shards
    (:func:`shard`) the result is the whole agent axis in agent order.
    """
    dist = dist or current()
    if not dist.distributed:
        return local
    import torch  # defers torch
    import torch.distributed as c10d  # defers torch

    tensor, numpy_in, dtype = _to_tensor(local, dist)
    axis = axis % tensor.dim()
    front = torch.movedim(tensor, axis, 0).contiguous()
    parts = [torch.empty_like(front) for _ in range(dist.world_size)]
    guarded(dist, "all_gather", lambda: c10d.all_gather(parts, front), front.numel() * front.element_size())
    whole = torch.movedim(torch.cat(parts, dim=0), 0, axis).contiguous()
    return _from_tensor(whole, numpy_in, dtype, like=local if not numpy_in else None)


def all_gather_ragged(local: np.ndarray, dist: Dist | None = None) -> np.ndarray:
    """Every rank's 1-D NumPy ``local`` concatenated in rank order, the lengths free to
    differ between ranks (two collectives: the lengths, then the padded values)."""
    dist = dist or current()
    if not dist.distributed:
        return np.asarray(local)
    local = np.ascontiguousarray(local)
    if local.ndim != 1:
        raise ValueError("all_gather_ragged takes 1-D arrays")
    lengths = all_gather_axis(np.array([local.size], dtype=np.int64), axis=0, dist=dist)
    if not lengths.any():  # nothing anywhere: no zero-length gather on the wire
        return local
    padded = np.zeros(int(lengths.max()), dtype=local.dtype)
    padded[:local.size] = local
    whole = all_gather_axis(padded, axis=0, dist=dist).reshape(dist.world_size, -1)
    return np.concatenate([whole[r, :int(n)] for r, n in enumerate(lengths)])


def gather_rows(local: np.ndarray, counts: Any, root: int = 0, dist: Dist | None = None) -> np.ndarray | None:
    """Every rank's rows of a NumPy array (axis 0; rank r holds ``counts[r]`` of them,
    the other axes alike everywhere) concatenated in rank order on ``root``; None on
    the others. Point-to-point, as raw bytes (any dtype travels exactly), so only
    ``root`` ever holds the whole array: for saves of sharded state far larger than
    one rank's share."""
    dist = dist or current()
    if not dist.distributed:
        return np.asarray(local)
    import torch  # defers torch
    import torch.distributed as c10d  # defers torch

    local = np.ascontiguousarray(local)
    counts = [int(c) for c in counts]
    if local.shape[0] != counts[dist.rank]:
        raise ValueError(f"rank {dist.rank} holds {local.shape[0]} rows, counts say {counts[dist.rank]}")
    row_bytes = int(np.prod(local.shape[1:], dtype=np.int64)) * local.itemsize

    def wire(array: np.ndarray) -> Any:
        tensor = torch.from_numpy(array.reshape(-1).view(np.uint8))
        return tensor.to(dist.device) if dist.backend == "nccl" else tensor

    if dist.rank != root:
        if counts[dist.rank] * row_bytes:
            payload = wire(local)
            guarded(dist, "send", lambda: c10d.send(payload, dst=root), payload.numel())
        return None
    out = np.empty((sum(counts),) + local.shape[1:], dtype=local.dtype)
    start = 0
    for rank, count in enumerate(counts):
        block = out[start:start + count]
        start += count
        if rank == root:
            block[...] = local
        elif count * row_bytes:
            received = torch.empty(count * row_bytes, dtype=torch.uint8, device=dist.device)
            guarded(dist, "recv", lambda: c10d.recv(received, src=rank), 0)
            block.reshape(-1).view(np.uint8)[:] = received.cpu().numpy()
    return out


def broadcast(array: Any, src: int = 0, dist: Dist | None = None) -> Any:
    """``src``'s array on every rank (same shape and dtype everywhere)."""
    dist = dist or current()
    if not dist.distributed:
        return array
    import torch.distributed as c10d  # defers torch

    tensor, numpy_in, dtype = _to_tensor(array, dist)
    tensor = tensor.contiguous().clone()
    guarded(dist, "broadcast", lambda: c10d.broadcast(tensor, src), tensor.numel() * tensor.element_size())
    return _from_tensor(tensor, numpy_in, dtype, like=array if not numpy_in else None)


def _reduce_scalar(value: float, op_name: str, dtype: Any, dist: Dist) -> Any:
    import torch  # defers torch
    import torch.distributed as c10d  # defers torch

    tensor = torch.tensor([value], dtype=dtype, device=dist.device)
    op = {"max": c10d.ReduceOp.MAX, "sum": c10d.ReduceOp.SUM}[op_name]
    guarded(dist, f"all_reduce({op_name})", lambda: c10d.all_reduce(tensor, op=op), tensor.element_size())
    return tensor.item()


def any_flag(flag: bool, dist: Dist | None = None) -> bool:
    """True on every rank when it is true on any (e.g. a stop request)."""
    dist = dist or current()
    if not dist.distributed:
        return bool(flag)
    import torch  # defers torch

    return bool(_reduce_scalar(1 if flag else 0, "max", torch.int64, dist))


def sum_int(value: int, dist: Dist | None = None) -> int:
    """The sum of an integer over ranks (integers: exact in any order)."""
    dist = dist or current()
    if not dist.distributed:
        return int(value)
    import torch  # defers torch

    return int(_reduce_scalar(int(value), "sum", torch.int64, dist))


def max_float(value: float, dist: Dist | None = None) -> float:
    """The largest value over ranks (a max is exact in any order)."""
    dist = dist or current()
    if not dist.distributed:
        return float(value)
    import torch  # defers torch

    return float(_reduce_scalar(float(value), "max", torch.float64, dist))


def sum_int_array(array: Any, dist: Dist | None = None) -> Any:
    """The element-wise sum over ranks of an integer array (exact in any order, so
    no fixed order is needed); same kind, shape and dtype as ``array``."""
    dist = dist or current()
    if not dist.distributed:
        return array
    import torch.distributed as c10d  # defers torch

    tensor, numpy_in, dtype = _to_tensor(array, dist)
    if tensor.is_floating_point():
        raise TypeError("sum_int_array sums integers only (float sums depend on their order: use tree_sum)")
    tensor = tensor.contiguous().clone()
    guarded(dist, "all_reduce(sum)", lambda: c10d.all_reduce(tensor, op=c10d.ReduceOp.SUM), tensor.numel() * tensor.element_size())
    return _from_tensor(tensor, numpy_in, dtype, like=array if not numpy_in else None)


def chain(step: Callable[[Any], Any], start: Any, dist: Dist | None = None) -> Any:
    """``step`` applied rank after rank, in rank order, each to the previous rank's
    result (rank 0 to ``start``); the last result on every rank.

    For a sequential reduction whose operands stay on their ranks (a running float sum
    in agent or game order): rank r continues exactly where rank r − 1 stopped, so the
    bits are those of one process doing every step in order. ``step`` must return an
    array of ``start``'s shape and dtype. N − 1 point-to-point messages and one
    broadcast, each bounded by the timeout.
    """
    dist = dist or current()
    if not dist.distributed:
        return step(start)
    import torch.distributed as c10d  # defers torch

    tensor, numpy_in, dtype = _to_tensor(start, dist)
    carried = tensor.contiguous().clone()
    size = carried.numel() * carried.element_size()
    if dist.rank > 0:
        guarded(dist, "recv", lambda: c10d.recv(carried, src=dist.rank - 1), 0)
    mine, _, _ = _to_tensor(step(_from_tensor(carried, numpy_in, dtype, like=start if not numpy_in else None)), dist)
    carried = mine.contiguous().clone()
    if dist.rank < dist.world_size - 1:
        guarded(dist, "send", lambda: c10d.send(carried, dst=dist.rank + 1), size)
    guarded(dist, "broadcast", lambda: c10d.broadcast(carried, src=dist.world_size - 1), size if dist.rank == dist.world_size - 1 else 0)
    return _from_tensor(carried, numpy_in, dtype, like=start if not numpy_in else None)


def barrier(dist: Dist | None = None) -> None:
    """Wait for every rank (bounded by the timeout)."""
    dist = dist or current()
    if not dist.distributed:
        return
    import torch  # defers torch
    import torch.distributed as c10d  # defers torch

    # A tiny all_reduce instead of c10d.barrier: it honours the group timeout on
    # gloo and NCCL alike and needs no device guessing.
    token = torch.zeros(1, dtype=torch.int64, device=dist.device)
    guarded(dist, "barrier", lambda: c10d.all_reduce(token), token.element_size())


# -- fixed-order reductions ---------------------------------------------------------

def _tree(x: Any, axis: int) -> Any:
    """The one-process pairwise tree over ``axis`` (kept, length 1): pairs (0, 1),
    (2, 3), ... at every level, an odd last element carried up unchanged."""
    import torch  # defers torch

    x = torch.movedim(x, axis, 0)
    while x.shape[0] > 1:
        n = x.shape[0]
        half = n // 2
        pairs = x[0:2 * half:2] + x[1:2 * half:2]
        x = torch.cat([pairs, x[2 * half:]], dim=0) if n % 2 else pairs
    return torch.movedim(x, 0, axis)


def tree_sum(local: Any, axis: int = -2, dist: Dist | None = None) -> Any:
    """The sum over the whole agent axis (sharded contiguously over ranks), keeping
    that axis with length 1, in exactly the order of the one-process pairwise tree.

    When every rank's block is a power of two long, the first levels of the tree stay
    inside blocks: each rank sums its own block and only the partial sums travel.
    Otherwise the per-agent values are gathered and summed in agent order. Either way
    the bits are those of one process summing all agents.
    """
    dist = dist or current()
    import torch  # defers torch

    tensor, numpy_in, dtype = _to_tensor(local, dist) if not isinstance(local, torch.Tensor) else (local, False, local.dtype)
    axis = axis % tensor.dim()
    size = tensor.shape[axis]
    if dist.distributed and size & (size - 1) == 0:
        whole = all_gather_axis(_tree(tensor, axis), axis, dist)
    else:
        whole = all_gather_axis(tensor, axis, dist)
    result = _tree(whole, axis)
    return _from_tensor(result, numpy_in, dtype, like=None if numpy_in else local)


def population_shard(trials: int, agents: int, dist: Any) -> tuple[str, slice, slice]:
    """This rank's part of a (trials, agents) population: the layout
    (:func:`shard_layout`), its trials and its agents (contiguous blocks; the whole axis
    where the layout does not split it)."""

    layout = shard_layout(trials, dist.world_size)
    if layout == "trials":
        return layout, shard(trials, dist), slice(0, agents)
    return layout, slice(0, trials), shard(agents, dist)

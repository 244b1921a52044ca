"""Populations across processes: launch, process groups, fixed-order collectives.

This package knows ``torch.distributed`` (c10d) and nothing above it; populations,
operators and topologies call into it. Importing it is cheap (torch is imported
lazily, inside the functions that need it). Only tensors travel: no pickled Python
objects (no ``*_object`` collectives), no ``torch.distributed.rpc``.

Stable API (later changes only add to it)
-----------------------------------------
Launch (:mod:`popplay.distributed.launch`, no torch import):

- ``launch_local(argv, nproc, *, timeout=60.0, threads_per_rank=None, describe_lost=None,
  module="popplay.cli.rank", stderr=None) -> int``: start ``nproc`` ranks of
  ``python -m MODULE "popplay rank R/N" ARGV...`` (the default module runs ``popplay ARGV``)
  on 127.0.0.1 with the torchrun environment (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, plus ``POPPLAY_LAUNCHED=1``,
  ``POPPLAY_ROLE`` and ``POPPLAY_STORE_FD``: rank 0 gets the store's loopback socket, bound
  by the launcher), watch them, forward SIGINT/SIGTERM, stop every rank when one is lost
  (one ``Error: rank R of N was lost (...)`` line) and return the exit code.
- ``LOST_EXIT`` (exit code of a job that lost a rank), ``PEER_LOST_EXIT`` (exit code a rank
  should use when it saw a peer vanish), ``launched_here()``, ``in_rank()``, ``role(r, n)``.
- A rank's own ``Error: ...`` lines on stderr are held by the launcher and shown only when
  that rank is the cause; ranks other than 0 have stdout discarded.

Training glue (:mod:`popplay.training.ranks`): ``wants_launch``, ``launch_training``,
``launch_command``, ``rank_session``, ``agreed_stop``, ``restarted_resume`` (torchrun
``--max-restarts``), ``summary_fields``.

Process groups (:mod:`popplay.distributed.group`):

- ``Dist``: frozen dataclass ``(rank, world_size, local_rank, backend, timeout, device)``
  with ``.distributed`` and ``.is_writer``.
- ``env_world() -> (rank, world_size, local_rank) | None``: what the environment says.
- ``init_from_env(*, device="cpu", timeout=60.0) -> Dist``: start the process group
  (gloo on CPU, NCCL on CUDA) from the torchrun-style environment; world size 1 without it.
- ``current() -> Dist``: the group this process belongs to (world size 1 when none).
- ``shutdown()``; ``session(device, timeout)``: a context manager doing both.

Collectives (:mod:`popplay.distributed.collectives`), every one bounded by the group's
timeout and raising :class:`CollectiveError` (one line naming this rank, the operation and
the timeout) when a peer is lost:

- ``shard(n, dist=None) -> slice``: this rank's contiguous part of an axis of length ``n``
  (``n`` must be divisible by the world size).
- ``all_gather_axis(local, axis) -> same kind``: every rank's part, concatenated in rank
  order along ``axis`` (NumPy arrays or tensors).
- ``tree_sum(local, axis=-2)``: the sum over the whole (sharded) agent axis in exactly the
  order of the one-process pairwise tree (pairs (0, 1), (2, 3), ... at every level).
- ``sum_int_array(array)``: element-wise integer sum over ranks (exact in any order).
- ``broadcast(array, src=0)``, ``any_flag(flag) -> bool``, ``sum_int(value) -> int``,
  ``max_float(value) -> float``, ``barrier()``.
- ``traffic()``: bytes and seconds spent in collectives so far (for benchmarks).

Exactness rule: a reduction over agents never depends on the number of ranks. Either
all ranks gather the per-agent values and reduce them in agent order (the one-process
code on the gathered array), or, when every rank holds a power-of-two aligned block, each
reduces its block with the same pairwise tree and the partial results are gathered and
finished in rank order -- the same tree, the same bits.
"""
from __future__ import annotations

__all__ = ["launch", "group", "collectives"]

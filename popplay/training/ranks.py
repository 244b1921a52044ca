"""``popplay train DOMAIN --nproc N`` / ``torchrun ... -m popplay train DOMAIN``: the glue
between the train commands and :mod:`popplay.distributed`.

Outside a job with ``--nproc N > 1`` the command becomes a launcher
(:func:`launch_training`); inside a rank (either launcher) :func:`rank_session`
starts the process group, and the run goes on as in one process with three
differences: only rank 0 locks and writes the run file, a stop request counts when
any rank saw it (so all stop at the same phase), and a lost peer ends the rank with
:data:`~popplay.distributed.launch.PEER_LOST_EXIT`.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from popplay.checkpoints.runfile import RunFileError
from popplay.checkpoints.validation import load_run, summarize
from popplay.core import registry
from popplay.core.backend import shard_layout
from popplay.core.errors import UsageError
from popplay.core.limits import cores_per_process
from popplay.core.registry import POPULATION, DomainSpec
from popplay.distributed.collectives import any_flag, barrier, max_float, traffic
from popplay.distributed.group import DEFAULT_TIMEOUT, Dist, init_from_env, shutdown
from popplay.distributed.launch import in_rank, launch_local, launched_here


def with_out(argv: list[str], out: Path) -> list[str]:
    """Every rank must name the same run file: a default name (a time stamp) is
    decided once, here."""
    if any(a == "--out" or a.startswith("--out=") or a == "--resume" or a.startswith("--resume=") for a in argv):
        return argv
    return [*argv, "--out", str(out)]


def describe_checkpoint(out: Path) -> str:
    """Where the last good checkpoint is (for the line that reports a lost rank)."""

    if not Path(out).exists():
        return f"no checkpoint was written yet ({out} does not exist)"
    try:
        summary = summarize(Path(out))
    except RunFileError:
        return f"{out} is not a readable checkpoint"
    return (f"last good checkpoint: {out} (phase {summary.get('phases')}; "
            f"continue with --resume {out})")


def launch_training(argv: list[str], nproc: int, timeout: float, out: Path) -> int:
    """Start ``nproc`` local ranks of this very command (``argv``: the command line
    after ``popplay``); return the job's exit code."""

    argv = with_out(argv, out)
    return launch_local(argv, nproc, timeout=timeout, describe_lost=lambda: describe_checkpoint(out))


def check_divisible(params: Any, nproc: int, *, splits_trials: bool = False) -> None:
    """Refuse, before starting anything, a number of ranks that divides neither the
    agents nor (where the domain can split them) the trials."""

    agents, trials = getattr(params, "agents", None), getattr(params, "trials", None)
    if nproc <= 1 or not isinstance(agents, int) or agents % nproc == 0:
        return
    if splits_trials and isinstance(trials, int):
        if shard_layout(trials, nproc) == "trials":
            return
        raise ValueError(f"{agents} agents and {trials} trials cannot be split evenly over {nproc} ranks "
                         "(the number of ranks must divide the number of trials or of agents)")
    raise ValueError(f"{agents} agents cannot be split evenly over {nproc} ranks "
                     "(the number of ranks must divide the number of agents)")


def launch_command(argv: list[str], nproc: int, timeout: float) -> int:
    """Start ``nproc`` local ranks of a command that writes no run file (a tournament)."""

    return launch_local(argv, nproc, timeout=timeout)


def wants_launch(nproc: int) -> bool:
    """True when this process should launch ranks rather than be one."""
    return nproc > 1 and not in_rank()


@contextlib.contextmanager
def rank_session(nproc: int, timeout: float = DEFAULT_TIMEOUT, device: str = "cpu") -> Iterator[Dist]:
    """The process group of this rank for the duration of a training run.

    Raises ``ValueError`` when ``--nproc`` contradicts the launcher's world size.
    """

    if in_rank() and launched_here() and nproc > 1:

        if int(os.environ["WORLD_SIZE"]) != nproc:
            raise ValueError(f"--nproc {nproc} but this job has {os.environ['WORLD_SIZE']} ranks")
    dist = init_from_env(device="cuda" if str(device).startswith("cuda") else "cpu", timeout=timeout)
    split_numba_threads(dist)
    try:
        yield dist
    finally:
        shutdown()


def restarted_resume(domain: str, params: Any, out: Path, resume: Any) -> Any:
    """Under ``torchrun --max-restarts K``, a restarted job (``TORCHELASTIC_RESTART_COUNT``
    > 0) continues from its last checkpoint at ``--out`` instead of starting over.

    Returns the run file to resume (or ``resume`` unchanged when this is not a restart,
    a resume was asked for, or no checkpoint exists yet). Raises ``ValueError`` when
    the checkpoint belongs to other settings.
    """

    if resume is not None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) <= 0:
        return resume
    if not Path(out).exists():
        return resume

    try:
        stored = load_run(Path(out), expected_domain=domain)
    except RunFileError as error:
        raise ValueError(f"restart: cannot continue from {out} ({error})") from None
    mine = {key: value for key, value in params.to_dict().items()}
    theirs = {key: stored.config.get(key) for key in mine}
    if json_safe(mine) != json_safe(theirs):
        raise ValueError(f"restart: {out} was written with other settings; not continuing it")
    return stored


def json_safe(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def split_numba_threads(dist: Dist) -> None:
    """Under torchrun (which sets OMP_NUM_THREADS only) share the cores between the
    local ranks, as ``--nproc`` does, unless NUMBA_NUM_THREADS was given."""

    if not dist.distributed:
        return
    numba = sys.modules.get("numba")
    if numba is None:  # not loaded (a deep rank may never load it): it takes its pool's size from here when it is
        os.environ["NUMBA_NUM_THREADS"] = str(cores_per_process("NUMBA_NUM_THREADS"))
        return
    try:
        numba.set_num_threads(max(1, min(numba.config.NUMBA_NUM_THREADS, cores_per_process("NUMBA_NUM_THREADS"))))
    except ValueError:
        pass


def agreed_stop(should_stop: Callable[[], bool], dist: Dist) -> Callable[[], bool]:
    """A stop request seen by any rank stops every rank at the same phase."""
    if not dist.distributed:
        return should_stop

    return lambda: any_flag(should_stop(), dist)


class _RankSync:
    """:class:`popplay.core.experiment.RankSync` over a process group: a barrier to start, the
    slowest rank's learning time (all_reduce MAX) to count."""

    def __init__(self, dist: Dist) -> None:
        self.dist = dist

    def start(self) -> None:
        barrier(self.dist)

    def agree(self, flag: bool) -> bool:
        return any_flag(flag, self.dist)

    def seconds(self, learning_seconds: float) -> float:
        return max_float(learning_seconds, self.dist)


def rank_sync(dist: Dist) -> _RankSync | None:
    """How the ranks keep in step in the runner (None in a one-process job)."""
    return _RankSync(dist) if dist.distributed else None


def check_supported(dist: Dist, *, spec: DomainSpec, world: int, symmetric: bool = False) -> None:
    """What a job over ranks cannot do (usage errors, the same on every rank): a
    population its domain does not shard, a deep topology on another number of ranks
    than its layout has. ``symmetric``: every rank runs the phases on its share of a
    population (any number of ranks the population divides into)."""
    if not dist.distributed:
        return
    if spec.kind == POPULATION and not spec.sharded:
        sharded = [name for name in registry.names() if registry.get(name).sharded]
        raise UsageError(f"{spec.name} does not run on several ranks yet (sharded: {', '.join(sharded)})")
    if not symmetric and dist.world_size != world:
        raise UsageError(f"this run needs {world} ranks (rank 0 and {world - 1} others); the job has "
                         f"{dist.world_size}")


def summary_fields(dist: Dist) -> dict[str, Any]:
    """What the summary adds: the world size and, with several ranks, rank 0's traffic
    in collectives (payload bytes it sent, calls, seconds inside them)."""
    fields: dict[str, Any] = {"world_size": dist.world_size}
    if dist.distributed:

        sent = traffic()
        fields.update(comm_calls=int(sent["calls"]), comm_bytes=int(sent["bytes"]),
                      comm_seconds=float(sent["seconds"]))
    return fields

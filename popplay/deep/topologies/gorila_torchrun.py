"""Gorila under ``torchrun`` (see :mod:`popplay.deep.topologies.gorila` for the local launch).

``torchrun --standalone --nproc-per-node 4 -m popplay train gorila --actors 1 --learners 1
--shards 2 ...``: every worker runs the same command line. What the local launcher does
is shared out:

- **Layout**: the world size must be ``shards + learners + actors`` (checked before any
  rendezvous; rank 0 says so in one line, every rank exits 2). Ranks take their role from
  their rank exactly as in the local layout (:func:`gorila.role_of`).
- **Store**: torchrun's agent hosts a ``TCPStore`` that outlives every worker
  (``TORCHELASTIC_USE_AGENT_STORE``), so no rank's death takes the rendezvous with it,
  as with the local launcher's. Each attempt uses its own key prefix: the agent keeps
  one store across ``--max-restarts``, and a restarted rank must not read the previous
  attempt's "finished" counts or gloo addresses.
- **Preparation**: rank 0 writes the attempt's directory (``OUT.parts/attempt-K/``:
  ``config.json``, ``resume.npz``) and says "ready" through the store; the others wait
  for that, bounded by ``--timeout``. Then every worker ``exec``s
  ``python -m popplay.deep.topologies.gorila_ranks "popplay gorila ROLE I" CONFIG`` (same
  pid, so torchrun still watches it): the rank code and the role on its command line,
  for ``ps``, are the local launch's.
- **Finishing**: nobody watches ``waitpid``, so each client adds itself to the
  "finished" counts as it ends, each shard after its last save; rank 0 (shard 0) then
  assembles the checkpoint, evaluates, writes the run file, and prints the summary.
- **Faults**: torchrun's agent ends every worker when one fails, so a lost actor *does*
  stop the attempt here (the local launch goes on without it). The shards' files are
  written atomically, and rank 0 keeps ``OUT`` up to date (incomplete) as they advance,
  so ``OUT`` always holds a checkpoint at most one shard checkpoint old. With
  ``torchrun --max-restarts K`` the next attempt continues from the freshest one (the
  shards' files of the attempt that was lost): parameters, AdaGrad accumulator and
  version; the budget is what the earlier attempts' actors had not played yet;
  replay memories start empty (as with ``--resume``). The summary and run file cover
  all attempts (``restarts``: how many were lost). When no restart is left, ``OUT``
  holds the last checkpoint: ``popplay train gorila --resume OUT --env-steps N``.
- **Ctrl-C**: torchrun sends SIGINT to every worker, which put "stop" in the store;
  every rank finishes what it holds, and rank 0 writes the run file (incomplete,
  no greedy evaluation: torchrun kills workers 30 s after the signal), exit 130.

Nothing is pickled: the store carries short strings, the wire tensors.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

import numpy as np
import torch.distributed as dist

from popplay.checkpoints.h5io import resolve_output
from popplay.checkpoints.lock import LockBusy, RunLock, adopt_inherited
from popplay.core.errors import PopplayError, UsageError, error_line
from popplay.deep.topologies import gorila as G
from popplay.distributed.launch import torchrun_rank

#: Key (in the agent's store, no prefix) naming the run file of this torchrun job once
#: rank 0 prepared its first attempt: a restart continues that job, with that ``--out``
#: (a default ``--out`` holds a time stamp that a restarted rank 0 would pick anew).
PREPARED = "popplay/gorila/prepared"
#: In an attempt's directory: the stored run that ``--resume`` continues (G.StoredBefore).
BEFORE_FILE = "before.npz"
#: Stream offset per attempt: a restarted actor must not replay the same episodes.
ATTEMPT_STRIDE = 1 << 20


def under_torchrun() -> bool:
    """True in a worker started by torchrun (torchrun's variables, not our launcher's)."""

    return torchrun_rank() is not None


def rank() -> int:
    return torchrun_rank() or 0


def attempt() -> int:
    """Which attempt of the torchrun job this is (0, then 1 after the first restart)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def layout_problem(config: G.GorilaConfig) -> str | None:
    """Why this torchrun job cannot run this layout, or None."""
    world = int(os.environ["WORLD_SIZE"])
    if world != config.world_size:
        parts = " + ".join(f"{n} {kind}{'s' if n != 1 else ''}" for n, kind in
                           ((config.shards, "shard"), (config.learners, "learner"), (config.actors, "actor")))
        return (f"torchrun started {world} ranks; this layout needs {config.world_size} ({parts}, ranks in that "
                "order): "
                f"--nproc-per-node {config.world_size} (× --nnodes) or another --actors/--learners/--shards")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        # Our ranks exec (a new process at the same pid): only a store hosted outside
        # every worker, torchrun's agent's, survives that and any rank's death.
        return "gorila needs torchrun's own store (TORCHELASTIC_USE_AGENT_STORE=True); start it with torchrun"
    return None


def agent_store(timeout: float) -> Any:
    """A client of torchrun's agent store (MASTER_ADDR:MASTER_PORT)."""

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout))


def attempt_store(base: Any, k: int) -> Any:
    """This attempt's keys: "finished", "stop", "ready" and gloo's addresses."""

    return dist.PrefixStore(f"popplay/gorila/attempt_{k}", base)


def all_arrived(store: Any, world: int, timeout: float) -> bool:
    """Count this rank in and wait (at most ``timeout`` seconds) for the others, so that
    gloo's rendezvous, which waits as long as its transport timeout, finds everyone."""
    store.add("arrived", 1)
    deadline = time.monotonic() + timeout
    while int(store.add("arrived", 0)) < world:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def start(config: G.GorilaConfig, out: Path, *, json_output: bool, progress_every: float,
          resume_state: dict[str, np.ndarray] | None, check_out: Callable[[Path], None],
          held: RunLock | None = None, before: Any = None) -> NoReturn:
    """This torchrun worker's part: connect, let rank 0 prepare the attempt, become the
    rank (``exec``). ``check_out(out)`` raises the CLI's error for an unusable ``--out``;
    rank 0 calls it unless this attempt continues the job's earlier ones. ``held``: the
    lock rank 0's command took before reading ``--resume``; ``before``: the stored run
    that ``--resume`` continues (its budget is the run's total, its curves go on)."""
    base = agent_store(config.timeout)
    k = attempt()
    store = attempt_store(base, k)
    me = rank()
    if me == 0:
        try:
            run_dir, locks = prepare(config, out, base, k, json_output=json_output, progress_every=progress_every,
                                     resume_state=resume_state, check_out=check_out, held=held, before=before)
        except BaseException as error:
            if isinstance(error, PopplayError):
                # The line first: once another worker exits, torchrun's agent stops this
                # one too, and the line raced with it (CI once saw none).
                print(error_line(error), file=sys.stderr)
                sys.stderr.flush()
                store.set("ready", "error")  # the others exit 2 too, without repeating the line
                os._exit(error.exit_code)
            store.set("ready", "error")
            raise
        # Rank 0 becomes shard 0, which writes OUT: the exec-ed program holds the locks
        # on until it wrote the run file (Rank0.conclude), so no second writer can start.
        for lock in locks:
            lock.keep_across_exec()
        store.set("ready", str(run_dir))
    else:
        try:
            store.wait(["ready"], datetime.timedelta(seconds=config.timeout))
        except RuntimeError:
            print(f"Error: gorila rank {me}: rank 0 did not prepare the run within --timeout {config.timeout:g}s",
                  file=sys.stderr, flush=True)
            os._exit(1)
        answer = store.get("ready").decode()
        if answer == "error":
            os._exit(2)  # rank 0 printed why
        run_dir = Path(answer)
    role = G.role_of(me, config)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "popplay.deep.topologies.gorila_ranks", f"{G.ROLE_PREFIX} {role}",
                              str(run_dir / "config.json")])


def _stored_before(run_dir: Path) -> G.StoredBefore | None:
    """The stored run a job's attempt continues (``--resume``), or None."""
    return G.StoredBefore.load(run_dir / BEFORE_FILE) if (run_dir / BEFORE_FILE).exists() else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_state(earlier: list[Path], config: G.GorilaConfig) -> dict[str, np.ndarray] | None:
    """The freshest parameters the earlier attempts left: the newest attempt whose shards
    all saved (each saves before serving anyone, then every ``checkpoint_every``
    gradients), else where that attempt started from."""
    for d in reversed(earlier):
        if all((d / f"shard-{s}.npz").exists() for s in range(config.shards)):
            try:
                return G.assemble_checkpoint(d, config)
            except (OSError, ValueError, KeyError):
                pass
        if (d / G.RESUME_FILE).exists():
            return G.load_npz(d / G.RESUME_FILE)
    return None


def prepare(config: G.GorilaConfig, out: Path, base: Any, k: int, *, json_output: bool, progress_every: float,
            resume_state: dict[str, np.ndarray] | None, check_out: Callable[[Path], None],
            held: RunLock | None = None, before: Any = None) -> tuple[Path, list[RunLock]]:
    """Rank 0: the directory of attempt ``k`` with its ``config.json`` (and ``resume.npz``),
    and the run-file locks it holds (``OUT``'s, taken before anything of it is touched,
    and ``held``)."""
    continuing = k > 0 and base.check([PREPARED])
    if continuing:
        out = Path(base.get(PREPARED).decode())
    locks = [held] if held is not None else []
    if held is None or resolve_output(held.path).absolute() != resolve_output(out).absolute():
        try:
            locks.append(RunLock(out).acquire())
        except LockBusy as error:
            raise UsageError(str(error)) from None
    try:
        return _prepare(config, out, base, k, continuing, json_output=json_output, progress_every=progress_every,
                        resume_state=resume_state, check_out=check_out, before=before), locks
    except BaseException:
        for lock in locks:
            lock.release()
        raise


def _prepare(config: G.GorilaConfig, out: Path, base: Any, k: int, continuing: bool, *, json_output: bool,
             progress_every: float, resume_state: dict[str, np.ndarray] | None,
             check_out: Callable[[Path], None], before: Any) -> Path:
    parts = G.parts_of(out)
    earlier = sorted((d for d in parts.glob("attempt-*") if d.is_dir() and d.name.split("-", 1)[1].isdigit()
                      and int(d.name.split("-", 1)[1]) < k), key=lambda d: int(d.name.split("-", 1)[1]))
    first = _read_json(earlier[0] / "config.json") if continuing and earlier else None
    if first is None or "torchrun" not in first:
        # A fresh job (or a restart of one that failed before rank 0 got this far).
        continuing, earlier = False, []
        check_out(out)
        G.make_parts(parts)
        started_at = time.time()
        carried = G.StoredBefore.of(before) if before is not None else None
        state, attempt_config, done = resume_state, config, False
    else:
        started_at = float(first["torchrun"]["started_at"])
        state = _last_state(earlier, config) or resume_state
        carried = _stored_before(earlier[0])
    if carried is not None or continuing:
        # The budget is the whole run's: what the stored run and earlier attempts played counts.
        steps, episodes = G.played(earlier, config)
        if carried is not None:
            steps, episodes = steps + carried.state_counters["env_steps"], episodes + carried.state_counters["episodes"]
        attempt_config, done = G.remaining(config, steps, episodes)
    run_dir = parts / f"attempt-{k}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    if carried is not None:
        carried.save(run_dir / BEFORE_FILE)
    if state is not None:
        attempt_config = G.stage_resume(attempt_config, run_dir, state)
    extras = {"torchrun": {"attempt": k, "out": str(out), "json": bool(json_output), "progress": progress_every,
                           "started_at": started_at, "earlier": [str(d) for d in earlier], "nothing_left": done,
                           "stored": config.to_dict()}}
    text = json.dumps({**attempt_config.to_dict(), **G.spaces(config), **extras}, indent=1)
    G.save_text(run_dir / "config.json", text)
    if continuing and state is not None:
        # OUT holds what this attempt starts from, before it can be lost in turn (every
        # shard of it starts at the checkpoint's version).
        write_partial(config, out, run_dir, earlier, started_at, before=carried, checkpoint={
            "params": state["params"], "accumulator": state["accumulator"], "version": np.int64(state["version"]),
            "shard_versions": np.full(config.shards, int(state["version"]), dtype=np.int64)})
    base.set(PREPARED, str(out))
    return run_dir


# --- on rank 0, once the rank runs ---------------------------------------------------------

class Rank0:
    """Rank 0's duties under torchrun: progress lines, ``OUT`` kept current, the end."""

    def __init__(self, config: G.GorilaConfig, run_dir: Path, extras: dict[str, Any], store: Any) -> None:
        self.stored = G.GorilaConfig.from_dict(extras["stored"])
        self.config = config
        self.run_dir = run_dir
        self.out = Path(extras["out"])
        self.json = bool(extras["json"])
        self.progress_every = float(extras["progress"])
        self.started_at = float(extras["started_at"])
        self.earlier = [Path(d) for d in extras["earlier"]]
        self.store = store
        self.next_progress = time.monotonic() + self.progress_every
        # A lost rank ends the attempt under torchrun; OUT is what is left if no restart follows.
        self.follow = G.OutFollower(self.out, run_dir, self.stored, self._write_partial, sys.stderr)
        self.locks = adopt_inherited()  # OUT's lock, taken before the exec (start)
        self.before = _stored_before(run_dir)

    def _write_partial(self, checkpoint: dict[str, np.ndarray]) -> None:
        write_partial(self.stored, self.out, self.run_dir, self.earlier, self.started_at, checkpoint,
                      before=self.before)

    def poll(self, own_version: int) -> None:
        """Called between the shard's waits (cheap unless something is due)."""
        now = time.monotonic()
        if self.progress_every > 0 and now >= self.next_progress:
            print(G.progress_line(self.stored, self.run_dir, [], self.earlier), file=sys.stderr, flush=True)
            self.next_progress = now + self.progress_every
        self.follow.poll(own_version)

    def conclude(self) -> int:
        """After every shard's last save: the run file and the summary; the exit code."""
        try:
            return self._conclude()
        finally:
            for lock in self.locks:
                lock.release()

    def _conclude(self) -> int:
        deadline = time.monotonic() + self.config.timeout
        while int(self.store.add("finished/shards", 0)) < self.config.shards:
            if time.monotonic() > deadline:
                print(f"Error: gorila: not every shard finished within --timeout {self.config.timeout:g}s; "
                      f"{self.out} holds the last checkpoint", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.05)
        stopped = bool(self.store.check(["stop"]))
        checkpoint = G.assemble_checkpoint(self.run_dir, self.stored)
        seconds = time.time() - self.started_at
        summary = G.continued(G.summarize(self.stored, self.run_dir, checkpoint, seconds, [], stopped,
                                          started_at=self.started_at, evaluate=not stopped, earlier=self.earlier,
                                          launch="torchrun"), self.before)
        summary["world_size"] = int(os.environ.get("WORLD_SIZE", "0") or 0)
        G.write_gorila_run(self.out, self.stored, self.run_dir, summary, self.earlier, checkpoint, before=self.before)
        shutil.rmtree(G.parts_of(self.out), ignore_errors=True)
        summary["out"] = str(self.out)
        summary.pop("run_dir", None)
        summary.pop("started_at", None)
        if self.json:
            print(json.dumps(summary, sort_keys=True))
        else:
            print(G.summary_text(summary, self.stored))
        sys.stdout.flush()
        if stopped:
            print(f"Stopped early; the run file {self.out} holds the state so far.", file=sys.stderr, flush=True)
            return 130
        return 0


def write_partial(config: G.GorilaConfig, out: Path, run_dir: Path, earlier: list[Path], started_at: float,
                  checkpoint: dict[str, np.ndarray], before: G.StoredBefore | None = None) -> None:
    """``OUT`` as an incomplete run file with ``checkpoint`` (no evaluation); ``before``:
    the stored run this job continues."""
    summary = G.summarize(config, run_dir, checkpoint, time.time() - started_at, [], True, started_at=started_at,
                          evaluate=False, earlier=earlier, launch="torchrun") \
        if all((run_dir / f"shard-{s}.npz").exists() for s in range(config.shards)) \
        else _bare_summary(config, run_dir, earlier, started_at)
    G.write_gorila_run(out, config, run_dir, G.continued(summary, before), earlier, checkpoint, before=before)


def _bare_summary(config: G.GorilaConfig, run_dir: Path, earlier: list[Path], started_at: float) -> dict[str, Any]:
    """What an attempt that has no shard files yet can say (its start, after a restart)."""
    steps, episodes = G.played(earlier, config)
    return {"topology": "gorila", "env_steps": steps, "episodes": episodes, "seconds": time.time() - started_at,
            "staleness_histogram": [0] * (config.max_staleness + 2), "lost": [], "server_versions": [],
            "complete": False, "started_at": started_at, "launch": "torchrun", "restarts": len(earlier)}

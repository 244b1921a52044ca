"""Gorila (Nair et al. 2015): actors, learners and a sharded parameter server
as separate processes, asynchronous, over c10d/gloo point-to-point messages.

Layout of a job of ``S + L + A`` ranks (bundled mode with local replay: actor ``a``
feeds learner ``a % L``, whose replay memory holds its actors' experience)::

    ranks 0 .. S-1            shard s: slice s of the flat parameter vector, AdaGrad
    ranks S .. S+L-1          learner l: replay, the agent's gradients, outlier guard
    ranks S+L .. S+L+A-1      actor a: own environment, own copy of the acting network

The agent (``--agent``: DQN, DDPG, TD3, any off-policy agent whose parameters offer a
:class:`~popplay.deep.agents.protocol.ServerAgent`) decides what the vector holds, the
gradient a learner computes and how an actor explores; nothing here names one.

Messages (tensors only, tags keep the streams apart; see :mod:`gorila_ranks`):

- client → shard: a request header ``[kind, version, sender, 0]`` (``PULL``: send me your
  slice; ``GRAD``: a gradient slice follows, computed from the shard's version
  ``version``); shard → client: ``[version, ...]`` then its slice.
- actor → learner: ``[n, env_steps, episodes, 0]`` then ``n`` transitions as one
  float32 block ``[obs, action, reward, next_obs, terminated]``.
- learner → learner (global replay): ``[rows, 0, 0, 0]``; the answer ``[rows, size, 0,
  0]`` then ``rows`` transitions drawn from the answering learner's part of the memory.

Control (who has finished, who was lost, stop) goes through the c10d ``TCPStore``
that this launcher hosts: the launcher, not a rank, is the one that sees a process
die (``waitpid``), and hosting the store here means no rank's death takes the
rendezvous with it. gloo cannot tell a pending receive that its peer died (the
receive just waits), so every rank polls the store between messages instead.

Its ranks are started, watched and ended by the one launcher every multi-process job
uses (:class:`popplay.distributed.launch.LocalRanks`: torchrun's variables, the role on
the command line, its own session, ranks stopped by a signal, every rank reaped on the
way out); what differs from :func:`popplay.distributed.launch.launch_local` is the
policy: that one stops the whole job when any rank is lost, by design; Gorila must keep
going without a lost actor or learner and stop only for a lost shard. Under
``torchrun`` itself the ranks are torchrun's workers (:mod:`gorila_torchrun`): its
agent hosts the store and ends the attempt when any rank is lost.

Each rank writes its own files into the run directory atomically (``shard-S.npz``:
the slice, accumulator, version and guard counts, every ``checkpoint_every`` applied
gradients; ``learner-L.npz``, ``actor-A.npz``: counters and curves); the launcher
assembles them into ``checkpoint.npz`` (the whole vector, resumable with any layout)
and the result. Nothing is pickled (``np.load(..., allow_pickle=False)``).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as c10d

from popplay.checkpoints.h5io import NoSpace, name_max
from popplay.checkpoints.runfile import NoSpaceError, RunFileError, write_run
from popplay.core.errors import EXIT_CANNOT_SAVE, EXIT_INTERRUPTED, EXIT_LOST
from popplay.deep import envs
from popplay.deep.envs.rollout import evaluate
from popplay.deep.topologies.gorila_params import SPEC, GorilaConfig  # noqa: F401  (SPEC: registered there)
from popplay.deep.topologies.population_params import mlp_parameters
from popplay.distributed.launch import PEER_LOST_EXIT, LocalRanks, describe_status, loopback_listener

ROLE_PREFIX = "popplay gorila"
_GRACE_SECONDS = 5.0  # after a shard is lost, how long the others may take to leave
FORMED_KEY = "formed"  # each rank counts itself in once its process group has formed


@dataclass(frozen=True)
class Role:
    kind: str  # "shard", "learner", "actor"
    index: int

    def __str__(self) -> str:
        return f"{self.kind} {self.index}"


def role_of(rank: int, config: GorilaConfig) -> Role:
    if rank < config.shards:
        return Role("shard", rank)
    if rank < config.shards + config.learners:
        return Role("learner", rank - config.shards)
    if rank < config.world_size:
        return Role("actor", rank - config.shards - config.learners)
    raise ValueError(f"rank {rank} is outside a job of {config.world_size}")


def shard_rank(s: int, config: GorilaConfig) -> int:
    return s


def learner_rank(l: int, config: GorilaConfig) -> int:
    return config.shards + l


def actor_rank(a: int, config: GorilaConfig) -> int:
    return config.shards + config.learners + a


def learners_of_actor(a: int, config: GorilaConfig) -> list[int]:
    """Where actor ``a``'s transitions may go, in order: its bundle's learner (``a mod L``)
    alone with local replay. With global replay the same learner first (it holds that
    part of the one distributed memory), then the others in turn: a lost learner's
    actors go on feeding the next live part of the store."""
    first = a % config.learners
    if config.replay == "global":
        return [(first + i) % config.learners for i in range(config.learners)]
    return [first]


def actors_of_learner(l: int, config: GorilaConfig) -> list[int]:
    return [a for a in range(config.actors) if l in learners_of_actor(a, config)]


def _share(total: int, a: int, parts: int) -> int:
    base, extra = divmod(total, parts)
    return base + (1 if a < extra else 0)


def actor_budget(a: int, config: GorilaConfig) -> tuple[int, int]:
    """Actor ``a``'s share of ``(env_steps, episodes)`` (0: no such budget)."""
    return _share(config.env_steps, a, config.actors), _share(config.episodes, a, config.actors)


# --- files ---------------------------------------------------------------------------

def save_npz(path: Path, **arrays: Any) -> None:
    """Write arrays atomically (a killed writer leaves the previous file whole)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: give back what the partial file took
        raise


def save_text(path: Path, text: str) -> None:
    """Write a text file atomically (ranks may read it while it is replaced)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def assemble_checkpoint(run_dir: Path, config: GorilaConfig) -> dict[str, np.ndarray]:
    """The whole parameter vector and accumulator from the shards' latest files."""
    parts = [load_npz(run_dir / f"shard-{s}.npz") for s in range(config.shards)]
    parts.sort(key=lambda p: int(p["start"]))
    return {
        "params": np.concatenate([p["params"] for p in parts]).astype(np.float32),
        "accumulator": np.concatenate([p["accumulator"] for p in parts]).astype(np.float32),
        "version": np.int64(max(int(p["version"]) for p in parts)),
        "shard_versions": np.array([int(p["version"]) for p in parts], dtype=np.int64),
        "hidden": np.array(config.hidden, dtype=np.int64),
    }


def spaces(config: GorilaConfig) -> dict[str, Any]:
    """The environment's spaces, measured once for every rank (JSON values); actions of
    the kind ``--agent`` cannot take are refused here (:class:`~popplay.deep.envs.EnvError`)."""

    env = envs.make_vector(config.env, 1)
    try:
        info = envs.describe(env, config.env)
    finally:
        env.close()
    if info.discrete != config.agent_params().discrete_actions:
        kind, theirs = ("discrete", "continuous") if not info.discrete else ("continuous", "discrete")
        raise envs.EnvError(f"--env {config.env}: --agent {config.agent} needs {kind} actions "
                            f"(this environment's are {theirs})")
    return {"obs_dim": info.obs_dim, "actions": info.actions, "action_dim": info.action_dim,
            "action_low": list(info.action_low), "action_high": list(info.action_high)}


def env_info(config: GorilaConfig, measured: dict[str, Any]) -> envs.EnvInfo:
    """:func:`spaces`' values (as a rank reads them back) as the agents take them."""
    actions = measured["actions"]
    return envs.EnvInfo(config.env, int(measured["obs_dim"]), None if actions is None else int(actions),
                        int(measured["action_dim"]), tuple(float(v) for v in measured["action_low"]),
                        tuple(float(v) for v in measured["action_high"]))


def vector_size(config: GorilaConfig, measured: dict[str, Any]) -> int:
    """The length of the agent's parameter vector, counted (not built: a crafted width
    in a damaged file stays cheap)."""
    shapes = config.agent_params().server_shapes(env_info(config, measured))
    return sum(mlp_parameters(n_in, n_out, config.hidden) for n_in, n_out in shapes)


# --- the launcher --------------------------------------------------------------------

class GorilaJobLost(RuntimeError):
    """A parameter-server shard was lost; the run stopped (checkpoint kept)."""

    def __init__(self, message: str, summary: dict[str, Any] | None = None,
                 checkpoint: dict[str, np.ndarray] | None = None, exit_code: int = EXIT_LOST) -> None:
        super().__init__(message)
        self.summary = summary or {}
        self.checkpoint = checkpoint  # the shards' last checkpoint, assembled
        self.exit_code = exit_code


def _describe(code: int) -> str:
    if code == PEER_LOST_EXIT:
        return "stopped: a peer it needs was lost"
    if code == EXIT_CANNOT_SAVE:
        return "could not save its files"
    return describe_status(code)


def run_gorila(config: GorilaConfig, run_dir: Path, *, should_stop: Callable[[], bool] | None = None,
               log: IO[str] | None = None, on_start: Callable[[dict[int, int]], None] | None = None,
               progress_every: float = 0.0, on_tick: Callable[[], None] | None = None,
               time_budget: float | None = None) -> dict[str, Any]:
    """Run a whole Gorila job as local processes; return the summary.

    Raises :class:`GorilaJobLost` (after writing ``checkpoint.npz``) when a shard dies;
    a lost actor or learner is reported in the summary's ``lost`` and the run goes on.
    ``should_stop`` is polled; once true every rank finishes what it holds and stops.
    ``on_tick`` is called between polls (cheap unless something is due).
    ``time_budget``: seconds after the ranks formed their group at which the job stops
    as a budget does (the run is complete), if the step or episode budget has not
    ended it first.
    """
    config.validate()
    if not (config.env_steps or config.episodes or time_budget):
        raise ValueError("a budget is needed: env_steps, episodes or a time budget")
    out = log if log is not None else sys.stderr
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    config_path.write_text(json.dumps({**config.to_dict(), **spaces(config)}, indent=1))
    procs = LocalRanks()
    lost: list[str] = []
    start = time.monotonic()
    started_at = time.time()
    next_progress = start + progress_every
    stop_sent = out_of_time = False
    stop_kill_at: float | None = None
    shard_lost: str | None = None
    kill_at: float | None = None
    try:
        for attempt in range(1, FORMATION_TRIES + 1):
            store, listener, procs = _start_ranks(config, config_path)
            problem = _formation_problem(store, procs, config, should_stop)
            if problem is None:
                break
            procs.close()
            if should_stop is not None and should_stop():
                raise GorilaJobLost("stopped on request while the ranks were forming their group; nothing was played",
                                    exit_code=EXIT_INTERRUPTED)
            if attempt == FORMATION_TRIES:
                raise GorilaJobLost(f"the ranks could not form their group ({problem}; {attempt} tries)")
            out.write(f"gorila: {problem} while the ranks were forming their group; starting them again\n")
            out.flush()
        if on_start is not None:
            on_start({p.rank: p.process.pid for p in procs})
        # The run's learning time (its seconds, its curves' clock, its time budget) starts
        # once the group has formed: starting processes and importing torch is not learning.
        learning_since, started_at = time.monotonic(), time.time()
        while True:
            for p in procs.newly_ended():
                code = p.exit_code
                # Finished or lost alike: whoever waits for this client stops waiting.
                if p.role.kind != "shard":
                    store.add("finished/clients", 1)
                if p.role.kind == "actor":
                    for l in learners_of_actor(p.role.index, config):
                        store.add(f"finished/actors-of-{l}", 1)
                if code != 0:
                    store.set(f"lost/{p.rank}", str(code))
                    why = p.why or _describe(code)
                    lost.append(f"{p.role} ({why})")
                    if (p.role.kind == "shard" or code == EXIT_CANNOT_SAVE) and shard_lost is None:
                        # A rank that cannot save (a full disk) ends the job as a lost
                        # shard does: the others' files would stop moving too.
                        shard_lost = f"{p.role} was lost ({why})"
                        store.set("stop", "shard lost")
                    elif shard_lost is None:
                        out.write(f"gorila: {p.role} lost ({why}); the run goes on\n")
                        out.flush()
            if all(p.exit_code is not None for p in procs):
                break
            # A rank stopped by a signal holds its peers' messages: lost, as if it had died.
            for frozen in procs.frozen(config.timeout):
                if frozen.why is None:
                    frozen.why = f"stopped by a signal (SIGSTOP?) for over {config.timeout:g}s"
                    frozen.process.kill()
            if stop_sent and shard_lost is None:
                # Every rank finishes what it holds on "stop"; one that is still here
                # long after (an actor whose last send hangs, up to --timeout) is killed,
                # clients first, so that the shards still see them finished and save.
                now = time.monotonic()
                if stop_kill_at is None:
                    stop_kill_at = now + 2 * config.timeout + _GRACE_SECONDS
                elif now > stop_kill_at:
                    stragglers = [p for p in procs if p.exit_code is None and p.process.poll() is None]
                    clients = [p for p in stragglers if p.role.kind != "shard"]
                    for p in clients or stragglers:
                        p.process.kill()
                    stop_kill_at = now + _GRACE_SECONDS
            if shard_lost is not None:
                # The survivors see "stop" (or a dead peer) and leave; the shards save
                # once more on the way out. Whoever is stuck in a wait is killed.
                if kill_at is None:
                    kill_at = time.monotonic() + min(config.timeout, _GRACE_SECONDS)
                elif time.monotonic() > kill_at:
                    procs.kill()
            if progress_every > 0 and time.monotonic() >= next_progress:
                out.write(progress_line(config, run_dir, lost) + "\n")
                out.flush()
                next_progress = time.monotonic() + progress_every
            if not stop_sent and time_budget and time.monotonic() - learning_since >= time_budget:
                store.set("stop", "time budget")
                stop_sent = out_of_time = True
            if not stop_sent and should_stop is not None and should_stop():
                store.set("stop", "requested")
                stop_sent = True
            if on_tick is not None:
                on_tick()
            time.sleep(0.05)
    finally:
        procs.close()
    seconds = time.monotonic() - learning_since
    try:
        checkpoint = assemble_checkpoint(run_dir, config)
    except OSError:  # a shard died before its first save (it saves before serving anyone)
        reason = shard_lost or "; ".join(f"{p.role}: {_describe(p.exit_code or 0)}" for p in procs
                                         if p.role.kind == "shard" and p.exit_code)
        raise GorilaJobLost(f"{reason or 'a shard wrote no checkpoint'}; stopped the job after {seconds:.1f} s "
                            "before any checkpoint was written") from None
    try:
        save_npz(run_dir / "checkpoint.npz", **checkpoint)
    except OSError as error:  # a full disk: the run file is written from the checkpoint in memory
        shard_lost = shard_lost or f"the job's checkpoint could not be saved ({error.strerror or error})"
    if shard_lost is not None:
        raise GorilaJobLost(f"{shard_lost}; stopped the job after {seconds:.1f} s; the last checkpoint "
                            f"(server version {int(checkpoint['version'])}) is {run_dir / 'checkpoint.npz'}",
                            summarize(config, run_dir, checkpoint, seconds, lost, stopped=True,
                                      started_at=started_at, evaluate=False), checkpoint)
    return summarize(config, run_dir, checkpoint, seconds, lost, stopped=stop_sent and not out_of_time,
                     started_at=started_at)


#: How often a job whose ranks lose one of them while forming their group (before any
#: step is played) is started again before it gives up.
FORMATION_TRIES = 3
#: The longest the ranks may take to form their group: as long as --timeout, but never
#: less than this, since six ranks importing torch on a loaded two-core machine take
#: tens of seconds (a rank that dies meanwhile is seen at once, whatever this is).
FORMATION_SECONDS = 60.0


def _start_ranks(config: GorilaConfig, config_path: Path) -> tuple[Any, Any, LocalRanks]:
    """A fresh store (on loopback; with the socket it serves on, which must stay open as
    long as the store) and every rank of the job, started."""
    world = config.world_size
    listener = loopback_listener(world + 1)  # local jobs listen on loopback only
    store = c10d.TCPStore("127.0.0.1", int(listener.getsockname()[1]), world + 1, is_master=True,
                          wait_for_workers=False, timeout=datetime.timedelta(seconds=config.timeout),
                          master_listen_fd=listener.fileno())
    procs = LocalRanks()
    for rank in range(world):
        role = role_of(rank, config)
        procs.start(rank, world, store.port, 1, "popplay.deep.topologies.gorila_ranks", f"{ROLE_PREFIX} {role}",
                    [str(config_path)], role=role, pipe_stderr=False)  # the ranks' lines go straight to the user
    return store, listener, procs


def _formation_problem(store: Any, procs: LocalRanks, config: GorilaConfig,
                       should_stop: Callable[[], bool] | None) -> str | None:
    """Wait until every rank has joined the group (None), or say why it will not: a
    rank that exited meanwhile (gloo's rendezvous would wait its long transport timeout
    for it), a stop request, or no group within the bound."""
    deadline = time.monotonic() + max(config.timeout, FORMATION_SECONDS)
    while int(store.add(FORMED_KEY, 0)) < len(procs):
        for p in procs:
            code = p.process.poll()
            if code is not None:
                return f"{p.role} was lost ({_describe(code)})"
        for p in procs.frozen(config.timeout):
            return f"{p.role} was stopped by a signal (SIGSTOP?) for over {config.timeout:g}s"
        if should_stop is not None and should_stop():
            return "stopped on request"
        if time.monotonic() > deadline:
            return f"not every rank joined within {max(config.timeout, FORMATION_SECONDS):g}s"
        time.sleep(0.05)
    return None


def _try_load(path: Path) -> dict[str, np.ndarray] | None:
    try:
        return load_npz(path)
    except (OSError, ValueError, KeyError):
        return None


def _all(dirs: Sequence[Path], kind: str, count: int) -> list[dict[str, np.ndarray]]:
    """The readable ``KIND-i.npz`` files of every directory (attempts oldest first)."""
    return [x for d in dirs for i in range(count) if (x := _try_load(Path(d) / f"{kind}-{i}.npz")) is not None]


def played(dirs: Sequence[Path], config: GorilaConfig) -> tuple[int, int]:
    """``(env_steps, episodes)`` the actors' files in ``dirs`` record as played."""
    actors = _all(dirs, "actor", config.actors)
    return sum(int(x["env_steps"]) for x in actors), sum(int(x["returns"].size) for x in actors)


def progress_line(config: GorilaConfig, run_dir: Path, lost: list[str], earlier: Sequence[Path] = ()) -> str:
    """One console line from the ranks' latest files (``earlier``: the directories of
    earlier attempts of a torchrun job, whose env-steps count too)."""
    actors = _all([*earlier, run_dir], "actor", config.actors)
    shards = _all([run_dir], "shard", config.shards)
    learners = _all([*earlier, run_dir], "learner", config.learners)
    steps = sum(int(x["env_steps"]) for x in actors)
    recent = np.concatenate([x["returns"][-20:] for x in actors]) if actors else np.zeros(0)
    version = min((int(x["version"]) for x in shards), default=0)
    stale = sum(int(x["discarded"]) for x in shards)
    outliers = sum(int(x["outliers"]) for x in learners)
    mean = f"{recent.mean():.1f}" if recent.size else "-"
    return (f"gorila: {steps:,} env-steps, return {mean}, server updates {version:,} (checkpointed), "
            f"stale dropped {stale}, outliers dropped {outliers}, lost {len(lost)}")


def episode_curve(run_dir: Path, config: GorilaConfig, started_at: float,
                  earlier: Sequence[Path] = ()) -> dict[str, np.ndarray]:
    """Every actor's episodes merged by the time they ended: return, actor, the env-steps
    summed over all actors up to then, and seconds since the start (``earlier``: earlier
    attempts' directories, whose episodes come first)."""
    rows = []
    for d, a in ((d, a) for d in [*earlier, run_dir] for a in range(config.actors)):
        data = _try_load(Path(d) / f"actor-{a}.npz")
        if data is None:
            continue
        n = data["returns"].size
        rows.append((data["ended_at"][:n], data["returns"], data["lengths"][:n], np.full(n, a, dtype=np.int64)))
    if not rows:
        return {"env_steps": np.zeros(0, np.int64), "return": np.zeros(0), "actor": np.zeros(0, np.int64),
                "seconds": np.zeros(0)}
    ended, returns, lengths, actor = (np.concatenate(parts) for parts in zip(*rows))
    order = np.argsort(ended, kind="stable")
    return {"env_steps": np.cumsum(lengths[order]).astype(np.int64), "return": returns[order].astype(np.float64),
            "actor": actor[order], "seconds": (ended[order] - started_at).astype(np.float64)}


def summarize(config: GorilaConfig, run_dir: Path, checkpoint: dict[str, np.ndarray], seconds: float,
              lost: list[str], stopped: bool, started_at: float = 0.0, evaluate: bool = True,
              earlier: Sequence[Path] = (), launch: str = "local") -> dict[str, Any]:
    """The run's summary from the ranks' files. ``earlier``: the directories of earlier
    attempts of a torchrun job (``--max-restarts``): their counts add in, so the
    summary covers the whole job; the parameters are ``checkpoint``'s."""
    dirs = [*earlier, run_dir]
    shards = [load_npz(run_dir / f"shard-{s}.npz") for s in range(config.shards)]
    shards_before = _all(earlier, "shard", config.shards)
    learners = _all(dirs, "learner", config.learners)
    actors = _all(dirs, "actor", config.actors)
    every_shard = shards + shards_before
    histogram = np.sum([s["staleness_histogram"] for s in every_shard], axis=0)
    env_steps = int(sum(int(a["env_steps"]) for a in actors))
    curve = episode_curve(run_dir, config, started_at, earlier)
    pulls = [sum(int(x["pulls"]) for d in dirs if (x := _try_load(Path(d) / f"shard-{s}.npz")) is not None)
             for s in range(config.shards)]
    returns = curve["return"]
    quality = evaluate_checkpoint(config, checkpoint) if evaluate else math.nan
    return {
        "topology": "gorila",
        "replay": config.replay,
        "env": config.env,
        "actors": config.actors, "learners": config.learners, "shards": config.shards,
        "quality": None if math.isnan(quality) else quality,
        "eval_episodes": config.eval_episodes,
        "env_steps": env_steps,
        "episodes": int(returns.size),
        "return": float(returns[-100:].mean()) if returns.size else None,
        "seconds": seconds,
        "env_steps_per_second": env_steps / seconds if seconds > 0 else 0.0,
        "server_versions": checkpoint["shard_versions"].tolist(),
        "gradients_applied": int(sum(int(s["accepted"]) for s in every_shard)),
        "stale_discarded": int(sum(int(s["discarded"]) for s in every_shard)),
        "staleness_histogram": histogram.tolist(),
        "outliers_discarded": int(sum(int(x["outliers"]) for x in learners)),
        "learner_updates": int(sum(int(x["updates"]) for x in learners)),
        "gradients_sent": int(sum(int(x["sent"]) for x in learners)),
        "pulls_per_shard": pulls,
        "transitions_received": int(sum(int(x["received"]) for x in learners)),
        # Global replay: minibatch rows fetched from other learners' parts of the store.
        "replay_rows_remote": int(sum(int(x["remote_rows"]) for x in learners if "remote_rows" in x)),
        "lost": lost,
        "launch": launch,  # "local" (this launcher) or "torchrun"
        "restarts": len(earlier),  # attempts of a torchrun job that a lost rank ended
        "complete": not stopped and not lost,
        "started_at": started_at,
        "run_dir": str(run_dir),
    }


def summary_text(summary: dict[str, Any], config: GorilaConfig) -> str:
    """The console's one-line account of a finished run (``--json`` prints the summary)."""
    quality = "not measured" if summary["quality"] is None else f"{summary['quality']:.1f}"
    def counted(n: int, noun: str) -> str:
        return f"{n} {noun}" + ("" if n == 1 else "s")

    restarts = f" and {counted(summary['restarts'], 'restart')}" if summary.get("restarts") else ""
    return (f"gorila on {summary['env']} ({counted(config.actors, 'actor')}, {counted(config.learners, 'learner')}, "
            f"{counted(config.shards, 'shard')}{restarts}): quality {quality} (mean of {config.eval_episodes} greedy episodes) after "
            f"{summary['episodes']:,} episodes, {summary['env_steps']:,} env-steps in {summary['seconds']:.1f}s; "
            f"{summary['gradients_applied']:,} gradient slices applied, {summary['stale_discarded']} stale and "
            f"{summary['outliers_discarded']} outlier gradients dropped; staleness histogram "
            f"{summary['staleness_histogram']}; wrote {summary['out']}")


def evaluate_checkpoint(config: GorilaConfig, checkpoint: dict[str, np.ndarray]) -> float:
    """Mean return of the checkpoint's noiseless policy (greedy on Q for DQN)."""
    returns = greedy_returns(config, checkpoint["params"], config.eval_episodes, config.seed)
    return float(returns.mean()) if returns.size else float("nan")


def greedy_returns(config: GorilaConfig, params: np.ndarray, episodes: int, seed: int) -> np.ndarray:
    if episodes == 0:
        return np.zeros(0)
    env = envs.make_vector(config.env, 1)
    try:
        agent = config.agent_params().server_agent(envs.describe(env, config.env))
        return evaluate(env, agent.greedy(torch.as_tensor(np.asarray(params, dtype=np.float32))), episodes, seed)
    finally:
        env.close()


# --- run files -------------------------------------------------------------------------

DOMAIN = "gorila"


PARTS_SUFFIX = ".parts"


def parts_of(out: Path) -> Path:
    """The working directory of the Gorila run writing ``out``."""
    return out.with_name(out.name + PARTS_SUFFIX)


def parts_name_problem(out: Path) -> str | None:
    """Why ``out`` cannot have its working directory beside it (a name the file system
    takes for the run file but not with ``.parts`` added); None if it can."""
    longest = name_max(out.parent if str(out.parent) else Path(".")) - len(PARTS_SUFFIX.encode())
    if len(out.name.encode()) > longest:
        return (f"--out {out}: the name is too long for Gorila's working directory beside it "
                f"({len(out.name.encode())} bytes; at most {longest} here)")
    return None


def train_gorila(config: GorilaConfig, out: Path, *, resume_state: dict[str, np.ndarray] | None = None,
                 should_stop: Callable[[], bool] | None = None, log: IO[str] | None = None,
                 progress_every: float = 0.0, before: Any = None, time_budget: float | None = None,
                 scalar_log: Any = None) -> dict[str, Any]:
    """:func:`run_gorila` into a run file ``out`` (domain ``gorila``; the ranks' files
    live in ``OUT.parts/`` while it runs). ``resume_state``: a run file's state (the
    parameter vector and accumulator), taken up with this config's layout. ``before``:
    the stored run it continues: its budget is the run's total (only what is left is
    played), and its counts and curves go on from the stored ones. A lost shard still
    writes the run file (incomplete) before :class:`GorilaJobLost` propagates.
    ``time_budget``: the run's total learning seconds (``before``'s included);
    ``scalar_log``: a :class:`~popplay.checkpoints.scalars.ScalarLog` that follows the
    curves whenever the run file is written."""

    out = Path(out)
    parts = parts_of(out)
    total = config
    if before is not None:
        config, _ = remaining(config, *played_before(before))
    try:
        make_parts(parts)
        if resume_state is not None:
            config = stage_resume(config, parts, resume_state)
    except OSError as error:  # a full disk before anything ran
        shutil.rmtree(parts, ignore_errors=True)
        raise GorilaJobLost(f"cannot write the working files in {parts} ({error.strerror or error})") from None
    started_at = time.time()

    def write(summary: dict[str, Any], checkpoint: dict[str, np.ndarray] | None = None) -> None:
        curve = write_gorila_run(out, total, parts, summary, checkpoint=checkpoint, before=before,
                                 time_budget=time_budget)
        if scalar_log is not None:
            stopped = scalar_log.follow(curve["agent_steps"], curve["seconds"], {"return": curve["return"]})
            if stopped is not None:  # the run goes on
                (log if log is not None else sys.stderr).write(f"gorila: {stopped}\n")

    def write_partial(checkpoint: dict[str, np.ndarray]) -> None:
        summary = summarize(config, parts, checkpoint, time.time() - started_at, [], True, started_at=started_at,
                            evaluate=False)
        write(continued(summary, before), checkpoint)

    follow = OutFollower(out, parts, config, write_partial, log if log is not None else sys.stderr, first_after=1.0)

    def write_final(summary: dict[str, Any], reason: str, checkpoint: dict[str, np.ndarray] | None = None) -> None:
        """The run file from the job's last checkpoint; on a full disk the file keeps
        what it last held (written atomically) and the job ends with one line."""
        try:
            write(summary, checkpoint)
        except (NoSpace, NoSpaceError):
            shutil.rmtree(parts, ignore_errors=True)  # its newest files cannot be kept: give the space back
            if follow.in_file is not None:
                held = f"still holds the checkpoint of server version {follow.in_file}"
            else:
                held = "still holds the run as it was before this job" if out.exists() else "was not written"
            raise GorilaJobLost(f"{reason}no space left on device: the run file {out} {held}") from None
        shutil.rmtree(parts, ignore_errors=True)

    try:
        learned = float(before.attrs.get("learning_seconds", 0.0)) if before is not None else 0.0
        summary = run_gorila(config, parts, should_stop=should_stop, log=log, on_start=None,
                             progress_every=progress_every, on_tick=follow.poll,
                             time_budget=None if time_budget is None else time_budget - learned)
    except GorilaJobLost as error:
        if not error.summary:  # nothing to keep
            shutil.rmtree(parts, ignore_errors=True)
            raise
        reason = str(error).split("; the last checkpoint")[0]
        write_final(continued(error.summary, before), f"{reason}; ", error.checkpoint)
        version = int(error.summary["server_versions"] and max(error.summary["server_versions"]))
        raise GorilaJobLost(f"{reason}; the run file {out} holds the last checkpoint (server version {version})",
                            error.summary) from None
    summary = continued(summary, before)
    write_final(summary, "")
    summary["out"] = str(out)
    summary.pop("run_dir", None)
    return summary


def remaining(config: GorilaConfig, steps: int, episodes: int) -> tuple[GorilaConfig, bool]:
    """The budget left after ``steps``/``episodes`` were played; True when nothing is.
    Every actor gets at least one step or episode of what is left (an actor's share
    of 0 would mean "no budget"), so a continuation may overshoot by fewer than ``actors``."""
    changes: dict[str, int] = {}
    done = False
    if config.env_steps:
        left = config.env_steps - steps
        done = done or left <= 0
        changes["env_steps"] = max(left, config.actors)
    if config.episodes:
        left = config.episodes - episodes
        done = done or left <= 0
        changes["episodes"] = max(left, config.actors)
    return dataclasses.replace(config, **changes), done


#: The file that marks a ``.parts`` directory as Gorila's own working files: any other
#: directory by that name is the user's, and is never removed.
PARTS_MARK = ".popplay-gorila"


def clear_parts(parts: Path) -> None:
    """Remove a previous run's working files; refuse (one line) a directory by that name
    that Gorila did not make."""
    if not parts.exists() and not parts.is_symlink():
        return
    if parts.is_symlink() or not parts.is_dir() or not (parts / PARTS_MARK).is_file():
        raise RunFileError(f"{parts} exists and holds no popplay gorila working files; move it away "
                           "(popplay never removes what it did not make)")
    shutil.rmtree(parts)


class OutFollower:
    """Keeps ``OUT`` an incomplete run file with the newest shard checkpoint while a job
    runs (at most every 2 s), so that a job lost anywhere (its launcher killed, under
    torchrun its last restart spent) leaves a file ``--resume`` continues.
    ``write(checkpoint)`` writes it; a failure (a full disk) is said once, and the
    shards' own files stand."""

    def __init__(self, out: Path, parts: Path, config: GorilaConfig, write: Callable[[dict[str, np.ndarray]], None],
                 log: IO[str], first_after: float = 0.0) -> None:
        self.out, self.parts, self.config, self.write, self.log = out, parts, config, write, log
        self.next_write = time.monotonic() + first_after
        self.written = -1
        self.failed = False
        self.in_file: int | None = None  # the server version OUT holds (None: none written by this job)

    def poll(self, version: int | None = None) -> None:
        """Called between waits (cheap unless a write is due); ``version``: the newest
        shard version the caller knows of (None: read it from the shards' files)."""
        now = time.monotonic()
        if now < self.next_write or (version is not None and version <= self.written):
            return
        self.next_write = now + 2.0
        try:
            checkpoint = assemble_checkpoint(self.parts, self.config)
        except (OSError, ValueError, KeyError):
            return  # a shard's first file is not there yet
        newest = int(checkpoint["version"]) if version is None else version
        if newest == self.written:
            return
        try:
            self.write(checkpoint)
            self.in_file = newest
        except Exception as error:  # e.g. a full disk: say so once; the shards' files stand
            if not self.failed:
                self.log.write(f"gorila: could not update {self.out} ({type(error).__name__}: {error}); the "
                               f"checkpoint stays in {self.parts}\n")
                self.log.flush()
            self.failed = True
        self.written = newest


def make_parts(parts: Path) -> None:
    """A fresh working directory ``OUT.parts``, marked as Gorila's own (a previous run's
    is removed; a directory Gorila did not make is refused)."""
    clear_parts(parts)
    parts.mkdir(parents=True)
    save_text(parts / PARTS_MARK, "popplay gorila working files\n")


RESUME_FILE = "resume.npz"


def stage_resume(config: GorilaConfig, directory: Path, state: dict[str, np.ndarray]) -> GorilaConfig:
    """``config`` starting its shards from ``state`` (parameters, accumulator, version),
    saved in ``directory`` where the ranks read it."""
    path = directory / RESUME_FILE
    save_npz(path, **{name: state[name] for name in ("params", "accumulator", "version")})
    return _replace(config, resume=str(path))


def played_before(before: Any) -> tuple[int, int]:
    """(env-steps, episodes) a stored run has played."""
    return int(before.state_counters["env_steps"]), int(before.state_counters["episodes"])


@dataclass(frozen=True)
class StoredBefore:
    """What a continuation needs of the stored run it continues (``before`` of
    :func:`train_gorila` and :func:`write_gorila_run`), carried in a file across a
    torchrun worker's ``exec``: its counters, curves and learning seconds."""

    state_counters: dict[str, int]
    curves: dict[str, np.ndarray]
    attrs: dict[str, float]

    def save(self, path: Path) -> None:
        save_npz(path, **{f"curve/{k}": v for k, v in self.curves.items()},
                 env_steps=self.state_counters["env_steps"], episodes=self.state_counters["episodes"],
                 learning_seconds=float(self.attrs.get("learning_seconds", 0.0)))

    @classmethod
    def of(cls, stored: Any) -> "StoredBefore":
        steps, episodes = played_before(stored)
        return cls({"env_steps": steps, "episodes": episodes}, dict(stored.curves),
                   {"learning_seconds": float(stored.attrs.get("learning_seconds", 0.0))})

    @classmethod
    def load(cls, path: Path) -> "StoredBefore":
        data = load_npz(path)
        return cls({"env_steps": int(data["env_steps"]), "episodes": int(data["episodes"])},
                   {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith("curve/")},
                   {"learning_seconds": float(data["learning_seconds"])})


def continued(summary: dict[str, Any], before: Any) -> dict[str, Any]:
    """A continuation's summary counted over the whole run (rates stay this part's)."""
    if before is None:
        return summary
    steps, episodes = played_before(before)
    return {**summary, "env_steps": summary["env_steps"] + steps, "episodes": summary["episodes"] + episodes}


def _replace(config: GorilaConfig, **changes: Any) -> GorilaConfig:
    return dataclasses.replace(config, **changes)


def write_gorila_run(out: Path, config: GorilaConfig, parts: Path, summary: dict[str, Any],
                     earlier: Sequence[Path] = (), checkpoint: dict[str, np.ndarray] | None = None,
                     before: Any = None, time_budget: float | None = None) -> dict[str, np.ndarray]:
    """The run file from the ranks' files in ``parts`` (and earlier attempts' in
    ``earlier``) and the checkpoint (default: ``parts/checkpoint.npz``); ``before``: the
    stored run this one continues, whose curves come first. The curves' x-axis is
    ``agent_steps`` (every actor's env-steps up to then), as in every run file; they are
    returned as written."""

    if checkpoint is None:
        checkpoint = load_npz(parts / "checkpoint.npz")
    started = float(summary.get("started_at", 0.0))
    curve = episode_curve(parts, config, started, earlier)
    curve = {"agent_steps": curve.pop("env_steps"), **curve}
    learning_seconds = float(summary["seconds"])
    if before is not None:
        old = dict(before.curves)
        old_steps = np.asarray(old.pop("agent_steps", old.pop("env_steps", np.zeros(0))), dtype=np.int64)
        old_seconds = float(before.attrs.get("learning_seconds", 0.0))
        offsets = {"agent_steps": played_before(before)[0], "seconds": old_seconds}
        old["agent_steps"] = old_steps
        curve = {k: np.concatenate([np.asarray(old.get(k, np.zeros(0)), dtype=v.dtype), v + offsets.get(k, 0)])
                 for k, v in curve.items()}
        learning_seconds += old_seconds
    stored = {k: v for k, v in config.to_dict().items() if k != "resume"}
    if time_budget is not None:
        stored["time_budget"] = time_budget  # as every run file keeps it: a resume goes on under it
    scalars = {k: v for k, v in summary.items()
               if isinstance(v, (int, float, bool, str)) and v is not None and k not in ("run_dir",)}
    write_run(out, domain=DOMAIN, config=stored,
              state={"params": checkpoint["params"], "accumulator": checkpoint["accumulator"],
                     "shard_versions": checkpoint["shard_versions"]},
              state_counters={"version": int(checkpoint["version"]), "env_steps": int(summary["env_steps"]),
                              "episodes": int(summary["episodes"])},
              static={}, curves=curve,
              results={"staleness_histogram": np.asarray(summary["staleness_histogram"], dtype=np.int64)},
              result_attrs={**scalars, "lost": json.dumps(summary["lost"]),
                            "server_versions": json.dumps(summary["server_versions"])},
              attrs={"learning_seconds": learning_seconds}, complete=bool(summary["complete"]))
    return curve


def check_stored(config: GorilaConfig, state: dict[str, Any], counters: dict[str, Any]) -> None:
    """Refuse a stored Gorila state that does not fit its own config (ValueError, one
    line): the parameter vector and accumulator of exactly the network's size, finite,
    the accumulator positive; counters non-negative integers."""
    size = vector_size(config, spaces(config))
    for name in ("params", "accumulator"):
        value = state.get(name)
        if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or value.shape != (size,):
            shape = getattr(value, "shape", None)
            raise ValueError(f"{name} must be {size} floats for this network (got {shape})")
        if not np.isfinite(value).all():
            raise ValueError(f"non-finite values in {name}")
    if not bool((state["accumulator"] > 0).all()):
        raise ValueError("the AdaGrad accumulator must be positive")
    for name in ("version", "env_steps", "episodes"):
        value = counters.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"counter {name} must be a non-negative integer (got {value!r})")


@dataclass
class GorilaState:
    params: np.ndarray
    version: int
    env_steps: int
    episodes: int
    returns: np.ndarray


class GorilaExperiment:
    """What ``popplay evaluate`` needs of a Gorila run file (the registry's interface)."""

    def __init__(self, params: GorilaConfig, backend: Any = None) -> None:
        self.params = params

    def restore(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> GorilaState:
        check_stored(self.params, arrays, counters)
        return GorilaState(np.asarray(arrays["params"], dtype=np.float32), int(counters["version"]),
                           int(counters["env_steps"]), int(counters["episodes"]), np.zeros(0))

    def returns_of_greedy(self, state: GorilaState, episodes: int, seed: int) -> np.ndarray:
        return greedy_returns(self.params, state.params, episodes, seed)

    def summary_extras(self, state: GorilaState) -> dict[str, Any]:
        return {"server_version": state.version}

"""The three kinds of Gorila processes (see :mod:`popplay.deep.topologies.gorila`).

``python -m popplay.deep.topologies.gorila_ranks "popplay gorila actor 2" RUN_DIR/config.json``:
the role is an argument so that ``ps`` shows it; the rank and the rendezvous come
from torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
Started by the local launcher (:func:`gorila.run_gorila`), or ``exec``-ed by a torchrun
worker once its rank 0 prepared the attempt (``config.json`` then has a ``torchrun``
entry; :mod:`gorila_torchrun`): there the ranks announce their own finish and rank 0
writes the run file, as nobody else is left to.

Only tensors travel (``dist.send``/``dist.recv``, gloo). Every receive names its
source and runs in a thread of its own (one per client on a shard, one per actor on a
learner), so that the main thread can poll the launcher's store. Three facts of gloo
(torch 2.x) shape this: ``Work.is_completed()`` of a receive stays false, so nothing can
be polled; a wait that times out closes every pair of its group for good (later
operations on any of them fail at once), which is why transitions travel in groups of
their own, one per actor-learner pair (:func:`transition_channels`); and a receive from
*any* source fails as soon as any one peer has died, so one lost actor would deafen a
shard that listened that way.
"""
from __future__ import annotations

import datetime
import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from popplay.core.errors import EXIT_CANNOT_SAVE, show_warnings_plainly
from popplay.core.hooks import hook
from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.adagrad_shard import AdaGradShard, shard_bounds
from popplay.deep.agents.replay import Batch, ReplayBuffer, batch_rows, episode_rows, rows_batch, transition_width
from popplay.deep.envs.rollout import episode_seed, play_episodes
from popplay.deep.topologies import gorila as G
from popplay.deep.topologies import gorila_torchrun as T
from popplay.deep.topologies.gorila_guards import OutlierGuard, StalenessGuard
from popplay.deep.topologies.gorila_torchrun import ATTEMPT_STRIDE
from popplay.distributed.group import die_with_parent

PULL, GRAD = 1, 2
TAG_REQ, TAG_GRAD, TAG_REPLY_HDR, TAG_REPLY, TAG_TRANS_HDR, TAG_TRANS = 11, 12, 13, 14, 15, 16
TAG_SAMPLE_REQ, TAG_SAMPLE_HDR, TAG_SAMPLE = 17, 18, 19  # learner ↔ learner: global replay
_POLL = 0.05


class _Stop(Exception):
    pass


class _PeerLost(RuntimeError):
    """Every learner this actor may feed is gone: a loss even while the job stops."""


def _send_within(tensor: torch.Tensor, dst: int, tag: int, seconds: float, group: Any) -> None:
    """``dist.send`` that gives up after ``seconds``: a send to a learner killed at the
    wrong moment was seen to wait for ever (gloo noticed nothing), holding the actor and
    with it the end of the job. The learner's receive thread is always waiting, so a live
    learner takes a chunk at once. A wait that times out closes every pair of ``group``:
    it must be this actor-learner pair's own (:func:`transition_channels`)."""
    dist.isend(tensor, dst=dst, tag=tag, group=group).wait(datetime.timedelta(seconds=seconds))


def transition_channels(config: G.GorilaConfig, rank: int) -> dict[int, Any]:
    """The gloo groups that carry transitions from actors to learners, one per pair,
    keyed by the peer's rank (empty on a shard). Every rank must call this, in step.

    A wait that times out in gloo closes every pair of its group, and an actor's send to
    a learner lost mid-chunk can only end by timing out. On the world group that would
    also cut the actor off from the next learner of a global replay and from its shards;
    in a group of its own it closes only the lost learner's channel.
    """
    channels: dict[int, Any] = {}
    timeout = datetime.timedelta(seconds=transport_timeout(config))
    # Forming a group waits for both of its members; one order on every rank means no
    # two members ever wait for each other in different groups.
    for a in range(config.actors):
        for l in sorted(G.learners_of_actor(a, config)):
            pair = [G.actor_rank(a, config), G.learner_rank(l, config)]
            group = dist.new_group(pair, timeout=timeout, backend="gloo")
            if rank in pair:
                channels[pair[1] if rank == pair[0] else pair[0]] = group
    return channels


class Context:
    def __init__(self, config: G.GorilaConfig, run_dir: Path, rank: int, store: Any,
                 measured: dict[str, Any] | None = None, torchrun: dict[str, Any] | None = None,
                 channels: dict[int, Any] | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.rank = rank
        self.role = G.role_of(rank, config)
        self.store = store
        self.torchrun = torchrun  # None: the local launcher's job
        self.attempt = int(torchrun["attempt"]) if torchrun else 0
        # A restart after the actors had played the whole budget: nothing to play, only
        # the end (the checkpoint, the evaluation, the run file) is left to do.
        self.nothing_left = bool(torchrun and torchrun.get("nothing_left"))
        self.rank0: Any = None  # gorila_torchrun.Rank0 on rank 0 under torchrun
        # The launcher measured the spaces once: shards and learners need no environment.
        self.info = G.env_info(config, G.spaces(config) if measured is None else measured)
        self.agent = config.agent_params().server_agent(self.info)
        self.initial = self.agent.initial()
        self.bounds = shard_bounds(self.initial.numel(), config.shards)
        self.row_width = transition_width(self.info.obs_dim, self.agent.action_dim)
        self.channels = channels or {}  # actor <-> learner groups, by peer rank (transition_channels)

    def rows_batch(self, block: torch.Tensor) -> Batch:
        return rows_batch(block, self.info.obs_dim, discrete=self.agent.discrete)

    def stop_requested(self) -> bool:
        return bool(self.store.check(["stop"]))

    def stream(self, base: int) -> int:
        """A seed or stream id of this attempt: a restarted rank must not replay the
        previous attempt's episodes and draws (attempt 0: ``base`` itself)."""

        return base + ATTEMPT_STRIDE * self.attempt

    def finished(self, key: str) -> int:
        return int(self.store.add(key, 0))


# --- shard ------------------------------------------------------------------------------

def _save(ctx: Context, path: Path, **arrays: Any) -> None:
    """Save this rank's file; if it cannot (a full disk), say so in one line and leave at once
    (from whichever thread saves), so that the launcher ends the job within its grace
    time instead of the others waiting on a rank whose files stopped moving."""
    try:
        G.save_npz(path, **arrays)
    except OSError as error:
        print(f"gorila {ctx.role}: cannot save {path.name} ({error.strerror or error})", file=sys.stderr, flush=True)
        os._exit(EXIT_CANNOT_SAVE)


def run_shard(ctx: Context) -> int:
    config, s = ctx.config, ctx.role.index
    start, stop = ctx.bounds[s]
    vector, version = ctx.initial, 0
    accumulator = None
    if config.resume:
        ck = G.load_npz(Path(config.resume))
        if ck["params"].shape != tuple(ctx.initial.shape):
            raise ValueError(f"checkpoint holds {ck['params'].size} parameters; this network has {ctx.initial.numel()}")
        vector = torch.as_tensor(ck["params"])
        accumulator = torch.as_tensor(ck["accumulator"][start:stop]).clone()
        version = int(ck["version"])
    shard = AdaGradShard.from_vector(vector, start, stop, config.lr, config.adagrad_eps, config.initial_accumulator)
    if accumulator is not None:
        shard.accumulator = accumulator
        shard.version = version
    guard = StalenessGuard(config.max_staleness)
    lock = threading.Lock()
    counts = {"pulls": 0, "errors": 0, "saved": 0}
    path = ctx.run_dir / f"shard-{s}.npz"

    def save() -> None:
        _save(ctx, path, params=shard.params.numpy(), accumulator=shard.accumulator.numpy(),
                   version=np.int64(shard.version), start=np.int64(start), stop=np.int64(stop),
                   staleness_histogram=guard.histogram, accepted=np.int64(guard.accepted),
                   discarded=np.int64(guard.discarded), pulls=np.int64(counts["pulls"]))
        counts["saved"] = guard.accepted

    save()

    def serve(src: int) -> None:
        """Answer one client, message after message, until it is gone."""
        header = torch.zeros(4, dtype=torch.int64)
        grad = torch.zeros(stop - start, dtype=torch.float32)
        while True:
            try:
                dist.recv(header, src=src, tag=TAG_REQ)
                kind = int(header[0])
                if kind == GRAD:
                    dist.recv(grad, src=src, tag=TAG_GRAD)
                    with lock:
                        if guard.admit(shard.version, int(header[1])):
                            shard.apply(grad)
                            if guard.accepted - counts["saved"] >= config.checkpoint_every:
                                save()
                elif kind == PULL:
                    with lock:
                        reply = torch.tensor([shard.version, 0, 0, 0], dtype=torch.int64)
                        params = shard.params.clone()
                        counts["pulls"] += 1
                    dist.send(reply, dst=src, tag=TAG_REPLY_HDR)
                    dist.send(params, dst=src, tag=TAG_REPLY)
            except RuntimeError:  # this client vanished (its pair is closed): serve the others
                with lock:
                    counts["errors"] += 1
                return

    clients = config.learners + config.actors
    for client in range(config.shards, config.shards + clients):
        threading.Thread(target=serve, args=(client,), daemon=True).start()
    while ctx.finished("finished/clients") < clients:
        if ctx.rank0 is not None:
            ctx.rank0.poll(counts["saved"])
        time.sleep(_POLL)
    with lock:
        save()
    return 0


# --- learner ----------------------------------------------------------------------------

def _pull(ctx: Context, flat: torch.Tensor) -> list[int]:
    """Every shard's slice into ``flat``; returns the shards' versions."""
    versions = []
    reply = torch.zeros(4, dtype=torch.int64)
    request = torch.tensor([PULL, 0, ctx.rank, 0], dtype=torch.int64)
    for s, (a, b) in enumerate(ctx.bounds):
        dist.send(request, dst=G.shard_rank(s, ctx.config), tag=TAG_REQ)
        dist.recv(reply, src=G.shard_rank(s, ctx.config), tag=TAG_REPLY_HDR)
        part = torch.empty(b - a, dtype=torch.float32)
        dist.recv(part, src=G.shard_rank(s, ctx.config), tag=TAG_REPLY)
        flat[a:b] = part
        versions.append(int(reply[0]))
    return versions


class _GlobalReplay:
    """One replay memory distributed over the learners (``--replay global``).

    Learner ``l`` holds the part its actors feed (``replay``, guarded by ``lock``) and
    draws each minibatch from the whole memory: the rows' owners are drawn in proportion
    to the parts' sizes, its own rows come from its part, the others' from their owners.
    Per peer, a server thread answers that peer's requests (rows drawn uniformly from
    this part, with its size) and a client thread carries this learner's requests to it,
    so the main thread never sits in a gloo receive: it waits on a queue and watches the
    store for the peer's loss. Every request goes to every live peer, asking 0 rows when
    none are wanted, so each reply refreshes the size the next draw weighs.
    """

    def __init__(self, ctx: "Context", replay: Any, lock: threading.Lock, sampler: torch.Generator) -> None:
        self.ctx, self.replay, self.lock, self.sampler = ctx, replay, lock, sampler
        config, l = ctx.config, ctx.role.index
        self.peers = [j for j in range(config.learners) if j != l]
        self.known = dict.fromkeys(self.peers, 0)  # each peer's part, as its last reply said
        self.requests: dict[int, queue.Queue] = {j: queue.Queue() for j in self.peers}
        self.replies: dict[int, queue.Queue] = {j: queue.Queue() for j in self.peers}
        self.lost: set[int] = set()
        self.remote_rows = 0
        self.width = ctx.row_width
        for j in self.peers:
            serving = networks.generator(ctx.stream(config.seed * 7919 + 104_729 * (l + 1) + j))
            threading.Thread(target=self._serve, args=(j, serving), daemon=True).start()
            threading.Thread(target=self._client, args=(j,), daemon=True).start()

    def _serve(self, j: int, serving: torch.Generator) -> None:
        """Rows of this part for peer ``j``, request after request, until it is done or gone."""
        peer = G.learner_rank(j, self.ctx.config)
        header = torch.zeros(4, dtype=torch.int64)
        while True:
            try:
                dist.recv(header, src=peer, tag=TAG_SAMPLE_REQ)
                wanted = int(header[0])
                if wanted < 0:
                    return
                with self.lock:
                    size = len(self.replay)
                    rows = wanted if size else 0
                    block = batch_rows(self.replay.sample(rows, serving)) if rows else None
                dist.send(torch.tensor([rows, size, 0, 0], dtype=torch.int64), dst=peer, tag=TAG_SAMPLE_HDR)
                if block is not None:
                    dist.send(block, dst=peer, tag=TAG_SAMPLE)
            except RuntimeError:
                return

    def _client(self, j: int) -> None:
        peer = G.learner_rank(j, self.ctx.config)
        header = torch.zeros(4, dtype=torch.int64)
        while True:
            wanted = self.requests[j].get()
            try:
                dist.send(torch.tensor([wanted, 0, 0, 0], dtype=torch.int64), dst=peer, tag=TAG_SAMPLE_REQ)
                if wanted < 0:
                    return
                dist.recv(header, src=peer, tag=TAG_SAMPLE_HDR)
                rows, size = int(header[0]), int(header[1])
                block = torch.empty(rows, self.width, dtype=torch.float32)
                if rows:
                    dist.recv(block, src=peer, tag=TAG_SAMPLE)
                self.replies[j].put((size, block))
            except RuntimeError:
                self.replies[j].put(None)
                return

    def request(self, batch_size: int) -> dict[int, int]:
        """Draw the owners of ``batch_size`` rows and ask the peers for theirs; returns
        the rows wanted per owner (-1: this learner), for :meth:`collect`."""
        live = [j for j in self.peers if j not in self.lost]
        with self.lock:
            own = len(self.replay)
        weights = torch.tensor([float(own)] + [float(self.known[j]) for j in live], dtype=torch.float64)
        if float(weights.sum()) == 0.0:
            weights[0] = 1.0
        owners = torch.multinomial(weights, batch_size, replacement=True, generator=self.sampler)
        counts = torch.bincount(owners, minlength=len(live) + 1).tolist()
        wanted = {-1: counts[0]}
        for j, k in zip(live, counts[1:]):
            wanted[j] = k
            self.requests[j].put(k)
        return wanted

    def collect(self, wanted: dict[int, int]) -> Any:
        """The minibatch asked for by :meth:`request`: the peers' rows as they arrive;
        rows a lost or empty peer could not give come from this learner's own part."""

        own, blocks = wanted[-1], []
        for j, k in wanted.items():
            if j < 0:
                continue
            reply = self._await(j)
            if reply is None:
                own += k
                continue
            size, block = reply
            self.known[j] = size
            own += k - block.shape[0]
            self.remote_rows += block.shape[0]
            blocks.append(block)
        with self.lock:
            parts = [self.replay.sample(own, self.sampler)] if own else []
        parts += [self.ctx.rows_batch(b) for b in blocks if b.shape[0]]
        return Batch(*(torch.cat(columns) for columns in zip(*parts)))

    def _await(self, j: int) -> tuple[int, torch.Tensor] | None:
        lost_key = f"lost/{G.learner_rank(j, self.ctx.config)}"
        while True:
            try:
                reply = self.replies[j].get(timeout=_POLL)
                break
            except queue.Empty:
                if self.ctx.store.check([lost_key]) or self.ctx.stop_requested():
                    reply = None
                    break
        if reply is None:
            self.lost.add(j)
        return reply

    def close(self, wanted: dict[int, int] | None) -> None:
        """Take the answer to a request still out, tell the peers' servers this learner
        is done, and stay (serving the others) until every learner is done or lost:
        a learner that left would take its part of the memory with it."""
        if wanted is not None:
            self.collect(wanted)
        for j in self.peers:
            if j not in self.lost:
                self.requests[j].put(-1)
        store, config = self.ctx.store, self.ctx.config
        store.add("learners/done", 1)
        while not self.ctx.stop_requested():
            lost = sum(1 for j in self.peers if store.check([f"lost/{G.learner_rank(j, config)}"]))
            if int(store.add("learners/done", 0)) + lost >= config.learners:
                return
            time.sleep(_POLL)


def run_learner(ctx: Context) -> int:
    config, l = ctx.config, ctx.role.index
    agent = ctx.agent
    replay = ReplayBuffer(config.replay_capacity, ctx.info.obs_dim, 0 if agent.discrete else agent.action_dim)
    sampler = networks.generator(ctx.stream(config.seed * 7919 + 1 + l))
    noise = networks.generator(ctx.stream(config.seed * 7919 + 2 + l))  # the agent's own draws (TD3's smoothing)
    replay_lock = threading.Lock()  # global replay: the peers' server threads sample it too
    store_wide = _GlobalReplay(ctx, replay, replay_lock, sampler) if config.replay == "global" else None
    # Global replay: each part holds about 1/L of the memory, so learning starts when
    # the parts together hold about learning_starts transitions.
    starts = -(-config.learning_starts // config.learners) if store_wide else config.learning_starts
    outliers = OutlierGuard(config.outlier_k, config.outlier_window, config.outlier_min_samples)
    # Test hooks: every k-th gradient computed scaled by 1e30, every k-th sent labelled too stale.
    inject_huge, inject_stale = int(hook("inject_huge_every")), int(hook("inject_stale_every"))
    # Test hook: learner deaf_learner - 1 lives on but stops receiving from each actor
    # once it took deaf_after rows from it, so that a send to it can only time out.
    deaf_after = int(hook("deaf_after")) if int(hook("deaf_learner")) == l + 1 else 0
    inbox: queue.Queue = queue.Queue()
    my_actors = G.actors_of_learner(l, config)
    busy = [threading.Event() for _ in my_actors]  # set between a chunk's header and its body

    def receive(a: int, flag: threading.Event) -> None:
        """Chunks from actor ``a`` until it is gone."""
        header = torch.zeros(4, dtype=torch.int64)
        actor = G.actor_rank(a, config)
        channel = ctx.channels[actor]
        taken = 0
        while True:
            if deaf_after and taken >= deaf_after:
                threading.Event().wait()
            try:
                dist.recv(header, src=actor, tag=TAG_TRANS_HDR, group=channel)
                flag.set()
                block = torch.empty(int(header[0]), ctx.row_width, dtype=torch.float32)
                dist.recv(block, src=actor, tag=TAG_TRANS, group=channel)
                inbox.put((a, block))
                taken += block.shape[0]
            except RuntimeError:  # the actor vanished; the launcher reports it
                return
            finally:
                flag.clear()

    for a, flag in zip(my_actors, busy):
        threading.Thread(target=receive, args=(a, flag), daemon=True).start()
    received_from = dict.fromkeys(my_actors, 0)

    def delivered() -> bool:
        """Every transition a finished actor says it sent here has arrived. (Its send
        returns once gloo has the data, possibly before our receive has it, and
        nothing else orders its "finished" against that receive.) A lost actor said
        nothing: what arrived from it is all there is."""
        for a in my_actors:
            key = f"sent/{a}/{l}"
            if ctx.store.check([key]) and received_from[a] < int(ctx.store.get(key)):
                return False
        return True

    mine = len(my_actors)
    flat = ctx.initial.clone()
    versions = [0] * config.shards
    target_version = -1
    updates = sent = received = 0
    credit = 0.0
    losses: list[float] = []
    path = ctx.run_dir / f"learner-{l}.npz"

    def save() -> None:
        _save(ctx, path, updates=np.int64(updates), sent=np.int64(sent), received=np.int64(received),
                   outliers=np.int64(outliers.discarded), losses=np.asarray(losses, dtype=np.float32),
                   remote_rows=np.int64(store_wide.remote_rows if store_wide else 0))

    def take(item: tuple[int, torch.Tensor]) -> None:
        nonlocal received, credit
        a, block = item
        n = block.shape[0]
        received_from[a] += n
        with replay_lock:
            replay.add(ctx.rows_batch(block))
        received += n
        # Each transition is stored once, by the learner it reached, which owes its share
        # of updates: every layout learns as much per transition played.
        if len(replay) >= starts:
            credit += config.update_ratio * n

    last_save = time.monotonic()
    waiting_since: float | None = None  # every actor finished; the last chunks are due
    pending: dict[int, int] | None = None  # global replay: the next minibatch's request
    while not ctx.stop_requested():
        while True:
            try:
                take(inbox.get_nowait())
            except queue.Empty:
                break
        if credit >= 1.0:
            if updates % config.learner_sync == 0:
                versions = _pull(ctx, flat)
                agent.load_online(flat)
                server = min(versions)
                if target_version < 0 or server - target_version >= config.target_every:
                    agent.load_target(flat)
                    target_version = server
            if store_wide is None:
                batch = replay.sample(config.batch_size, sampler)
            else:  # this minibatch was asked for one update ago; ask for the next now
                batch = store_wide.collect(pending if pending is not None else store_wide.request(config.batch_size))
                pending = store_wide.request(config.batch_size)
            grad, loss = agent.gradient(batch, updates, noise)
            if inject_huge and (updates + 1) % inject_huge == 0:
                grad = grad * 1e30
            norm = float(grad.norm())
            if outliers.admit(norm):
                if agent.max_grad_norm and norm > agent.max_grad_norm:  # the agent's own clipping, if any
                    grad = grad * (agent.max_grad_norm / norm)
                age = 0
                if inject_stale and (sent + 1) % inject_stale == 0:
                    age = config.max_staleness + 1
                for s, (a, b) in enumerate(ctx.bounds):
                    header = torch.tensor([GRAD, versions[s] - age, l, 0], dtype=torch.int64)
                    dist.send(header, dst=G.shard_rank(s, config), tag=TAG_REQ)
                    # a view of the learner's gradient buffer, which the next update overwrites:
                    # fine for a blocking send (an isend would need a copy)
                    dist.send(grad[a:b].contiguous(), dst=G.shard_rank(s, config), tag=TAG_GRAD)
                sent += 1
            updates += 1
            credit -= 1.0
            losses.append(loss)
        else:
            if (ctx.finished(f"finished/actors-of-{l}") >= mine and inbox.empty()
                    and not any(flag.is_set() for flag in busy)):
                if waiting_since is None:
                    waiting_since = time.monotonic()
                if delivered():
                    break
                if time.monotonic() - waiting_since > config.timeout:
                    print(f"gorila {ctx.role}: the last transitions did not arrive within --timeout "
                          f"{config.timeout:g}s; finishing without them", file=sys.stderr, flush=True)
                    break
            try:
                take(inbox.get(timeout=_POLL))  # wait for a chunk without spinning
            except queue.Empty:
                pass
        if time.monotonic() - last_save > 0.5:
            save()
            last_save = time.monotonic()
    # A send returns once gloo holds the gradient, not once its shard has applied it, and
    # a shard saves and ends as soon as every client is finished. Each shard answers a
    # client's messages in order, so its reply to one more pull means it applied them all.
    _pull(ctx, flat)
    save()
    if store_wide is not None:
        store_wide.close(pending)
        save()
    return 0


# --- actor ------------------------------------------------------------------------------

def run_actor(ctx: Context) -> int:
    config, a = ctx.config, ctx.role.index
    learners = [G.learner_rank(l, config) for l in G.learners_of_actor(a, config)]
    budget_steps, budget_episodes = G.actor_budget(a, config)
    env = envs.make_vector(config.env, 1)
    policy = ctx.agent.explorer(networks.generator(ctx.stream(config.seed * 1_000_003 + 17 + a)))
    flat = ctx.initial.clone()
    state = {"steps": 0, "last_pull": None, "server": 0}

    def act(obs: np.ndarray) -> np.ndarray:
        if state["last_pull"] is None or state["steps"] - state["last_pull"] >= config.actor_sync:
            if ctx.stop_requested():
                raise _Stop()
            state["server"] = min(_pull(ctx, flat))
            policy.load(flat, state["server"])
            state["last_pull"] = state["steps"]
        state["steps"] += 1
        return policy(obs)

    returns: list[float] = []
    lengths: list[int] = []
    ended_at: list[float] = []  # wall clock: the launcher merges every actor's episodes in time
    path = ctx.run_dir / f"actor-{a}.npz"

    def save() -> None:
        _save(ctx, path, env_steps=np.int64(state["steps"]), returns=np.asarray(returns, dtype=np.float64),
                   lengths=np.asarray(lengths, dtype=np.int64), ended_at=np.asarray(ended_at, dtype=np.float64),
                   server_version=np.int64(state["server"]))

    sent = dict.fromkeys(learners, 0)  # transitions per learner, told to it at the end

    def more() -> bool:
        if ctx.nothing_left:
            return False
        if budget_steps and state["steps"] >= budget_steps:
            return False
        if budget_episodes and len(returns) >= budget_episodes:
            return False
        return not ctx.stop_requested()

    episode = 0
    try:
        while more():
            ep = play_episodes(env, act, [episode_seed(config.seed, ctx.stream(1000 + a), episode)])
            episode += 1
            block = torch.as_tensor(episode_rows(ep), dtype=torch.float32)
            returns.extend(float(r) for r in ep.returns)
            lengths.extend(int(n) for n in ep.lengths)
            ended_at.append(time.time())
            for i in range(0, block.shape[0], config.chunk):
                part = block[i:i + config.chunk].contiguous()
                header = torch.tensor([part.shape[0], state["steps"], episode, 0], dtype=torch.int64)
                while True:
                    try:
                        channel = ctx.channels[learners[0]]
                        _send_within(header, learners[0], TAG_TRANS_HDR, config.timeout, channel)
                        _send_within(part, learners[0], TAG_TRANS, config.timeout, channel)
                        sent[learners[0]] += part.shape[0]
                        break
                    except RuntimeError as error:
                        # A learner that left because the job is stopping is no loss; one
                        # the launcher saw die is, even while stopping.
                        if ctx.stop_requested() and not ctx.store.check([f"lost/{learners[0]}"]):
                            raise _Stop() from None
                        # Global replay: the next learner's part of the memory takes it;
                        # with local replay this was the only one and the actor stops.
                        gone = learners.pop(0)
                        if not learners:
                            raise _PeerLost(_line(error)) from None
                        print(f"gorila {ctx.role}: {G.role_of(gone, config)} cannot take transitions ({_line(error)}); "
                              f"they go to {G.role_of(learners[0], config)} now", file=sys.stderr, flush=True)
            save()
    except _Stop:
        pass
    finally:
        env.close()
    save()
    for learner in learners:  # before this actor counts as finished (see run_learner)
        ctx.store.set(f"sent/{a}/{G.role_of(learner, config).index}", str(sent[learner]))
    return 0


def transport_timeout(config: G.GorilaConfig) -> float:
    return max(600.0, 20.0 * config.timeout)


# --- entry ------------------------------------------------------------------------------

def _line(error: BaseException) -> str:
    """The gist of a transport error (gloo's messages run to several sentences)."""
    text = " ".join(str(error).split())
    if "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ")[0][:120]


def _stop_on_interrupt(store: Any, rank: int) -> None:
    """Under torchrun, Ctrl-C reaches each worker as SIGINT from the agent (the workers
    have sessions of their own): "stop" in the store, as the local launcher would do."""
    def handler(signum: int, frame: Any) -> None:
        if rank == 0 and not store.check(["stop"]):
            print("\ngorila: stopping; every rank finishes what it holds, then the run file is written...",
                  file=sys.stderr, flush=True)
        store.set("stop", "requested")

    signal.signal(signal.SIGINT, handler)


def _finish_under_torchrun(ctx: Context) -> int:
    """Announce this rank's end (nobody watches its exit under torchrun); rank 0 then
    writes the run file. Returns the exit code."""
    store, config = ctx.store, ctx.config
    if ctx.role.kind == "actor":
        for l in G.learners_of_actor(ctx.role.index, config):
            store.add(f"finished/actors-of-{l}", 1)
    if ctx.role.kind != "shard":
        store.add("finished/clients", 1)
        return 0
    store.add("finished/shards", 1)
    if ctx.rank0 is None:
        return 0
    try:
        return ctx.rank0.conclude()
    except Exception as error:  # one line; the shards' files stand (OUT.parts)
        print(f"Error: gorila: writing the run file failed: {type(error).__name__}: {_line(error)}",
              file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or not args[0].startswith(G.ROLE_PREFIX + " "):
        print(f"Error: usage: python -m popplay.deep.topologies.gorila_ranks '{G.ROLE_PREFIX} ROLE I' CONFIG.json",
              file=sys.stderr)
        return 2
    die_with_parent()
    # each rank plays its own part (shard, learner, actor): its warnings are its own, named as its errors
    # are; deprecations (an old environment id) the launcher met when it measured the environment
    show_warnings_plainly(f"gorila {args[0].removeprefix(G.ROLE_PREFIX + ' ')}: ", deprecations=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops the job through the store
    torch.set_num_threads(1)
    config_path = Path(args[1])
    raw = json.loads(config_path.read_text())
    config = G.GorilaConfig.from_dict(raw)
    measured = {k: raw[k] for k in ("obs_dim", "actions", "action_dim", "action_low", "action_high")} \
        if "obs_dim" in raw else None
    torchrun = raw.get("torchrun")  # present when a torchrun worker exec-ed this rank
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.world_size:
        print(f"Error: WORLD_SIZE {world} does not match the layout's {config.world_size} ranks", file=sys.stderr)
        return 2
    if torchrun is None:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=config.timeout))
    else:

        store = T.attempt_store(T.agent_store(config.timeout), int(torchrun["attempt"]))
        _stop_on_interrupt(store, rank)
        if not T.all_arrived(store, world, config.timeout):
            # gloo's own rendezvous would wait the long transport timeout for them.
            print(f"Error: gorila rank {rank}: not every rank of {world} arrived within --timeout "
                  f"{config.timeout:g}s", file=sys.stderr, flush=True)
            os._exit(G.PEER_LOST_EXIT)
    # gloo closes a pair for good when a wait on it times out, and a shard may wait for
    # a client's next request for as long as the client takes to play or learn: the
    # transport's own timeout is long. Lost peers are found by the launcher (waitpid)
    # instead, which bounds every wait that matters (see gorila.run_gorila); under
    # torchrun its agent ends every rank when one is lost.
    dist.init_process_group("gloo", store=dist.PrefixStore("gorila", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=transport_timeout(config)))
    channels = transition_channels(config, rank)
    store.add(G.FORMED_KEY, 1)  # the local launcher starts the job again if a rank is lost before all are here
    ctx = Context(config, config_path.parent, rank, store, measured, torchrun, channels)
    if torchrun is not None and rank == 0:
        ctx.rank0 = T.Rank0(config, config_path.parent, torchrun, store)
    runner = {"shard": run_shard, "learner": run_learner, "actor": run_actor}[ctx.role.kind]
    try:
        code = runner(ctx)
    except _PeerLost as error:
        print(f"gorila {ctx.role}: stopped, its learner was lost ({error})", file=sys.stderr)
        code = G.PEER_LOST_EXIT
    except RuntimeError as error:
        if ctx.stop_requested():
            # Stopping: a peer that left first broke a message in flight. Expected; the
            # files saved so far (every episode, every half second) stand.
            code = 0
        else:
            print(f"gorila {ctx.role}: stopped, a peer it needs was lost ({_line(error)})", file=sys.stderr)
            code = G.PEER_LOST_EXIT
    except Exception as error:  # a bug or a bad input: one line, and the launcher reports the rank lost
        print(f"gorila {ctx.role}: failed: {type(error).__name__}: {_line(error)}", file=sys.stderr)
        code = 1
    if torchrun is not None and code == 0:
        code = _finish_under_torchrun(ctx)
    sys.stdout.flush()
    sys.stderr.flush()
    # Daemon threads may sit in a gloo receive that never returns: leave without
    # tearing the group down (its peers may be gone).
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

"""EXARL's multi-process workflows (issue 16) for A2C, TD3 and DDPG, over c10d
point-to-point on gloo.

Ranks: ``multi-learner`` and ``master-learner`` put the learners on ranks ``0..L-1``
and the actors on ``L..L+A-1``; ``central-inference`` puts the one model on rank 0
and the actors on ``1..A``. Rank 0 runs inside :func:`popplay.training.pipeline.train` (one
round per phase, it alone writes the run file); every other rank runs
:func:`rank_loop`. Only tensors travel (no pickle, no rpc).

**multi-learner** (EXARL's RMA queue workflow). MPI one-sided windows have no c10d
counterpart, so each actor *serves its own window*: a thread in the actor process
loops on ``recv(src=None)`` (any source) for request headers and answers each one
from the actor's local queue, while the actor's main thread plays episodes into that
queue. A request is ``[GET|BYE|PING, learner's weight version, weights follow?]``; when
the learner knows the actor holds older weights it appends its flat policy
parameters (the "put" into the actor's weight window). The reply is
``[EMPTY|DATA|FINISHED, rows, actor's weight version, first read?]`` then the
trajectory's rows.
One thread answers requests one at a time, so a get is atomic like a locked
``MPI_Get_accumulate``: under range-based selection a trajectory is popped by
exactly one learner. Under ``--selection random`` the get reads the actor's newest
trajectory without removing it, as EXARL's random window selection does, so two
learners may train on the same data (counted as duplicates).

Learners train data-parallel and synchronously: each round every learner gets at
most one trajectory, and one float64 all-reduce among the learners sums ``[has data,
steps, per-learner return and length, per-actor finished flags, stop]``; then the
on-policy agent learns through ``learn_shared(trajectory, peers)``, whose every
optimiser step follows a mean over the learners (A2C: one step on the mean gradient;
PPO: epochs of minibatch steps), so their parameters stay identical. The per-actor flags are the shared bitmap:
an actor any learner found finished (done producing, queue empty) is inactive for
all. Range-based learners ask their own contiguous block of actors, round-robin;
once every actor of their block is inactive they help the others.

**master-learner** (the seed's asynchronous baseline): actors send every trajectory
to learner 0 and get its current weights back; learner 0 hands one trajectory to
each other learner per round, then the same all-reduce round.

**central-inference** (SEED): actors hold no model; every step rank 0 gathers
``[active, reward, terminated, truncated, next_obs, obs]`` from all actors, acts for
all of them in one batch with the only copy of the policy, scatters ``[ACT | NO_ACTION
| STOP, action]`` (float64) back, and learns from each episode as it completes.

Replay learners (TD3, DDPG) move transitions instead of trajectories and train from
their replay; in the two learner workflows every optimiser step averages its gradients
over the learners (:meth:`Learners._average_gradients`).

At the end every rank reports ``[produced, produced checksum, reads, read checksum,
parameter checksum, updates, bytes sent, is learner, reads that helped]`` (int64, one gather) and rank 0
stores the totals as the run's ``topology_*`` counters.
"""
from __future__ import annotations

import datetime
import threading
import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as c10d

from popplay.deep import envs
from popplay.deep.agents import networks, replay
from popplay.deep.agents.a2c import SampledPolicy, Trajectory, trajectory_from_episodes
from popplay.deep.agents.replay import episode_rows, transition_width
from popplay.deep.envs.rollout import episode_seed, play_episodes
from popplay.deep.topologies import wire
from popplay.deep.topologies.base import count_episodes
from popplay.distributed.collectives import guarded

TAG_REQ, TAG_WEIGHTS, TAG_REPLY, TAG_DATA = 31, 32, 33, 34
GET, BYE, PING = 1, 2, 3
EMPTY, DATA, FINISHED = 0, 1, 2
REPORT = 9  # int64 fields each rank reports at the end


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def layout(params: Any) -> tuple[list[int], list[int]]:
    """(learner ranks, actor ranks) of a workflow."""
    if params.workflow == "central-inference":
        return [0], list(range(1, 1 + params.actors))
    return list(range(params.learners)), list(range(params.learners, params.learners + params.actors))


def quota(total: int, parts: int, index: int) -> int:
    """Part ``index`` of ``total`` split as evenly as possible (the first ones get more)."""
    return total // parts + (1 if index < total % parts else 0)


def owned(learner: int, learners: int, actors: int) -> range:
    """Range-based selection: learner's contiguous block of actor indices."""
    return range(learner * actors // learners, (learner + 1) * actors // learners)


def row_width(obs_dim: int) -> int:
    """obs, action, reward, next_obs, terminated, truncated, behaviour log-prob."""
    return 2 * obs_dim + 5


def width_of(agent: Any, obs_dim: int) -> int:
    """The rows a workflow moves for ``agent``: whole trajectories for an on-policy
    learner, transitions for a replay learner."""

    return row_width(obs_dim) if agent.on_policy else transition_width(obs_dim, agent.action_dim)


def trajectory_rows(traj: Any) -> np.ndarray:
    """One column of a :class:`~popplay.deep.agents.a2c.Trajectory` as float64 rows (exact)."""

    cols = [traj.obs[:, 0], traj.action[:, 0:1].double(), traj.reward[:, 0:1], traj.next_obs[:, 0],
            traj.terminated[:, 0:1], traj.truncated[:, 0:1], traj.behaviour_log_prob[:, 0:1]]
    return torch.cat([c.double() for c in cols], dim=1).numpy()


def rows_trajectory(rows: np.ndarray, obs_dim: int) -> Any:
    """The inverse of :func:`trajectory_rows`: a ``(T, 1)`` trajectory."""


    t = torch.as_tensor(rows).unsqueeze(1)
    d = obs_dim
    return Trajectory(t[..., :d].float(), t[..., d].long(), t[..., d + 1].float(), t[..., d + 2:2 * d + 2].float(),
                      t[..., 2 * d + 2].float(), t[..., 2 * d + 3].float(), t[..., 2 * d + 4].float(),
                      torch.ones(t.shape[:2]))


def _u64(value: int) -> int:
    """A 64-bit checksum as the int64 with the same bits (to travel in an int64 tensor)."""
    return int(np.array([value], dtype=np.uint64).view(np.int64)[0])


def _from_i64(value: int) -> int:
    return int(np.array([value], dtype=np.int64).view(np.uint64)[0])


class _Tally:
    """What one rank produced, read and sent."""

    def __init__(self) -> None:
        self.produced = 0
        self.produced_sum = 0
        self.reads = 0
        self.read_sum = 0
        self.bytes = 0
        self.helped = 0  # range selection: trajectories read from another learner's actors

    def produce(self, rows: np.ndarray) -> None:
        self.produced += 1
        self.produced_sum = wire.add_checksums(self.produced_sum, wire.checksum(rows))

    def read(self, rows: np.ndarray) -> None:
        self.reads += 1
        self.read_sum = wire.add_checksums(self.read_sum, wire.checksum(rows))

    def report(self, params_sum: int, updates: int, learner: bool) -> Any:
        return torch.tensor([self.produced, _u64(self.produced_sum), self.reads, _u64(self.read_sum),
                             _u64(params_sum), updates, self.bytes, int(learner), self.helped], dtype=torch.int64)


def _params_checksum(module: Any) -> int:
    return wire.checksum(networks.flat_parameters(module).detach().double().numpy().reshape(1, -1))


def _final_report(dist: Any, tally: _Tally, params_sum: int, updates: int, learner: bool) -> dict[str, Any] | None:
    """One gather of every rank's report; rank 0 returns the totals."""

    mine = tally.report(params_sum, updates, learner)
    if dist.rank != 0:
        guarded(dist, "gather of the final reports", lambda: c10d.gather(mine, dst=0))
        return None
    parts = [torch.zeros(REPORT, dtype=torch.int64) for _ in range(dist.world_size)]
    guarded(dist, "gather of the final reports", lambda: c10d.gather(mine, gather_list=parts, dst=0))
    produced = sum(int(p[0]) for p in parts)
    produced_sum = reads_sum = 0
    for p in parts:
        produced_sum = wire.add_checksums(produced_sum, _from_i64(int(p[1])))
        reads_sum = wire.add_checksums(reads_sum, _from_i64(int(p[3])))
    learners = [p for p in parts if int(p[7])]
    sums = [f"{_from_i64(int(p[4])):016x}" for p in learners]
    return {"produced": produced, "produced_checksum": f"{produced_sum:016x}",
            "reads": sum(int(p[2]) for p in parts), "reads_checksum": f"{reads_sum:016x}",
            "reads_by_learner": ",".join(str(int(p[2])) for p in learners),
            "learner_params": ",".join(sums), "learners_identical": int(len(set(sums)) == 1),
            "bytes": sum(int(p[6]) for p in parts), "helped": sum(int(p[8]) for p in parts)}


# --- actors ------------------------------------------------------------------------
class _Actor:
    """An actor's policy copy, environment and episode stream."""

    def __init__(self, params: Any, index: int) -> None:
        self.params = params
        self.index = index
        self.env = envs.make_vector(params.env, 1)
        info = envs.describe(self.env, params.env)
        self.obs_dim = info.obs_dim
        # The learners' initial policy (same seed): weight version 0.
        learner = params.new_learner(info)
        self.learner = learner
        self.policy, self.on_policy = learner.policy, learner.on_policy
        self.version = 0  # the learner updates behind the weights held
        self.generator = networks.generator(params.seed * 7919 + 101 * (index + 1))
        self.episodes = 0
        self.steps = 0
        self.quota_episodes = quota(params.episodes, params.actors, index) if params.episodes else 0
        self.quota_steps = quota(params.env_steps, params.actors, index) if params.env_steps else 0

    def done(self) -> bool:
        return ((self.quota_episodes > 0 and self.episodes >= self.quota_episodes)
                or (self.quota_steps > 0 and self.steps >= self.quota_steps)
                or (self.quota_episodes == 0 and self.quota_steps == 0))

    def load(self, weights: Any, version: int) -> None:
        networks.load_flat_parameters(self.policy, weights.float())
        self.version = version

    def play(self) -> np.ndarray:
        if self.on_policy:
            act: Any = SampledPolicy(self.policy, self.generator)
        else:  # the schedule of the weights' version, as the sequential workflow's
            act = self.learner.explorer(self.policy, self.generator)
            act.exploration = self.learner.exploration_at(self.version)
        episodes = play_episodes(self.env, act, [episode_seed(self.params.seed, 1 + self.index, self.episodes)])
        self.episodes += 1
        self.steps += episodes.steps
        if not self.on_policy:
            return episode_rows(episodes)
        return trajectory_rows(trajectory_from_episodes(episodes, self.policy))


def _window_actor(dist: Any, params: Any, index: int) -> None:
    """multi-learner actor: play into the local queue while a thread serves it."""


    actor = _Actor(params, index)
    tally = _Tally()
    learners = params.learners
    pop = params.selection == "range"
    capacity = params.queue_capacity if pop else 1
    cond = threading.Condition()
    items: deque = deque()  # [rows, set of learner ranks that read them]
    shared = {"producing": True, "weights": None, "version": 0, "stop": False, "error": None}

    def serve() -> None:
        header = torch.zeros(3, dtype=torch.int64)
        byes = 0
        try:
            while byes < learners:
                src = guarded(dist, "receive of a window request", lambda: c10d.recv(header, tag=TAG_REQ))
                kind, version, with_weights = (int(v) for v in header)
                if with_weights:
                    w = torch.empty(networks.parameter_count(actor.policy), dtype=torch.float64)
                    guarded(dist, f"receive of weights from rank {src}",
                           lambda: c10d.recv(w, src=src, tag=TAG_WEIGHTS))
                    with cond:
                        if version > shared["version"]:
                            shared["weights"], shared["version"] = w, version
                if kind == BYE:
                    byes += 1
                    with cond:
                        shared["stop"] = True
                        cond.notify_all()
                    continue
                rows, first = None, 1
                with cond:
                    # Finished: done playing and nothing left to give (random selection:
                    # the last trajectory was read once; no more duplicates of it).
                    finished = not shared["producing"] and (not items or (not pop and bool(items[-1][1])))
                    if kind == PING:
                        pass  # keeps this wait alive; never data
                    elif pop and items:
                        rows = items.popleft()[0]
                        cond.notify_all()
                    elif not pop and items and src not in items[-1][1] and not finished:
                        rows = items[-1][0]
                        first = int(not items[-1][1])
                        items[-1][1].add(src)
                        cond.notify_all()
                    finished = finished and rows is None
                    held = shared["version"]
                status = DATA if rows is not None else FINISHED if finished else EMPTY
                reply = torch.tensor([status, 0 if rows is None else rows.shape[0], held, first], dtype=torch.int64)
                guarded(dist, f"reply to rank {src}", lambda: c10d.send(reply, dst=src, tag=TAG_REPLY))
                tally.bytes += _nbytes(reply)
                if rows is not None:
                    data = torch.as_tensor(np.ascontiguousarray(rows))
                    guarded(dist, f"send of a trajectory to rank {src}",
                           lambda: c10d.send(data, dst=src, tag=TAG_DATA))
                    tally.bytes += _nbytes(data)
        except BaseException as error:  # noqa: BLE001 (re-raised by the main thread)
            with cond:
                shared["error"] = error
                shared["stop"] = True
                cond.notify_all()

    server = threading.Thread(target=serve, name="window", daemon=True)
    server.start()
    version = 0
    while not actor.done():
        with cond:
            if shared["stop"]:
                break
            if shared["version"] > version:
                version = shared["version"]
                actor.load(shared["weights"], version)
        rows = actor.play()
        tally.produce(rows)
        with cond:
            # A bounded queue keeps the actor's policy close to the learners'; the
            # random-selection window holds one trajectory until someone has read it.
            while not shared["stop"] and (len(items) >= capacity if pop else bool(items and not items[-1][1])):
                cond.wait(timeout=0.05)
            if not pop:
                items.clear()
            items.append([rows, set()])
    with cond:
        shared["producing"] = False
    server.join()  # its every wait is bounded; learner 0's pings keep a finished actor's alive
    if shared["error"] is not None:
        raise shared["error"]
    actor.env.close()
    _final_report(dist, tally, 0, 0, False)


def _master_actor(dist: Any, params: Any, index: int) -> None:
    """master-learner actor: send each trajectory to learner 0, take its weights back."""


    actor = _Actor(params, index)
    tally = _Tally()
    weights = torch.empty(1 + networks.parameter_count(actor.policy), dtype=torch.float64)
    while not actor.done():
        rows = actor.play()
        tally.produce(rows)
        header = torch.tensor([rows.shape[0], int(actor.done())], dtype=torch.int64)
        data = torch.as_tensor(np.ascontiguousarray(rows))
        guarded(dist, "send of a trajectory header", lambda: c10d.send(header, dst=0, tag=TAG_REQ))
        guarded(dist, "send of a trajectory", lambda: c10d.send(data, dst=0, tag=TAG_DATA))
        tally.bytes += _nbytes(header) + _nbytes(data)
        guarded(dist, "receive of the weights", lambda: c10d.recv(weights, src=0, tag=TAG_WEIGHTS))
        if weights[0] == 0:  # the learners stopped early
            break
        actor.load(weights[1:], int(weights[0]) - 1)  # [1 + learner updates, weights]
    if actor.done():
        if actor.episodes == 0:
            # Nothing to play (a zero quota): still say so, or learner 0 waits for us.
            header = torch.tensor([0, 1], dtype=torch.int64)
            guarded(dist, "send of a trajectory header", lambda: c10d.send(header, dst=0, tag=TAG_REQ))
            guarded(dist, "receive of the weights", lambda: c10d.recv(weights, src=0, tag=TAG_WEIGHTS))
        # Finished before the others: wait for the release, kept alive by learner 0's
        # pings (a single wait would run into the timeout on a long run).
        ping = torch.zeros(1, dtype=torch.int64)
        while True:
            guarded(dist, "receive of a ping from learner 0", lambda: c10d.recv(ping, src=0, tag=TAG_REPLY))
            if int(ping[0]) == 0:
                break
    actor.env.close()
    _final_report(dist, tally, 0, 0, False)


def _central_actor(dist: Any, params: Any, index: int) -> None:
    """central-inference actor: step the environment with the actions rank 0 sends.

    Each gather carries the outcome of the last action (``has_prev``, reward,
    terminated, truncated, the real successor) and, if the actor wants another
    action, the observation to act on."""


    env = envs.make_vector(params.env, 1)
    info = envs.describe(env, params.env)
    d, k = info.obs_dim, wire.action_width(info)
    tally = _Tally()
    counts = {"episodes": 0, "steps": 0}
    q_episodes = quota(params.episodes, params.actors, index) if params.episodes else 0
    q_steps = quota(params.env_steps, params.actors, index) if params.env_steps else 0

    def done() -> bool:
        return ((q_episodes > 0 and counts["episodes"] >= q_episodes) or (q_steps > 0 and counts["steps"] >= q_steps)
                or (q_episodes == 0 and q_steps == 0))

    action = torch.zeros(1 + k, dtype=torch.float64)  # [ACT, NO_ACTION or STOP, the action]
    prev = None  # (reward, terminated, truncated, real successor)
    rows: list[np.ndarray] = []
    wants = not done()
    obs = env.reset(seed=episode_seed(params.seed, 1 + index, 0))[0] if wants else np.zeros((1, d), np.float32)
    while True:
        message = torch.zeros(central_width(d))
        if prev is not None:
            message[0] = 1
            message[1:4] = torch.tensor(prev[:3], dtype=torch.float32)
            message[4:4 + d] = torch.as_tensor(prev[3], dtype=torch.float32)
        if wants:
            message[4 + d] = 1
            message[5 + d:] = torch.as_tensor(obs[0], dtype=torch.float32)
        guarded(dist, "gather of the observations", lambda: c10d.gather(message, dst=0))
        tally.bytes += _nbytes(message)
        guarded(dist, "scatter of the actions", lambda: c10d.scatter(action, src=0))
        if int(action[0]) == STOP:
            break
        prev = None
        if not wants:
            continue  # finished: stay in step with the others until rank 0 stops
        chosen = (action[1:].numpy().astype(np.int64) if info.discrete
                  else action[1:].numpy().astype(np.float32).reshape(1, k))
        nxt, reward, terminated, truncated, step_info = env.step(chosen)
        ended = bool(terminated[0] or truncated[0])
        real = np.asarray(step_info["final_obs"][0], dtype=np.float32) if ended else nxt[0]
        prev = (float(reward[0]), float(terminated[0]), float(truncated[0]), real)
        rows.append(np.concatenate([obs[0], real]).astype(np.float64))
        counts["steps"] += 1
        obs = nxt
        if ended:
            counts["episodes"] += 1
            tally.produce(np.asarray(rows))
            rows = []
            wants = not done()
            if wants:
                obs = env.reset(seed=episode_seed(params.seed, 1 + index, counts["episodes"]))[0]
    env.close()
    _final_report(dist, tally, 0, 0, False)


def central_width(obs_dim: int) -> int:
    return 2 * obs_dim + 5


#: The first entry of rank 0's scatter to each actor (then the action).
ACT, NO_ACTION, STOP = 1, 0, -1


# --- learners ----------------------------------------------------------------------
class RoundResult(NamedTuple):
    """What rank 0 counts after a round: the episodes first learned from (every
    learner's), their env-steps, whether a learner asked to stop, whether every actor
    is inactive."""

    returns: list[float]
    lengths: list[int]
    steps: int
    stop: bool
    all_finished: bool


def learner_group(dist: Any, params: Any) -> Any:
    """The learners' process group (every rank must call this, in the same order)."""


    learners, _ = layout(params)
    return c10d.new_group(ranks=learners, timeout=datetime.timedelta(seconds=params.timeout))


class Peers:
    """The learners of a data-parallel workflow as an on-policy agent sees them in
    ``learn_shared(trajectory, peers)``: each collective is made by every learner, in the
    same order (an agent without data that round takes part with weight 0)."""

    def __init__(self, dist: Any, group: Any, tally: Any) -> None:
        self.dist, self.group, self.tally = dist, group, tally

    def mean(self, values: torch.Tensor, weight: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The mean of ``values`` over the learners, each weighted by its ``weight``
        (sums in ``dtype``; the learners' total weight must be positive)."""
        vec = torch.cat([values.reshape(-1).to(dtype) * weight, torch.tensor([float(weight)], dtype=dtype)])
        guarded(self.dist, "all-reduce of the gradients",
               lambda: c10d.all_reduce(vec, op=c10d.ReduceOp.SUM, group=self.group))
        self.tally.bytes += _nbytes(vec)
        return (vec[:-1] / vec[-1]).reshape(values.shape)

    def max(self, value: int) -> int:
        """The largest ``value`` over the learners."""
        vec = torch.tensor([int(value)], dtype=torch.int64)
        guarded(self.dist, "all-reduce of a count",
               lambda: c10d.all_reduce(vec, op=c10d.ReduceOp.MAX, group=self.group))
        return int(vec[0])


class _Alone:
    """:class:`Peers` for a learner with no peers (central-inference's one model)."""

    @staticmethod
    def mean(values: torch.Tensor, weight: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return values.to(dtype)

    @staticmethod
    def max(value: int) -> int:
        return int(value)


ALONE = _Alone()


class Learners:
    """One learner's side of ``multi-learner`` or ``master-learner``: fetch at most one
    trajectory per round, then the all-reduce round shared by every learner."""

    def __init__(self, dist: Any, params: Any, group: Any, obs_dim: int) -> None:
        self.dist, self.params, self.group, self.obs_dim = dist, params, group, obs_dim
        self.width = 0  # of the rows moved: set by the first round from its agent
        self._averaging: Any = None  # the replay learner whose optimisers average over the learners
        self.learners, actor_ranks = layout(params)
        self.actor_ranks = actor_ranks
        self.index = dist.rank
        self.A, self.L = params.actors, params.learners
        self.bitmap = np.ones(self.A, dtype=bool)  # the shared bitmap: actors still active
        self.seen_finished = np.zeros(self.A, dtype=bool)
        self.known = np.zeros(self.A, dtype=np.int64)  # weight version each actor holds
        self.own = list(owned(self.index, self.L, self.A))
        self.cursor = 0
        self.random = torch.Generator().manual_seed(params.seed * 7919 + 31 * (self.index + 1))
        self.tally = _Tally()
        self.peers = Peers(dist, group, self.tally)
        self.done = False
        self.pending: list[np.ndarray] = []  # master: trajectories received, not yet handed out
        self.first = 1  # whether the last trajectory fetched was read for the first time
        # Learner 0 pings finished actors so that their waits (bounded by --timeout)
        # never run out while the others play on.
        self.pinged = np.full(self.A, time.monotonic())

    # --- fetching ---------------------------------------------------------------
    def _candidates(self) -> list[int]:
        active = [a for a in range(self.A) if self.bitmap[a] and not self.seen_finished[a]]
        if self.params.selection == "random":
            return [active[int(i)] for i in torch.randperm(len(active), generator=self.random)]
        own = [a for a in self.own if a in active]
        pool = own if own else active  # exhausted its own actors: help the others
        if not pool:
            return []
        start = self.cursor % len(pool)
        self.cursor += 1
        return pool[start:] + pool[:start]

    def _get(self, agent: Any, a: int) -> np.ndarray | None:
        dist, rank = self.dist, self.actor_ranks[a]
        with_weights = int(agent.updates > self.known[a])
        header = torch.tensor([GET, agent.updates, with_weights], dtype=torch.int64)
        guarded(dist, f"request to actor rank {rank}", lambda: c10d.send(header, dst=rank, tag=TAG_REQ))
        self.tally.bytes += _nbytes(header)
        if with_weights:
            w = networks.flat_parameters(agent.policy).detach().double()
            guarded(dist, f"send of weights to rank {rank}", lambda: c10d.send(w, dst=rank, tag=TAG_WEIGHTS))
            self.tally.bytes += _nbytes(w)
        reply = torch.zeros(4, dtype=torch.int64)
        guarded(dist, f"reply of actor rank {rank}", lambda: c10d.recv(reply, src=rank, tag=TAG_REPLY))
        status, rows, held, self.first = (int(v) for v in reply)
        self.known[a] = held
        if status == FINISHED and not self.seen_finished[a]:
            self.seen_finished[a] = True
            self.pinged[a] = time.monotonic()
        if status != DATA:
            return None
        data = torch.empty(rows, self.width, dtype=torch.float64)
        guarded(dist, f"receive of a trajectory from rank {rank}", lambda: c10d.recv(data, src=rank, tag=TAG_DATA))
        return data.numpy()

    def _ping_finished(self) -> None:
        if self.index != 0:
            return
        now = time.monotonic()
        finished = self.seen_finished | ~self.bitmap
        for a in np.flatnonzero(finished & (now - self.pinged > self.params.timeout / 4)):
            rank = self.actor_ranks[a]
            if self.params.workflow == "master-learner":
                ping = torch.ones(1, dtype=torch.int64)
                guarded(self.dist, f"ping of actor rank {rank}", lambda: c10d.send(ping, dst=rank, tag=TAG_REPLY))
            else:
                header = torch.tensor([PING, 0, 0], dtype=torch.int64)
                reply = torch.zeros(4, dtype=torch.int64)
                guarded(self.dist, f"ping of actor rank {rank}", lambda: c10d.send(header, dst=rank, tag=TAG_REQ))
                guarded(self.dist, f"ping of actor rank {rank}", lambda: c10d.recv(reply, src=rank, tag=TAG_REPLY))
            self.pinged[a] = now

    def _fetch_window(self, agent: Any) -> np.ndarray | None:
        for a in self._candidates():
            rows = self._get(agent, a)
            if rows is not None:
                self.tally.helped += int(self.params.selection == "range" and a not in self.own)
                return rows
        return None

    def _fetch_master(self, agent: Any) -> np.ndarray | None:
        """Learner 0 receives up to one trajectory per learner from the actors (any
        source, answering each with its weights) and hands one to each other learner."""


        dist = self.dist
        if self.index != 0:
            header = torch.zeros(1, dtype=torch.int64)
            guarded(dist, "receive of a batch header from learner 0", lambda: c10d.recv(header, src=0, tag=TAG_REPLY))
            if int(header[0]) == 0:
                return None
            data = torch.empty(int(header[0]), self.width, dtype=torch.float64)
            guarded(dist, "receive of a batch from learner 0", lambda: c10d.recv(data, src=0, tag=TAG_DATA))
            return data.numpy()
        weights = torch.cat([torch.tensor([1.0 + agent.updates], dtype=torch.float64),
                             networks.flat_parameters(agent.policy).double()])
        while len(self.pending) < self.L and not self.seen_finished.all():
            header = torch.zeros(2, dtype=torch.int64)
            src = guarded(dist, "receive of a trajectory header", lambda: c10d.recv(header, tag=TAG_REQ))
            a = self.actor_ranks.index(src)
            if int(header[0]):
                data = torch.empty(int(header[0]), self.width, dtype=torch.float64)
                guarded(dist, f"receive of a trajectory from rank {src}",
                       lambda: c10d.recv(data, src=src, tag=TAG_DATA))
                self.pending.append(data.numpy())
            guarded(dist, f"send of weights to rank {src}", lambda: c10d.send(weights, dst=src, tag=TAG_WEIGHTS))
            self.tally.bytes += _nbytes(weights)
            if int(header[1]):
                self.seen_finished[a] = True
                self.pinged[a] = time.monotonic()
        for learner in range(1, self.L):
            rows = self.pending.pop() if self.pending else None
            header = torch.tensor([0 if rows is None else rows.shape[0]], dtype=torch.int64)
            guarded(dist, f"send of a batch header to learner {learner}",
                   lambda: c10d.send(header, dst=learner, tag=TAG_REPLY))
            self.tally.bytes += _nbytes(header)
            if rows is not None:
                data = torch.as_tensor(np.ascontiguousarray(rows))
                guarded(dist, f"send of a batch to learner {learner}",
                       lambda: c10d.send(data, dst=learner, tag=TAG_DATA))
                self.tally.bytes += _nbytes(data)
        return self.pending.pop() if self.pending else None

    # --- the round --------------------------------------------------------------
    def round(self, agent: Any, stop: bool = False) -> RoundResult:
        """Fetch (unless stopping), then one all-reduce. On-policy agents (A2C, PPO)
        then learn together from the round's trajectories through
        ``learn_shared(trajectory or None, peers)``: every optimiser step on a mean over
        the learners (:class:`Peers`), so their networks stay identical. Replay learners
        (TD3, DDPG) store what they fetched and then all run the updates owed for the
        round's env-steps, each optimiser step on the mean gradient over the learners
        (:meth:`_average_gradients`). ``stop`` from any learner ends the run for all."""
        self.width = width_of(agent, self.obs_dim)
        rows, self.first = None, 1
        if stop and self.params.workflow == "master-learner" and self.index == 0:
            for learner in range(1, self.L):  # they wait for a batch header first
                header = torch.zeros(1, dtype=torch.int64)
                guarded(self.dist, f"send of a batch header to learner {learner}",
                       lambda: c10d.send(header, dst=learner, tag=TAG_REPLY))
        if not stop:
            self._ping_finished()
            rows = self._fetch_master(agent) if self.params.workflow == "master-learner" else self._fetch_window(agent)
        L, A = self.L, self.A
        # [learners with data, first-read steps, learners holding replay, return and
        #  length per learner, finished per actor, stop]
        at = 3
        vec = torch.zeros(at + 2 * L + A + 1, dtype=torch.float64)
        traj = None
        if rows is not None:
            self.tally.read(rows)
            if agent.on_policy:
                traj = rows_trajectory(rows, self.obs_dim)
                reward = float(traj.reward.sum())
            else:
                # duplicates too (random selection): they train
                agent.replay.add(replay.rows_batch(rows, self.obs_dim, agent.discrete))
                reward = float(rows[:, self.width - self.obs_dim - 2].sum())  # the float64 rewards, exact
            vec[0] = 1.0
            # Episodes and env-steps count what was played: a duplicate read (random
            # selection) trains but is not counted again.
            if self.first:
                vec[1] = rows.shape[0]
                vec[at + self.index] = reward
                vec[at + L + self.index] = rows.shape[0]
        elif not stop:
            time.sleep(0.005)  # nothing ready: leave the CPU to the actors
        if not agent.on_policy:
            vec[2] = float(len(agent.replay) > 0)
        vec[at + 2 * L:at + 2 * L + A] = torch.as_tensor(self.seen_finished, dtype=torch.float64)
        vec[-1] = float(stop)
        guarded(self.dist, "all-reduce of the round",
               lambda: c10d.all_reduce(vec, op=c10d.ReduceOp.SUM, group=self.group))
        steps = int(vec[1])
        if agent.on_policy:
            if vec[0] > 0:
                # Every learner takes part (with its trajectory or none), so that each
                # collective the agent makes is made by all of them.
                agent.learn_shared(traj, self.peers)
                agent.received += steps
        elif not vec[-1] > 0:
            # The credit follows the steps all learners stored, so every learner owes the
            # same updates. They pay them once any learner holds replay: one that holds
            # none yet (its peers read every trajectory so far) takes part with weight 0,
            # or a short run could end with the credit never paid.
            agent.received += steps
            if agent.received >= agent.config.learning_starts:
                agent.update_credit += agent.config.update_ratio * steps
            if vec[2] > 0:
                self._average_gradients(agent)
                agent.train()
        self.bitmap &= ~(vec[at + 2 * L:at + 2 * L + A].numpy() > 0)
        returns = [float(vec[at + i]) for i in range(L) if vec[at + L + i] > 0]
        lengths = [int(vec[at + L + i]) for i in range(L) if vec[at + L + i] > 0]
        all_finished = not self.bitmap.any()
        return RoundResult(returns, lengths, steps, bool(vec[-1] > 0), all_finished)

    def _average_gradients(self, agent: Any) -> None:
        """Make every optimiser step of ``agent`` step along the mean gradient over the
        learners (one all-reduce of its parameters' gradients and weight before each
        step), as data-parallel training does: the learners run the same number of steps
        in the same order, so their networks stay identical while each samples its own
        replay (a learner with none yet adds a blank batch's gradient with weight 0)."""
        if self._averaging is agent:
            return

        def mean(flat: torch.Tensor, weight: float) -> torch.Tensor:
            return self.peers.mean(flat, weight, flat.dtype)

        agent.average_gradients(mean)
        self._averaging = agent

    def finish(self, agent: Any, stopped: bool) -> dict[str, Any] | None:
        """Release the actors, then the final gather (rank 0 gets the totals)."""


        dist = self.dist
        if self.params.workflow == "multi-learner":
            for rank in self.actor_ranks:
                header = torch.tensor([BYE, agent.updates, 0], dtype=torch.int64)
                guarded(dist, f"goodbye to actor rank {rank}", lambda: c10d.send(header, dst=rank, tag=TAG_REQ))
        elif self.index == 0 and stopped:
            # Actors still playing send one more trajectory each; answer it with stop.
            stop = torch.zeros(1 + networks.parameter_count(agent.policy), dtype=torch.float64)
            for a, rank in enumerate(self.actor_ranks):
                if self.seen_finished[a]:
                    continue
                header = torch.zeros(2, dtype=torch.int64)
                guarded(dist, f"receive of a trajectory header from rank {rank}",
                       lambda: c10d.recv(header, src=rank, tag=TAG_REQ))
                if int(header[0]):
                    data = torch.empty(int(header[0]), self.width, dtype=torch.float64)
                    guarded(dist, f"receive of a trajectory from rank {rank}",
                           lambda: c10d.recv(data, src=rank, tag=TAG_DATA))
                guarded(dist, f"send of the stop to rank {rank}", lambda: c10d.send(stop, dst=rank, tag=TAG_WEIGHTS))
                if int(header[1]):  # that was its last: it waits for the release too
                    self.seen_finished[a] = True
        if self.params.workflow == "master-learner" and self.index == 0:
            release = torch.zeros(1, dtype=torch.int64)
            for a in np.flatnonzero(self.seen_finished):
                rank = self.actor_ranks[a]
                guarded(dist, f"release of actor rank {rank}", lambda: c10d.send(release, dst=rank, tag=TAG_REPLY))
        self.done = True
        return _final_report(dist, self.tally, _params_checksum(agent.networks()), agent.updates, True)


class CentralServer:
    """Rank 0 of ``central-inference``: batched inference for every actor, learning
    from each episode as it completes."""

    def __init__(self, dist: Any, params: Any, info: Any) -> None:
        self.dist, self.params, self.d = dist, params, info.obs_dim
        self.k = wire.action_width(info)
        self.A = params.actors
        self.open: list[list[np.ndarray]] = [[] for _ in range(self.A)]  # rows of each actor's episode so far
        self.last: list[tuple[np.ndarray, int, float] | None] = [None] * self.A  # obs, action, log-prob
        self.tally = _Tally()
        self.done = False

    def steps(self, agent: Any, generator: Any, count: int) -> RoundResult:
        """Up to ``count`` gather/infer/scatter steps; learns from completed episodes
        (A2C: one update on each; a replay learner stores it and runs the updates owed)."""

        dist, d, k, A = self.dist, self.d, self.k, self.A
        returns: list[float] = []
        lengths: list[int] = []
        steps = 0
        for _ in range(count):
            mine = torch.zeros(central_width(d))
            parts = [torch.zeros(central_width(d)) for _ in range(dist.world_size)]
            guarded(dist, "gather of the observations", lambda: c10d.gather(mine, gather_list=parts, dst=0))
            msgs = torch.stack(parts[1:])
            for a in range(A):
                if msgs[a, 0] > 0:  # the outcome of the last action
                    obs, action, logp = self.last[a]
                    reward, term, trunc = (float(v) for v in msgs[a, 1:4])
                    successor = msgs[a, 4:4 + d].numpy()
                    if agent.on_policy:
                        row = np.concatenate([obs, action, [reward], successor, [term, trunc, logp]])
                    else:
                        row = np.concatenate([obs, action, [reward], successor, [term]])
                    self.open[a].append(row.astype(np.float64))
                    steps += 1
                    if term or trunc:
                        returns.append(self._learn(agent, np.asarray(self.open[a])))
                        lengths.append(len(self.open[a]))
                        self.open[a] = []
            wants = msgs[:, 4 + d] > 0
            actions = torch.zeros(dist.world_size, 1 + k, dtype=torch.float64)
            actions[:, 0] = STOP
            if wants.any():
                actions[1:, 0] = NO_ACTION
                obs = msgs[:, 5 + d:]
                chosen, logps = self._act(agent, obs, generator)
                for a in range(A):
                    if wants[a]:
                        actions[1 + a, 0] = ACT
                        actions[1 + a, 1:] = torch.as_tensor(chosen[a], dtype=torch.float64)
                        self.last[a] = (obs[a].numpy().astype(np.float64), np.asarray(chosen[a], np.float64).reshape(-1),
                                        float(logps[a]))
            out = torch.zeros(1 + k, dtype=torch.float64)
            scatter_list = list(actions)
            guarded(dist, "scatter of the actions", lambda: c10d.scatter(out, scatter_list=scatter_list, src=0))
            self.tally.bytes += sum(_nbytes(t) for t in scatter_list[1:])
            if not wants.any():
                self.done = True
                break
        return RoundResult(returns, lengths, steps, False, self.done)

    def _act(self, agent: Any, obs: Any, generator: Any) -> tuple[np.ndarray, np.ndarray]:
        """One batch of actions for every actor's observation, with their behaviour
        log-probabilities (A2C; 0 for a replay learner's noisy deterministic actions)."""

        if agent.on_policy:
            with torch.no_grad():
                logp = torch.log_softmax(agent.policy(obs), dim=-1)
                chosen = torch.multinomial(logp.exp(), 1, generator=generator)
            return chosen.numpy(), logp.gather(1, chosen).squeeze(1).numpy()

        explorer = agent.explorer(agent.policy, generator)
        explorer.exploration = agent.exploration_at(agent.updates)  # as the sequential workflow's
        return explorer(obs.numpy()), np.zeros(obs.shape[0])

    def _learn(self, agent: Any, rows: np.ndarray) -> float:
        """Learn from one completed episode's rows; returns its return."""

        d, k = self.d, self.k
        # The actor's side counted (obs, real successor) of every step: the same here.
        self.tally.read(np.concatenate([rows[:, :d], rows[:, d + k + 1:2 * d + k + 1]], axis=1))
        if agent.on_policy:
            agent.learn_shared(rows_trajectory(rows, d), ALONE)
            agent.received += rows.shape[0]
        else:
            agent.receive(replay.rows_batch(rows, d, agent.discrete))
            agent.train()
        return float(rows[:, d + k].sum())

    def finish(self, agent: Any, stopped: bool) -> dict[str, Any] | None:
        if stopped and not self.done:
            # The actors wait in the next gather: answer it with -1 (stop) for all.

            mine = torch.zeros(central_width(self.d))
            parts = [torch.zeros(central_width(self.d)) for _ in range(self.dist.world_size)]
            guarded(self.dist, "gather of the observations", lambda: c10d.gather(mine, gather_list=parts, dst=0))
            out = torch.zeros(1 + self.k, dtype=torch.float64)
            stop = [torch.full((1 + self.k,), float(STOP), dtype=torch.float64) for _ in range(self.dist.world_size)]
            guarded(self.dist, "scatter of the stop", lambda: c10d.scatter(out, scatter_list=stop, src=0))
        self.done = True
        return _final_report(self.dist, self.tally, _params_checksum(agent.networks()), agent.updates, True)


class WorkflowRounds:
    """Rank 0's side of a workflow, as the experiment drives it: one learner round (or a
    few inference steps) per phase."""

    def __init__(self, dist: Any, params: Any, info: Any) -> None:
        self.dist = dist
        self.central = params.workflow == "central-inference"
        self.flow: Any = (CentralServer(dist, params, info) if self.central
                          else Learners(dist, params, learner_group(dist, params), info.obs_dim))

    @property
    def done(self) -> bool:
        return self.flow.done

    def round(self, exp: Any, state: Any) -> Any:
        flow = self.flow
        r = flow.steps(state.agent, state.explore, 32) if self.central else flow.round(state.agent)
        count_episodes(state, r.returns, r.lengths, r.steps)
        if r.all_finished or r.stop:
            state.extra.update(flow.finish(state.agent, stopped=r.stop) or {})
        return state

    def close(self, exp: Any, state: Any) -> None:
        """Stop the other ranks if the run ended early (Ctrl-C, a time limit), then the
        last barrier."""
        flow = self.flow
        if not flow.done:
            if not self.central:
                flow.round(state.agent, stop=True)
            flow.finish(state.agent, stopped=True)
        last_barrier(self.dist)


class Workflows:
    """EXARL's multi-process workflows as :mod:`popplay.deep.topologies.families` lists them."""

    names = ("multi-learner", "master-learner", "central-inference")
    rank0 = WorkflowRounds

    @staticmethod
    def role(params: Any, rank: int) -> str:
        learners, _ = layout(params)
        if params.workflow == "central-inference":
            return "server" if rank == 0 else f"actor {rank - 1}"
        return f"learner {rank}" if rank in learners else f"actor {rank - len(learners)}"

    @staticmethod
    def serve(dist: Any, params: Any, resume: Any) -> None:
        rank_loop(dist, params, resume)

    @staticmethod
    def resume_problem(params: Any) -> str | None:
        """A multi-process workflow's run file holds rank 0's state only."""
        return (f"--resume: a {params.workflow} run cannot be resumed in this version (its run file holds "
                "rank 0's state only)")


def last_barrier(dist: Any) -> None:
    """Every rank leaves the group together (rank 0 after its run file is written):
    an actor that tore its group down while the others still ran was seen to abort in
    gloo ("terminate called without an active exception")."""

    guarded(dist, "the last barrier", lambda: c10d.barrier())


def rank_loop(dist: Any, params: Any, resume: Any) -> None:
    """Every rank but 0: an actor, or a learner following rank 0's rounds."""
    _rank_work(dist, params)
    last_barrier(dist)


def _rank_work(dist: Any, params: Any) -> None:
    learners, actors = layout(params)
    group = learner_group(dist, params) if params.workflow != "central-inference" else None
    if dist.rank in actors:
        index = actors.index(dist.rank)
        {"multi-learner": _window_actor, "master-learner": _master_actor,
         "central-inference": _central_actor}[params.workflow](dist, params, index)
        return
    env = envs.make_vector(params.env, 1)
    info = envs.describe(env, params.env)
    env.close()
    agent = params.new_learner(info)
    flow = Learners(dist, params, group, info.obs_dim)
    while True:
        r = flow.round(agent)
        if r.stop or r.all_finished:
            flow.finish(agent, stopped=r.stop)
            return

"""Grandio's multi-process topologies: the learner on rank 0, simulators on ranks 1..N,
for any replay agent (:class:`popplay.deep.agents.protocol.ReplayAgent`: DQN, TD3, DDPG).

``pipelined`` (two ranks, seed §III-B): every ``sync_every`` episodes the simulator
sends its transitions and the learner answers at once with its weights, then trains on
what it received while the simulator plays on (point-to-point send/recv).

``collective`` (1 + N ranks, §III-C): the learner broadcasts its weights, every
simulator plays ``sync_every`` episodes, the learner gathers their transitions and
trains ``update_ratio`` updates per transition (as much as they produced), then the
next round. Everybody waits for everybody once a round.

``async`` (§III-D, which the seed could not make work because it pickled): nobody
waits. Every channel has a thread that does the blocking send or receive (gloo's
point-to-point works report completion only once waited on, so polling them does not
work); the main loops only look at queues. A simulator hands its transitions to its
sender every ``sync_every`` episodes, or keeps them for the next message while the
previous one is still in flight, and takes the newest weights that have arrived; the
learner takes every message that has arrived, answers its simulator with its current
weights (unless the previous ones are still in flight) and trains in between. The
explorer's schedule (ε) comes with the weights and follows learner updates, so fast early
simulation cannot end exploration early.

Messages are tensors on separate tags: a header (int64: transitions, episodes,
last), the transitions (float64, :mod:`popplay.deep.topologies.wire`), weights (float64: flag,
the explorer's schedule value (DQN's ε), episodes to play, learner updates, then the
flat parameters of the agent's ``policy``), and at the end each
simulator's totals (transitions sent and their checksum), which the learner stores so
that a test can check it received exactly what was produced. Every blocking wait is
bounded by the group's timeout.
"""
from __future__ import annotations

import datetime
import math
import queue
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as c10d

from popplay.core.hooks import hook
from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.envs.rollout import Episodes, episode_seed, play_episodes
from popplay.deep.topologies import wire
from popplay.distributed.collectives import CollectiveError, guarded

TAG_HEADER, TAG_DATA, TAG_WEIGHTS, TAG_TOTALS = 11, 12, 13, 14


def _weights_message(agent: Any, flag: float, plan: int) -> Any:
    head = torch.tensor([flag, agent.exploration_at(agent.updates), float(plan), float(agent.updates)],
                        dtype=torch.float64)
    return torch.cat([head, networks.flat_parameters(agent.policy).cpu().double()])  # gloo: CPU tensors


class Learner:
    """Rank 0's side of a seed-003 topology (attached to the experiment): one round per phase."""

    #: The run's budget alone says when it is done (:meth:`RankedExperiment.finished`).
    done = None

    def __init__(self, dist: Any, params: Any, info: Any) -> None:
        self.dist = dist
        self.params = params
        self.width = wire.row_width(info.obs_dim, wire.action_width(info))
        self.simulators = params.simulators
        self.started = False
        self.closed = False
        self.received = 0
        self.received_checksum = 0
        # async: per simulator, a queue of arrived messages and one of weights to send
        self.inbox: dict[int, queue.Queue] = {}
        self.outbox: dict[int, queue.Queue] = {}
        self.errors: list[BaseException] = []
        self.finished_sims: set[int] = set()

    # --- receiving ------------------------------------------------------------------
    def _receive_from(self, exp: Any, state: Any, rank: int, transitions: int, episodes: int) -> None:
        size = transitions * self.width + 2 * episodes
        if size == 0:
            return
        data = torch.empty(size, dtype=torch.float64)
        guarded(self.dist, f"receive of transitions from rank {rank}",
               lambda: c10d.recv(data, src=rank, tag=TAG_DATA))
        rows, returns, lengths = wire.unpack(data.numpy(), transitions, episodes, self.width)
        self.received += transitions
        self.received_checksum = wire.add_checksums(self.received_checksum, wire.checksum(rows))
        exp.learn_rows(state, rows, returns, lengths)

    def _train(self, state: Any, limit: int | None = None) -> int:
        agent = state.agent
        n = agent.owed_updates() if limit is None else min(limit, agent.owed_updates())
        slow_learner = hook("slow_learner")
        for _ in range(n):
            agent.update()
            if slow_learner:
                time.sleep(slow_learner)
        agent.update_credit -= n
        return n

    def _plan(self, exp: Any, state: Any) -> int:
        """Episodes each simulator plays next round (the episode budget is met exactly)."""
        p = self.params
        if p.episodes:
            left = max(1, p.episodes - state.episodes)
            return max(1, min(p.sync_every, math.ceil(left / self.simulators)))
        return p.sync_every

    def _record(self, state: Any, sent: int, sent_checksum: int) -> None:
        state.extra.update(received=self.received, received_checksum=f"{self.received_checksum:016x}",
                           sent=sent, sent_checksum=f"{sent_checksum:016x}", replay_added=state.agent.replay.added)

    # --- rounds -----------------------------------------------------------------------
    def round(self, exp: Any, state: Any) -> Any:
        topology = self.params.topology
        if topology == "pipelined":
            self._pipelined(exp, state)
        elif topology == "collective":
            self._collective(exp, state)
        else:
            self._async(exp, state)
        if exp.finished(state, time_mode=False):
            self.close(exp, state)
        return state

    def _pipelined(self, exp: Any, state: Any) -> None:
        if not self.started:
            message = _weights_message(state.agent, 1.0, self._plan(exp, state))
            guarded(self.dist, "send of the weights", lambda: c10d.send(message, dst=1, tag=TAG_WEIGHTS))
            self.started = True
        header = torch.zeros(wire.HEADER, dtype=torch.int64)
        guarded(self.dist, "receive of a header from rank 1", lambda: c10d.recv(header, src=1, tag=TAG_HEADER))
        self._receive_from(exp, state, 1, int(header[0]), int(header[1]))
        if not exp.finished(state, time_mode=False):
            # Answer at once, then train while the simulator plays on (the pipeline).
            message = _weights_message(state.agent, 1.0, self._plan(exp, state))
            guarded(self.dist, "send of the weights", lambda: c10d.send(message, dst=1, tag=TAG_WEIGHTS))
        self._train(state)

    def _collective(self, exp: Any, state: Any) -> None:
        message = _weights_message(state.agent, 1.0, self._plan(exp, state))
        guarded(self.dist, "broadcast of the weights", lambda: c10d.broadcast(message, src=0))
        mine = torch.zeros(wire.HEADER, dtype=torch.int64)
        headers = [torch.zeros(wire.HEADER, dtype=torch.int64) for _ in range(self.dist.world_size)]
        guarded(self.dist, "gather of the headers", lambda: c10d.gather(mine, gather_list=headers, dst=0))
        for rank in range(1, self.dist.world_size):  # rank order: the replay's order is fixed
            self._receive_from(exp, state, rank, int(headers[rank][0]), int(headers[rank][1]))
        self._train(state)

    def _start_async(self) -> None:
        """One receiving and one sending thread per simulator: gloo's point-to-point
        works report completion only once waited on, so the waiting happens there and
        the learner itself only looks at queues."""
        up, down = _channels(self.dist)
        for rank in range(1, self.dist.world_size):
            self.inbox[rank] = queue.Queue()
            self.outbox[rank] = queue.Queue()
            _thread(_receive_transitions, self.dist, up, rank, self.width, self.inbox[rank])
            _thread(_send_queue, self.dist, down, rank, TAG_WEIGHTS, self.outbox[rank], self.errors)
        self.started = True

    def _check_errors(self) -> None:
        if self.errors:
            raise self.errors[0]

    def _poll(self, exp: Any, state: Any) -> int:
        """Take every message that has arrived; return the episodes received."""
        got = 0
        self._check_errors()
        for rank in range(1, self.dist.world_size):
            box = self.inbox[rank]
            while not box.empty():
                item = box.get_nowait()
                if isinstance(item, BaseException):
                    raise item
                header, data = item
                transitions, episodes, last = (int(v) for v in header)
                self._take(exp, state, data, transitions, episodes)
                got += episodes
                if last:
                    self.finished_sims.add(rank)
                elif not self.closed and self.outbox[rank].unfinished_tasks == 0:
                    # Fresh weights for this simulator, unless the last ones are still on their way.
                    self.outbox[rank].put(_weights_message(state.agent, 1.0, self.params.sync_every))
        return got

    def _take(self, exp: Any, state: Any, data: Any, transitions: int, episodes: int) -> None:
        if transitions + episodes == 0:
            return
        rows, returns, lengths = wire.unpack(data.numpy(), transitions, episodes, self.width)
        self.received += transitions
        self.received_checksum = wire.add_checksums(self.received_checksum, wire.checksum(rows))
        exp.learn_rows(state, rows, returns, lengths)

    def _async(self, exp: Any, state: Any) -> None:
        if not self.started:
            self._start_async()
        target = self.params.sync_every * self.simulators
        got = 0
        deadline = time.monotonic() + 1.0  # a phase ends after a second without enough episodes
        while got < target and time.monotonic() < deadline and not exp.finished(state, time_mode=False):
            got += self._poll(exp, state)
            if self._train(state, limit=8) == 0 and got < target:
                time.sleep(0.0005)

    # --- the end ----------------------------------------------------------------------
    def close(self, exp: Any, state: Any) -> None:
        """Stop the simulators (once) and collect their totals into ``state.extra``."""

        if self.closed:
            return
        self.closed = True
        topology = self.params.topology
        if topology == "pipelined":
            if not self.started:
                self.started = True
            message = _weights_message(state.agent, 0.0, 0)
            guarded(self.dist, "send of the stop", lambda: c10d.send(message, dst=1, tag=TAG_WEIGHTS))
        elif topology == "collective":
            message = _weights_message(state.agent, 0.0, 0)
            guarded(self.dist, "broadcast of the stop", lambda: c10d.broadcast(message, src=0))
        else:
            if not self.started:
                self._start_async()
            for rank in range(1, self.dist.world_size):
                self.outbox[rank].put(_weights_message(state.agent, 0.0, 0))
                self.outbox[rank].put(None)  # ends the sending thread
            # Drain: every simulator sends what it still holds, marked last.
            deadline = time.monotonic() + self.dist.timeout
            while len(self.finished_sims) < self.simulators:
                if time.monotonic() > deadline:

                    raise CollectiveError(f"rank 0 of {self.dist.world_size}: simulators did not finish within "
                                          f"{self.dist.timeout:g}s of the stop")
                if self._poll(exp, state) == 0:
                    time.sleep(0.001)
            for rank in range(1, self.dist.world_size):
                _join(self.outbox[rank], self.dist.timeout)
            self._check_errors()
        sent, sent_checksum = 0, 0
        for rank in range(1, self.dist.world_size):
            totals = torch.zeros(2, dtype=torch.int64)
            guarded(self.dist, f"receive of rank {rank}'s totals",
                   lambda: c10d.recv(totals, src=rank, tag=TAG_TOTALS))
            sent += int(totals[0])
            sent_checksum = wire.add_checksums(sent_checksum, int(totals[1]) & ((1 << 64) - 1))
        self._record(state, sent, sent_checksum)


# --- the simulators -------------------------------------------------------------------

class _Simulator:
    def __init__(self, dist: Any, params: Any, resume: Any) -> None:
        self.dist = dist
        self.params = params
        self.index = dist.rank  # stream of this simulator's episode seeds
        self.env = envs.make_vector(params.env, 1)
        self.info = envs.describe(self.env, params.env)
        # The learner's initial agent (same seed): version 0 of the weights.
        learner = params.new_learner(self.info)
        self.policy = learner.policy
        self.width = wire.row_width(self.info.obs_dim, wire.action_width(self.info))
        self.episode = 0
        if resume is not None:
            # Episode seeds of a resumed run must not repeat the first run's.
            self.episode = 1_000_000 * (1 + int(resume.state_counters.get("episodes", 0)))
        # the weights the learner sends are loaded into the policy in place, where the explorer sees them
        self.actor = learner.explorer(self.policy,
                                      networks.generator(params.seed * 7919 + 1000 * dist.rank + self.episode))
        self.actor.exploration = learner.exploration_at(0)
        self.sent = 0
        self.sent_checksum = 0
        # async: this simulator's share of what is left of the budget, so that simulators
        # that never wait stop near the budget instead of playing on until the stop arrives.
        done = resume.state_counters if resume is not None else {}
        sims = dist.world_size - 1
        self.quota_episodes = _share(params.episodes, int(done.get("episodes", 0)), sims)
        self.quota_steps = _share(params.env_steps, int(done.get("env_steps", 0)), sims)
        self.played_episodes = 0
        self.played_steps = 0

    @property
    def quota_reached(self) -> bool:
        # Every budget that is set, not either: with both set, a simulator that stopped at
        # its step share while another stopped at its episode share could leave both
        # totals short of their budgets, and the learner would wait for ever.
        return self.played_episodes >= self.quota_episodes and self.played_steps >= self.quota_steps

    def episodes_to_play(self) -> int:
        """``sync_every`` episodes, or fewer where that would pass the episode share."""
        left = self.quota_episodes - self.played_episodes
        return int(min(self.params.sync_every, left)) if left > 0 else self.params.sync_every

    def load(self, message: Any) -> None:
        self.actor.exploration = float(message[wire.W_EXPLORATION])
        networks.load_flat_parameters(self.policy, message[wire.WEIGHTS_HEADER:].float())

    def play(self, episodes: int) -> Any:
        """``episodes`` episodes, merged into one message's worth."""

        parts = []
        slow_simulator = hook("slow_simulator")
        for _ in range(episodes):
            parts.append(play_episodes(self.env, self.actor, [episode_seed(self.params.seed, self.index, self.episode)]))
            self.episode += 1
            self.played_episodes += 1
            self.played_steps += parts[-1].steps
            if slow_simulator:
                time.sleep(slow_simulator)
        return Episodes(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                          ("obs", "action", "reward", "next_obs", "terminated", "returns", "lengths")))

    def pack(self, episodes: Any, last: bool) -> tuple[Any, Any]:
        data = wire.pack(episodes, self.info.obs_dim)
        rows = data[:episodes.steps * self.width].reshape(episodes.steps, self.width)
        self.sent += episodes.steps
        self.sent_checksum = wire.add_checksums(self.sent_checksum, wire.checksum(rows))
        header = torch.tensor([episodes.steps, len(episodes.returns), int(last)], dtype=torch.int64)
        return header, torch.from_numpy(data)

    def send_totals(self) -> None:
        bits = self.sent_checksum - (1 << 64) if self.sent_checksum >= 1 << 63 else self.sent_checksum
        totals = torch.tensor([self.sent, bits], dtype=torch.int64)
        guarded(self.dist, "send of the totals", lambda: c10d.send(totals, dst=0, tag=TAG_TOTALS))


def _share(budget: int, done: int, simulators: int) -> int:
    """One simulator's share of what is left of a budget (0 for a budget not set: the
    other one decides)."""
    if budget <= 0:
        return 0
    return max(0, -(-(budget - done) // simulators))


def _empty_episodes(obs_dim: int) -> Any:
    return Episodes(np.zeros((0, obs_dim), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32),
                    np.zeros((0, obs_dim), np.float32), np.zeros(0, bool), np.zeros(0), np.zeros(0, np.int64))


def simulator_loop(dist: Any, params: Any, resume: Any) -> None:
    """Simulator ``dist.rank`` until the learner says stop."""
    sim = _Simulator(dist, params, resume)
    if params.topology == "pipelined":
        _pipelined_simulator(sim)
    elif params.topology == "collective":
        _collective_simulator(sim)
    else:
        _async_simulator(sim)
    sim.send_totals()
    sim.env.close()


def _weights_buffer(sim: _Simulator) -> Any:
    return torch.zeros(wire.WEIGHTS_HEADER + networks.parameter_count(sim.policy), dtype=torch.float64)


def _pipelined_simulator(sim: _Simulator) -> None:
    message = _weights_buffer(sim)
    while True:
        guarded(sim.dist, "receive of the weights", lambda: c10d.recv(message, src=0, tag=TAG_WEIGHTS))
        if message[wire.W_FLAG] == 0:
            return
        sim.load(message)
        header, data = sim.pack(sim.play(int(message[wire.W_EPISODES])), last=False)
        guarded(sim.dist, "send of a header", lambda: c10d.send(header, dst=0, tag=TAG_HEADER))
        if data.numel():
            guarded(sim.dist, "send of transitions", lambda: c10d.send(data, dst=0, tag=TAG_DATA))


def _collective_simulator(sim: _Simulator) -> None:
    message = _weights_buffer(sim)
    while True:
        guarded(sim.dist, "broadcast of the weights", lambda: c10d.broadcast(message, src=0))
        if message[wire.W_FLAG] == 0:
            return
        sim.load(message)
        header, data = sim.pack(sim.play(int(message[wire.W_EPISODES])), last=False)
        guarded(sim.dist, "gather of the headers", lambda: c10d.gather(header, dst=0))
        if data.numel():
            guarded(sim.dist, "send of transitions", lambda: c10d.send(data, dst=0, tag=TAG_DATA))


def _async_simulator(sim: _Simulator) -> None:
    dist = sim.dist
    weights: queue.Queue = queue.Queue()
    sends: queue.Queue = queue.Queue()
    errors: list[BaseException] = []
    up, down = _channels(dist)
    _thread(_receive_weights, dist, down, _weights_buffer(sim).numel(), weights)
    _thread(_send_queue, dist, up, 0, None, sends, errors)
    outbox: list[Any] = []
    while True:
        latest, stop = None, False
        while not weights.empty():
            item = weights.get_nowait()
            if isinstance(item, BaseException):
                raise item
            if item[wire.W_FLAG] == 0:
                stop = True
                break
            latest = item
        if errors:
            raise errors[0]
        if stop:
            break
        if latest is not None:
            sim.load(latest)
        if sim.quota_reached:  # its share is played: hand over what it holds, then wait for the stop
            if outbox and sends.unfinished_tasks == 0:
                sends.put(sim.pack(_merge(outbox, sim.info.obs_dim), last=False))
                outbox = []
            time.sleep(0.002)
            continue
        outbox.append(sim.play(sim.episodes_to_play()))
        if sends.unfinished_tasks == 0:  # the previous message has landed: send all held so far
            sends.put(sim.pack(_merge(outbox, sim.info.obs_dim), last=False))
            outbox = []
    sends.put(sim.pack(_merge(outbox, sim.info.obs_dim), last=True))
    sends.put(None)
    _join(sends, dist.timeout)
    if errors:
        raise errors[0]


class Simulators:
    """Grandio's topologies as :mod:`popplay.deep.topologies.families` lists them."""

    names = ("pipelined", "collective", "async")
    rank0 = Learner
    serve = staticmethod(simulator_loop)

    @staticmethod
    def role(params: Any, rank: int) -> str:
        return "learner" if rank == 0 else f"simulator {rank}"

    @staticmethod
    def resume_problem(params: Any) -> str | None:
        return None  # the simulators' episode seeds move on past the first run's


# --- threads that do the waiting (async) ------------------------------------------------

def _channels(dist: Any) -> tuple[Any, Any]:
    """Two more process groups, one per direction (transitions up, weights down), so
    that each connection is used by one thread only (every rank calls this once)."""


    timeout = datetime.timedelta(seconds=dist.timeout)
    up = c10d.new_group(backend="gloo", timeout=timeout)
    down = c10d.new_group(backend="gloo", timeout=timeout)
    return up, down


def _thread(target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _join(box: queue.Queue, timeout: float) -> None:
    """Wait (bounded) until a sending thread has sent everything queued."""
    deadline = time.monotonic() + timeout
    while box.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.001)
    if box.unfinished_tasks:

        raise CollectiveError(f"messages were not delivered within {timeout:g}s")


def _send_queue(dist: Any, group: Any, dst: int, tag: int | None, box: queue.Queue, errors: list) -> None:
    """Send what is queued, in order, until None: a tensor (on ``tag``) or a
    (header, data) pair of transitions."""

    while True:
        item = box.get()
        try:
            if item is None:
                return
            if tag is not None:
                guarded(dist, "send", lambda: c10d.send(item, dst=dst, tag=tag, group=group))
            else:
                header, data = item
                guarded(dist, "send of a header", lambda: c10d.send(header, dst=dst, tag=TAG_HEADER, group=group))
                if data.numel():
                    guarded(dist, "send of transitions", lambda: c10d.send(data, dst=dst, tag=TAG_DATA, group=group))
        except BaseException as error:  # handed to the main thread
            errors.append(error)
            return
        finally:
            box.task_done()


def _receive_transitions(dist: Any, group: Any, src: int, width: int, box: queue.Queue) -> None:
    """The learner's receiver of one simulator's messages, until the one marked last."""

    try:
        while True:
            header = torch.zeros(wire.HEADER, dtype=torch.int64)
            guarded(dist, f"receive of a header from rank {src}", lambda: c10d.recv(header, src=src, tag=TAG_HEADER, group=group))
            size = int(header[0]) * width + 2 * int(header[1])
            data = torch.empty(size, dtype=torch.float64)
            if size:
                guarded(dist, f"receive of transitions from rank {src}",
                       lambda: c10d.recv(data, src=src, tag=TAG_DATA, group=group))
            box.put((header, data))
            if int(header[2]):
                return
    except BaseException as error:
        box.put(error)


def _receive_weights(dist: Any, group: Any, size: int, box: queue.Queue) -> None:
    """A simulator's receiver of weights, until the stop."""

    try:
        while True:
            message = torch.zeros(size, dtype=torch.float64)
            guarded(dist, "receive of the weights", lambda: c10d.recv(message, src=0, tag=TAG_WEIGHTS, group=group))
            box.put(message)
            if message[wire.W_FLAG] == 0:
                return
    except BaseException as error:
        box.put(error)


def _merge(parts: list[Any], obs_dim: int) -> Any:
    if not parts:
        return _empty_episodes(obs_dim)
    return Episodes(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                      ("obs", "action", "reward", "next_obs", "terminated", "returns", "lengths")))

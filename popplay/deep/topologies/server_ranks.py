"""The parameter-server draft's synchronous parameter server for any on-policy agent
(``--workflow parameter-server``: A2C, PPO; REINFORCE's own ``--topology server`` is the
draft's exact algorithm, summed gradients of one episode per worker).

Rank 0 is the server, ranks 1..N the workers. Every round the server broadcasts its
weights and the steps learned so far; each worker loads them, plays one episode in its
own environment and learns it through the agent's ``learn_shared(trajectory, peers)``,
where every mean the agent asks of its peers is a gather to the server, a sum there in
rank order and a broadcast back (:class:`ServerPeers`): the server sums the gradients and
every rank steps the same optimiser along the same mean, so all copies stay identical
(the server takes part with no trajectory, weight 0, as a learner without data does in
EXARL's workflows). The workers' episode counts come back with a last gather.

A worker's actions in round ``u`` come from a generator of (seed, worker, ``u``) alone,
and its episode is reset with ``episode_seed(seed, 1 + worker, u)``: a run depends only
on the seed and the number of workers.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as c10d

from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.a2c import SampledPolicy, trajectory_from_episodes
from popplay.deep.envs.rollout import episode_seed, play_episodes
from popplay.deep.topologies.base import count_episodes
from popplay.deep.topologies.exarl_ranks import last_barrier
from popplay.distributed.collectives import guarded

NAME = "parameter-server"
_GO, _STOP = 1.0, 0.0


class ServerPeers:
    """The peers of ``learn_shared`` in the parameter-server topology: each collective goes
    through the server (every rank makes it, in the same order)."""

    def __init__(self, dist: Any) -> None:
        self.dist = dist

    def _through_server(self, vec: torch.Tensor, what: str, combine: Any) -> torch.Tensor:
        dist = self.dist
        parts = [torch.zeros_like(vec) for _ in range(dist.world_size)] if dist.rank == 0 else None
        guarded(dist, f"gather of the {what}", lambda: c10d.gather(vec, gather_list=parts, dst=0))
        out = combine(parts) if parts is not None else torch.zeros_like(vec)
        guarded(dist, f"broadcast of the {what}", lambda: c10d.broadcast(out, src=0))
        return out

    def mean(self, values: torch.Tensor, weight: float) -> torch.Tensor:
        """The mean of ``values`` over the ranks, each weighted by its ``weight`` (summed
        at the server in rank order, float64)."""

        def total(parts: list[torch.Tensor]) -> torch.Tensor:
            out = parts[0].clone()
            for part in parts[1:]:
                out += part
            return out

        vec = torch.cat([values.reshape(-1).double() * weight, torch.tensor([float(weight)], dtype=torch.float64)])
        summed = self._through_server(vec, "gradients", total)
        return (summed[:-1] / summed[-1]).reshape(values.shape)

    def max(self, value: int) -> int:
        """The largest ``value`` over the ranks."""
        vec = torch.tensor([int(value)], dtype=torch.int64)
        return int(self._through_server(vec, "counts", lambda parts: torch.stack(parts).max(dim=0).values)[0])


def _header(agent: Any, flag: float) -> torch.Tensor:
    return torch.cat([torch.tensor([flag, float(agent.received)], dtype=torch.float64),
                      networks.flat_parameters(agent.networks()).double()])


def _episode_counts(dist: Any, mine: torch.Tensor) -> list[torch.Tensor]:
    """[return, length, differed] of every worker's episode this round, at the server
    (rank order); ``differed``: 1 where the worker's copy of the weights was not the
    server's when the round began (every step should have kept them equal)."""
    parts = [torch.zeros(3, dtype=torch.float64) for _ in range(dist.world_size)] if dist.rank == 0 else None
    guarded(dist, "gather of the episodes", lambda: c10d.gather(mine, gather_list=parts, dst=0))
    return parts[1:] if parts is not None else []


class ServerRounds:
    """The server's side, as the experiment drives it: one round per phase."""

    done = None  # the experiment's budget decides

    def __init__(self, dist: Any, params: Any, info: Any) -> None:
        self.dist = dist
        self.peers = ServerPeers(dist)
        self._closed = False

    def round(self, exp: Any, state: Any) -> Any:
        agent = state.agent
        message = _header(agent, _GO)
        guarded(self.dist, "broadcast of the parameters", lambda: c10d.broadcast(message, src=0))
        agent.learn_shared(None, self.peers)
        episodes = _episode_counts(self.dist, torch.zeros(3, dtype=torch.float64))
        lengths = [int(p[1]) for p in episodes]
        count_episodes(state, [float(p[0]) for p in episodes], lengths, sum(lengths))
        agent.received += sum(lengths)
        state.extra["workers"] = len(episodes)
        state.extra["copies_differed"] = state.extra.get("copies_differed", 0) + sum(int(p[2]) for p in episodes)
        return state

    def close(self, exp: Any, state: Any) -> None:
        """Tell the workers to stop (once), then the last barrier."""
        if self._closed:
            return
        self._closed = True
        message = _header(state.agent, _STOP)
        guarded(self.dist, "broadcast of the stop", lambda: c10d.broadcast(message, src=0))
        last_barrier(self.dist)


def worker_loop(dist: Any, params: Any) -> None:
    """Worker ``dist.rank - 1``: per round, load the server's weights, play one episode,
    learn it with the others through the server, report the episode; until told to stop."""
    worker = dist.rank - 1
    env = envs.make_vector(params.env, 1)
    info = envs.describe(env, params.env)
    agent = params.new_learner(info)
    peers = ServerPeers(dist)
    modules = agent.networks()
    message = _header(agent, _GO)
    rounds = 0
    while True:
        guarded(dist, "broadcast of the parameters", lambda: c10d.broadcast(message, src=0))
        if message[0] == _STOP:
            break
        agent.received = int(message[1])
        weights = message[2:].float()
        differed = 0.0 if torch.equal(networks.flat_parameters(modules), weights) else 1.0
        networks.load_flat_parameters(modules, weights)
        generator = networks.generator(params.seed * 7919 + 104_729 * (worker + 1) + 15_485_863 * rounds)
        played = play_episodes(env, SampledPolicy(agent.policy, generator),
                               [episode_seed(params.seed, 1 + worker, rounds)])
        agent.learn_shared(trajectory_from_episodes(played, agent.policy), peers)
        _episode_counts(dist, torch.tensor([float(played.returns[0]), float(played.lengths[0]), differed],
                                           dtype=torch.float64))
        rounds += 1
    env.close()
    last_barrier(dist)


class ParameterServer:
    """The parameter-server draft's topology for any on-policy agent, as
    :mod:`popplay.deep.topologies.families` lists it."""

    names = (NAME,)
    rank0 = ServerRounds

    @staticmethod
    def role(params: Any, rank: int) -> str:
        return "server" if rank == 0 else f"worker {rank - 1}"

    @staticmethod
    def serve(dist: Any, params: Any, resume: Any) -> None:
        worker_loop(dist, params)

    @staticmethod
    def resume_problem(params: Any) -> str | None:
        return (f"--resume: a {NAME} run cannot be resumed in this version (each worker keeps its own copy of "
                "the optimiser, which the run file does not hold)")

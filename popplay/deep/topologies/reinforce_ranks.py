"""The parameter-server draft's parameter server over ranks: broadcast, one episode per worker, gather, sum."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as c10d

from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.reinforce import policy_network, worker_episode, worker_generator
from popplay.distributed.collectives import guarded


def server_round(dist: Any, policy: Any, workers: int, timeout: float) -> tuple[list[Any], list[float], list[int]]:
    """Broadcast the parameters (flag 1), gather every worker's [gradient, reward, steps]."""
    message = torch.cat([torch.ones(1), networks.flat_parameters(policy)])
    guarded(dist, "broadcast of the parameters", lambda: c10d.broadcast(message, src=0))
    size = networks.parameter_count(policy) + 2
    mine = torch.zeros(size, dtype=torch.float64)
    parts = [torch.zeros(size, dtype=torch.float64) for _ in range(dist.world_size)]
    guarded(dist, "gather of the gradients", lambda: c10d.gather(mine, gather_list=parts, dst=0))
    grads = [p[:-2].float() for p in parts[1:]]
    rewards = [float(p[-2]) for p in parts[1:]]
    steps = [int(p[-1]) for p in parts[1:]]
    return grads, rewards, steps


def server_stop(dist: Any, policy: Any) -> None:
    message = torch.zeros(1 + networks.parameter_count(policy))
    guarded(dist, "broadcast of the stop", lambda: c10d.broadcast(message, src=0))


def worker_loop(dist: Any, params: Any, resume: Any) -> None:
    """Worker ``dist.rank``: receive parameters, play one episode, send the gradient,
    until the server's flag says stop."""
    worker = dist.rank - 1
    env = envs.make_vector(params.env, 1)
    info = envs.describe(env, params.env)
    policy = policy_network(params.seed, info.obs_dim, int(info.actions), params.agent_config())
    generator = worker_generator(params.seed, worker)
    index = 0
    if resume is not None:
        # Episode seeds continue from the run's update count; the action stream of a
        # resumed worker is a fresh one (ranks keep no state in the run file).
        index = int(resume.state_counters.get("updates", 0))
        generator = worker_generator(params.seed + 104_729 * index, worker)
    message = torch.zeros(1 + networks.parameter_count(policy))
    while True:
        guarded(dist, "broadcast of the parameters", lambda: c10d.broadcast(message, src=0))
        if message[0] == 0:
            break
        networks.load_flat_parameters(policy, message[1:])
        grad, reward, steps = worker_episode(policy, env, generator, params.seed, worker, index, params.gamma,
                                             params.max_steps)
        index += 1
        payload = torch.cat([grad.double(), torch.tensor([reward, float(steps)], dtype=torch.float64)])
        guarded(dist, "gather of the gradients", lambda: c10d.gather(payload, dst=0))
    env.close()

"""REINFORCE with a synchronous parameter server (seed 001).

Every update the server (rank 0) broadcasts the policy's parameters; each worker
(ranks 1..N) plays one episode in its own environment with them, computes the
gradient of its REINFORCE loss (:mod:`popplay.agents.reinforce`) and sends it back;
the server gathers the gradients, sums them in worker order and steps Adam. With
``topology="local"`` the same workers run one after another inside one process (the
same episodes, the same sum; what the reproduction uses on a small machine and what
``--resume`` continues exactly).

Worker w's episode u is reset with ``episode_seed(seed, w + 1, u)`` and samples its
actions from its own generator, so a run depends only on the seed and the number of
workers, not on which process plays which worker. The running reward is seed 001's,
R ← 0.05·reward + 0.95·R, kept per worker; ``running_reward`` is their mean.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from popplay.topologies.base import (DeepExperiment, DeepParams, check_at_least_one, check_evaluation_and_timeout,
                                     topology_counters, topology_extra)
from popplay.topologies.common import check_budget, recent_mean

REINFORCE_TOPOLOGIES = ("server", "local")


@dataclass(frozen=True)
class ReinforceParams(DeepParams):
    env: str = "CartPole-v1"
    topology: str = "server"  # server: ranks (seed 001); local: the same workers in one process
    workers: int = 1
    episodes: int = 200  # budget: server updates (each worker plays one episode per update)
    env_steps: int = 0  # budget: environment steps summed over workers (0: none)
    seed: int = 0
    hidden: tuple[int, ...] = (128,)
    lr: float = 1e-2
    gamma: float = 0.99
    max_steps: int = 10_000  # steps per episode at most (seed 001's max_iters)
    eval_episodes: int = 100
    timeout: float = 60.0  # seconds any wait for another rank may take

    def agent_config(self) -> Any:
        from popplay.agents.reinforce import ReinforceConfig

        return ReinforceConfig(hidden=self.hidden, lr=self.lr, gamma=self.gamma)

    def validate(self) -> None:
        if self.topology not in REINFORCE_TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(REINFORCE_TOPOLOGIES)} (got {self.topology!r})")
        check_at_least_one(workers=self.workers, max_steps=self.max_steps)
        check_evaluation_and_timeout(self.eval_episodes, self.timeout)
        check_budget(self.episodes, self.env_steps)
        self.agent_config().validate()

    @property
    def ranks(self) -> int:
        return 1 if self.topology == "local" else 1 + self.workers


@dataclass
class ReinforceState:
    policy: Any
    optimizer: Any
    generators: list[Any]  # one per worker (local topology; ranks keep their own)
    updates: int = 0
    episodes: int = 0
    env_steps: int = 0
    running: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per worker
    running_curve: list[float] = field(default_factory=list)  # mean running reward after each update
    returns: list[float] = field(default_factory=list)  # every episode, worker order within an update
    last_gradient: Any = None  # the summed gradient of the last update
    extra: dict[str, Any] = field(default_factory=dict)


def worker_generator(seed: int, worker: int) -> Any:
    from popplay.agents import networks

    return networks.generator(seed * 1_000_003 + 17 * (worker + 1))


def worker_episode(policy: Any, env: Any, generator: Any, seed: int, worker: int, index: int, gamma: float,
                   max_steps: int) -> tuple[Any, float, int]:
    """Worker ``worker``'s episode ``index`` with ``policy``: (flat gradient, reward, steps)."""
    from popplay.agents.reinforce import SampledPolicy, episode_gradient
    from popplay.envs.rollout import episode_seed, play_episodes

    episodes = play_episodes(env, SampledPolicy(policy, generator), [episode_seed(seed, worker + 1, index)],
                             max_steps=max_steps)
    grad, _ = episode_gradient(policy, episodes.obs, episodes.action, episodes.reward, gamma)
    return grad, float(episodes.returns[0]), episodes.steps


class ReinforceExperiment(DeepExperiment):
    """The runner's view of a REINFORCE run; one phase is one server update."""

    domain = "reinforce"

    def __init__(self, params: ReinforceParams, backend: Any) -> None:
        from popplay import envs

        self._open(params, backend)
        envs.require_discrete(self.info, "reinforce")
        self._dist: Any = None  # the process group when the workers are ranks
        if params.topology == "server":
            from popplay.distributed.group import current

            if current().distributed:
                self._dist = current()
        self._closed = False

    def close(self, state: ReinforceState) -> None:
        """Tell the workers to stop (once; nothing to do in one process)."""
        if self._dist is not None and not self._closed:
            from popplay.topologies.reinforce_ranks import server_stop

            server_stop(self._dist, state.policy)
        self._closed = True

    def initial_state(self) -> ReinforceState:
        import torch

        from popplay.agents.reinforce import policy_network

        policy = policy_network(self.params.seed, self.info.obs_dim, int(self.info.actions), self.config)
        optimizer = torch.optim.Adam(policy.parameters(), lr=self.config.lr)
        return ReinforceState(policy=policy, optimizer=optimizer,
                              generators=[worker_generator(self.params.seed, w) for w in range(self.params.workers)],
                              running=np.zeros(self.params.workers))

    def _done(self, state: ReinforceState) -> int:
        return state.updates  # the episodes budget counts server updates

    def phase(self, state: ReinforceState, *, time_left: float | None) -> ReinforceState:
        from popplay.agents import networks

        p = self.params
        if self._dist is not None:
            from popplay.topologies.reinforce_ranks import server_round

            grads, rewards, steps = server_round(self._dist, state.policy, p.workers, p.timeout)
        else:
            grads, rewards, steps = [], [], []
            for w in range(p.workers):
                g, r, n = worker_episode(state.policy, self._env, state.generators[w], p.seed, w, state.updates,
                                         p.gamma, p.max_steps)
                grads.append(g)
                rewards.append(r)
                steps.append(n)
        total = grads[0].clone()
        for g in grads[1:]:  # worker order: the same bits however the workers ran
            total += g
        networks.set_flat_gradients(state.policy, total)
        state.optimizer.step()
        state.last_gradient = total
        for w, r in enumerate(rewards):
            state.running[w] = 0.05 * r + 0.95 * state.running[w]
        state.updates += 1
        state.episodes += len(rewards)
        state.env_steps += int(sum(steps))
        state.returns.extend(float(r) for r in rewards)
        state.running_curve.append(float(state.running.mean()))
        return state

    def measure(self, state: ReinforceState) -> dict[str, float]:
        return {"running_reward": float(state.running.mean()), "return": recent_mean(state.returns)}

    def state_arrays(self, state: ReinforceState) -> dict[str, Any]:
        from popplay.agents import networks

        self._note(state)
        out = {**networks.module_arrays(state.policy, "policy"),
               **networks.optimizer_arrays(state.optimizer, "adam"),
               "running": state.running.astype(np.float64),
               "running_curve": np.asarray(state.running_curve, dtype=np.float64),
               "episode_returns": np.asarray(state.returns, dtype=np.float64)}
        for w, g in enumerate(state.generators):
            out[f"rng.worker{w}"] = networks.generator_array(g)
        if state.last_gradient is not None:
            out["last_gradient"] = state.last_gradient.numpy().astype(np.float32)
        return out

    def state_counters(self, state: ReinforceState) -> dict[str, Any]:
        return {"updates": state.updates, "episodes": state.episodes, "env_steps": state.env_steps,
                **topology_counters(state.extra)}

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> ReinforceState:
        import torch

        from popplay.agents import networks

        state = self.initial_state()
        networks.load_module_arrays(state.policy, "policy", arrays)
        networks.load_optimizer_arrays(state.optimizer, "adam", arrays)
        running = np.asarray(arrays["running"], dtype=np.float64)
        if running.shape != (self.params.workers,):
            raise ValueError(f"running rewards of {running.shape[0]} workers stored for {self.params.workers}")
        state.running = running.copy()
        state.running_curve = [float(v) for v in arrays["running_curve"]]
        state.returns = [float(v) for v in arrays["episode_returns"]]
        for w, g in enumerate(state.generators):
            networks.load_generator(g, arrays[f"rng.worker{w}"])
        if "last_gradient" in arrays:
            state.last_gradient = torch.as_tensor(arrays["last_gradient"])
        state.updates = int(counters["updates"])
        state.episodes = int(counters["episodes"])
        state.env_steps = int(counters["env_steps"])
        state.extra = topology_extra(counters)
        self._note(state)
        return state

    def summary_extras(self, state: ReinforceState) -> dict[str, Any]:
        return {"running_reward": float(state.running.mean()), "updates": state.updates, "workers": self.params.workers,
                "return": recent_mean(state.returns)}

    def quality(self, state: ReinforceState, episodes: int | None = None) -> float:
        n = self.params.eval_episodes if episodes is None else episodes
        if n == 0:
            return float("nan")
        return float(self.returns_of_greedy(state, n, self.params.seed).mean())

    def returns_of_greedy(self, state: ReinforceState, episodes: int, seed: int) -> np.ndarray:
        """Greedy: the most probable action (evaluation only; training samples)."""
        from popplay.agents.dqn import greedy_policy
        from popplay.topologies.common import greedy_quality

        return greedy_quality(self.params.env, greedy_policy(state.policy), episodes, seed)[1]

"""REINFORCE with a synchronous parameter server (the parameter-server draft).

Every update the server (rank 0) broadcasts the policy's parameters; each worker
(ranks 1..N) plays one episode in its own environment with them, computes the
gradient of its REINFORCE loss (:mod:`popplay.deep.agents.reinforce`) and sends it back;
the server gathers the gradients, sums them in worker order and steps Adam. With
``topology="local"`` the same workers run one after another inside one process (the
same episodes, the same sum; what the reproduction uses on a small machine and what
``--resume`` continues exactly).

Worker w's episode u is reset with ``episode_seed(seed, w + 1, u)`` and samples its
actions from its own generator, so a run depends only on the seed and the number of
workers, not on which process plays which worker. The running reward is the parameter-server draft's,
R ← 0.05·reward + 0.95·R, kept per worker; ``running_reward`` is their mean.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from popplay.core.errors import UsageError
from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.adam import Adam
from popplay.deep.agents.dqn import greedy_policy
from popplay.deep.agents.reinforce import (
    policy_network,
    worker_episode,
    worker_generator,
)
from popplay.deep.agents.reinforce_members import ReinforceMembers
from popplay.deep.topologies.base import (
    DeepExperiment,
    check_finite_arrays,
    topology_counters,
    topology_extra,
)
from popplay.deep.topologies.common import greedy_quality, recent_mean
from popplay.deep.topologies.exarl import OnPolicyWorkflowExperiment
from popplay.deep.topologies.families import family_of
from popplay.deep.topologies.population import PopulationExperiment
from popplay.deep.topologies.reinforce_params import (  # noqa: F401
    REINFORCE_HYPER_BOUNDS,
    REINFORCE_TOPOLOGIES,
    SPEC,
    ReinforceParams,
)
from popplay.deep.topologies.reinforce_ranks import server_round, server_stop, worker_loop
from popplay.distributed.group import current


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


class ReinforceExperiment(DeepExperiment):
    """The runner's view of a REINFORCE run; one phase is one server update. EXARL's
    workflows run it as any on-policy agent
    (:class:`popplay.deep.topologies.exarl.OnPolicyWorkflowExperiment`)."""

    domain = "reinforce"

    def __new__(cls, params: Any, backend: Any) -> Any:
        if cls is ReinforceExperiment and getattr(params, "agents", 1) > 1:
            return ReinforcePopulation(params, backend)
        if family_of(params) is not None:
            return OnPolicyWorkflowExperiment(params, backend)
        return super().__new__(cls)

    def __init__(self, params: ReinforceParams, backend: Any) -> None:
        self._open(params, backend)
        envs.require_discrete(self.info, "reinforce")
        self._dist: Any = None  # the process group when the workers are ranks
        if params.topology == "server":

            if current().distributed:
                self._dist = current()
        self._closed = False

    @staticmethod
    def role(params: Any, rank: int) -> str:
        if family_of(params) is not None:
            return OnPolicyWorkflowExperiment.role(params, rank)
        return "server" if rank == 0 else f"worker {rank}"

    @staticmethod
    def serve(dist: Any, params: Any, resume: Any) -> None:
        if family_of(params) is not None:
            OnPolicyWorkflowExperiment.serve(dist, params, resume)
        else:
            worker_loop(dist, params, resume)

    @staticmethod
    def resume_problem(params: Any) -> str | None:
        return OnPolicyWorkflowExperiment.resume_problem(params)

    def close(self, state: ReinforceState) -> None:
        """Tell the workers to stop (once; nothing to do in one process)."""
        if self._dist is not None and not self._closed:

            server_stop(self._dist, state.policy)
        self._closed = True

    def initial_state(self) -> ReinforceState:
        policy = policy_network(self.params.seed, self.info.obs_dim, int(self.info.actions), self.config)
        optimizer = Adam(policy.parameters(), lr=self.config.lr)
        return ReinforceState(policy=policy, optimizer=optimizer,
                              generators=[worker_generator(self.params.seed, w) for w in range(self.params.workers)],
                              running=np.zeros(self.params.workers))

    def _done(self, state: ReinforceState) -> int:
        return state.updates  # the episodes budget counts server updates

    def phase(self, state: ReinforceState, *, time_left: float | None) -> ReinforceState:
        p = self.params
        if self._dist is not None:

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
        self._note(state)
        out = {**networks.module_arrays(state.policy, "policy"),
               **state.optimizer.arrays("adam"),
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
        check_finite_arrays(arrays)
        state = self.initial_state()
        networks.load_module_arrays(state.policy, "policy", arrays)
        state.optimizer.load(arrays, "adam")
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

        return greedy_quality(self.params.env, greedy_policy(state.policy), episodes, seed)[1]


class ReinforcePopulation(PopulationExperiment):
    """``--agents`` P REINFORCE learners batched in one process, one environment each
    (:mod:`popplay.deep.agents.reinforce_members`)."""

    domain = "reinforce"
    hyper_bounds = REINFORCE_HYPER_BOUNDS

    def __init__(self, params: ReinforceParams, backend: Any, members: np.ndarray | None = None) -> None:
        super().__init__(params, backend, members)
        envs.require_discrete(self.info, "reinforce")
        limit = envs.time_limit(params.env)
        if limit is None or limit > params.max_steps:
            # the members' episode buffers hold whole episodes; an environment cuts its own
            raise UsageError(f"--env {params.env}: a REINFORCE population learns from whole episodes and needs a "
                             f"time limit of at most --max-steps {params.max_steps} (this environment's: "
                             f"{limit if limit is not None else 'none'})")
        self.horizon = limit

    def new_learner(self, members: np.ndarray, hypers: dict[str, np.ndarray]) -> ReinforceMembers:
        return ReinforceMembers(self.params, self.info.obs_dim, int(self.info.actions), self.params.seed, members,
                                hypers, self.horizon, device=self.device, init_from=self.initial_networks(members))

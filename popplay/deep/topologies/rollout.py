"""The ``sequential`` topology of rollout agents (PPO, and any agent with the same
protocol): fixed-length rollouts of ``n_steps`` on each of ``copies`` environments,
played with the agent's current policy, then one ``learn`` call, in one process.

This is how stable-baselines3 (``collect_rollouts`` / ``train``) and CleanRL run PPO,
and unlike :mod:`popplay.deep.topologies.exarl` (whole episodes per phase) an episode
runs on across phases. Each copy still resets with a seed of its own
(:func:`popplay.deep.envs.rollout.episode_seed` of the run's seed, the copy and the
copy's episode count) rather than gymnasium's autoreset stream, so that an episode
depends only on the run's seed, its index and the actions taken.

That is what resumes a run exactly without pickling environments: the run file
stores, per copy, the episode index and the actions taken since it began; a restore
resets the copy with that episode's seed and replays the actions, then checks that
it arrives at the stored observation (an environment that is not deterministic given
its seed and actions is refused in one line).

The agent protocol (duck-typed; see :class:`popplay.deep.agents.ppo.PPO`):

- ``params.new_learner(info)`` builds it; ``params.rollout_fields`` says which of the
  rollout's fields it reads;
- ``act(obs, generator) -> (actions, log_prob, value)``, ``value_of(obs)``,
  ``greedy(obs)``;
- ``learn(rollout, progress_remaining)`` with a time-major ``Rollout``;
- ``arrays()``, ``counters()``, ``load(arrays, counters)`` and ``updates``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from popplay.deep import envs
from popplay.deep.agents import networks
from popplay.deep.agents.ppo_members import PPOMembers
from popplay.deep.agents.ppo_params import HYPER_BOUNDS
from popplay.deep.agents.rollout import Rollout
from popplay.deep.envs.rollout import episode_seed
from popplay.deep.topologies.base import DeepExperiment, check_finite_arrays, curve_arrays, restore_progress
from popplay.deep.topologies.common import greedy_quality, recent_mean
from popplay.deep.topologies.exarl import OnPolicyWorkflowExperiment
from popplay.deep.topologies.population import ActorCriticPopulation


@dataclass
class RolloutState:
    agent: Any
    explore: torch.Generator  # the policy's action draws
    obs: np.ndarray  # (copies, obs_dim) float32: what each copy shows now
    copy_episode: np.ndarray  # (copies,) int64: index of each copy's current episode
    copy_actions: list[list[Any]]  # the actions of each copy's current episode so far
    copy_return: np.ndarray  # (copies,) float64
    phases: int = 0
    episodes: int = 0
    env_steps: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


class RolloutExperiment(DeepExperiment):
    """Fixed-length rollouts on ``params.copies`` environments, one ``learn`` a phase;
    with ``params.workflow`` other than sequential, EXARL's workflow instead
    (:class:`popplay.deep.topologies.exarl.OnPolicyWorkflowExperiment`, the agent's
    ``learn_shared``)."""

    def __new__(cls, params: Any, backend: Any) -> Any:
        # One plug-in, three layouts: the registry builds this class, which hands a
        # multi-process workflow to EXARL's experiment (its ranks, roles and rounds)
        # and a population (--agents P) to PPOPopulation.
        if getattr(params, "workflow", "sequential") != "sequential":
            return OnPolicyWorkflowExperiment(params, backend)
        if getattr(params, "agents", 1) > 1:
            return PPOPopulation(params, backend)
        return super().__new__(cls)

    @staticmethod
    def role(params: Any, rank: int) -> str:
        return OnPolicyWorkflowExperiment.role(params, rank)

    @staticmethod
    def serve(dist: Any, params: Any, resume: Any) -> None:
        OnPolicyWorkflowExperiment.serve(dist, params, resume)

    @staticmethod
    def resume_problem(params: Any) -> str | None:
        """Why a run of ``params`` cannot be resumed (None: it can)."""
        if getattr(params, "workflow", "sequential") != "sequential":
            return OnPolicyWorkflowExperiment.resume_problem(params)
        return None

    def __init__(self, params: Any, backend: Any) -> None:
        torch.set_num_threads(1)  # tiny networks: intra-op threads only spin against each other
        params.validate()
        self.params = params
        self.backend = backend
        self.domain = params.domain
        self._envs = [envs.make_single(params.env) for _ in range(params.copies)]
        self.info = envs.describe_single(self._envs[0], params.env)
        envs.require_discrete(self.info, params.domain)

    # --- state ----------------------------------------------------------------------
    def initial_state(self) -> RolloutState:
        p = self.params
        obs = np.stack([self._reset(c, 0) for c in range(p.copies)])
        return RolloutState(agent=p.new_learner(self.info), explore=networks.generator(p.seed * 7919 + 5), obs=obs,
                            copy_episode=np.zeros(p.copies, dtype=np.int64),
                            copy_actions=[[] for _ in range(p.copies)], copy_return=np.zeros(p.copies))

    def _reset(self, copy: int, episode: int) -> np.ndarray:
        obs, _ = self._envs[copy].reset(seed=episode_seed(self.params.seed, copy, episode))
        return np.asarray(obs, dtype=np.float32)

    # --- a phase --------------------------------------------------------------------
    def phase(self, state: RolloutState, *, time_left: float | None) -> RolloutState:
        p, agent = self.params, state.agent
        T, B, D = p.n_steps, p.copies, self.info.obs_dim
        obs_rows = np.empty((T, B, D), dtype=np.float32)
        action_rows = np.empty((T, B), dtype=np.int64)
        reward_rows = np.empty((T, B), dtype=np.float32)
        start_rows = np.empty((T, B), dtype=np.float32)
        log_probs, values = [], []
        episode_start = np.array([len(a) == 0 for a in state.copy_actions], dtype=np.float32)
        obs = state.obs
        for t in range(T):
            actions, log_prob, value = agent.act(obs, state.explore)
            obs_rows[t], action_rows[t], start_rows[t] = obs, actions, episode_start
            log_probs.append(log_prob)
            values.append(value)
            obs, rewards, episode_start, cut = self._step(state, actions)
            if cut:  # a time limit is not an end: bootstrap from the state it cut (SB3, CleanRL)
                finals = np.stack([final for _, final in cut])
                bootstrap = agent.value_of(finals).numpy()
                for (copy, _), v in zip(cut, bootstrap):
                    rewards[copy] += p.gamma * v
            reward_rows[t] = rewards
        state.obs = obs
        last_value = agent.value_of(obs)
        rollout = Rollout(obs=torch.from_numpy(obs_rows), action=torch.from_numpy(action_rows),
                          log_prob=torch.stack(log_probs), value=torch.stack(values),
                          reward=torch.from_numpy(reward_rows), episode_start=torch.from_numpy(start_rows),
                          last_value=last_value, last_episode_start=torch.from_numpy(episode_start))
        state.env_steps += T * B
        agent.learn(rollout, self._progress_remaining(state))
        state.phases += 1
        return state

    def _step(self, state: RolloutState, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
        """One step of every copy; a finished copy records its episode and resets."""
        B = self.params.copies
        next_obs = np.empty_like(state.obs)
        rewards = np.empty(B, dtype=np.float32)
        started = np.zeros(B, dtype=np.float32)
        cut: list[tuple[int, np.ndarray]] = []
        for c in range(B):
            action = actions[c].item()
            obs, reward, terminated, truncated, _ = self._envs[c].step(action)
            state.copy_actions[c].append(action)
            state.copy_return[c] += reward
            rewards[c] = reward
            if terminated or truncated:
                if truncated and not terminated:
                    cut.append((c, np.asarray(obs, dtype=np.float32)))
                state.returns.append(float(state.copy_return[c]))
                state.lengths.append(len(state.copy_actions[c]))
                state.episodes += 1
                state.copy_episode[c] += 1
                state.copy_actions[c] = []
                state.copy_return[c] = 0.0
                obs = self._reset(c, int(state.copy_episode[c]))
                started[c] = 1.0
            next_obs[c] = obs
        return next_obs, rewards, started, cut

    def _progress_remaining(self, state: RolloutState) -> float:
        """1 at the start of an env-steps budget, 0 at its end (schedules anneal over
        it, as SB3's do); 1 throughout with an episode budget alone."""
        budget = self.params.env_steps
        return max(0.0, 1.0 - state.env_steps / budget) if budget else 1.0

    # --- what the pipeline shows and stores -----------------------------------------
    def measure(self, state: RolloutState) -> dict[str, float]:
        return {"return": recent_mean(state.returns), "updates": float(state.agent.updates)}

    def state_arrays(self, state: RolloutState) -> dict[str, Any]:
        self._note(state)
        longest = max(1, max(len(a) for a in state.copy_actions))
        actions = np.zeros((self.params.copies, longest), dtype=np.int64)
        for c, taken in enumerate(state.copy_actions):
            actions[c, :len(taken)] = taken
        return {**state.agent.arrays(), "rng.explore": networks.generator_array(state.explore),
                "copies.obs": state.obs.copy(), "copies.episode": state.copy_episode.copy(),
                "copies.actions": actions,
                "copies.steps": np.array([len(a) for a in state.copy_actions], dtype=np.int64),
                "copies.return": state.copy_return.copy(), **curve_arrays(state)}

    def state_counters(self, state: RolloutState) -> dict[str, Any]:
        return {**state.agent.counters(), "phases": state.phases, "episodes": state.episodes,
                "env_steps": state.env_steps}

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> RolloutState:
        check_finite_arrays(arrays)
        p = self.params
        state = self.initial_state()
        state.agent.load(arrays, counters)
        networks.load_generator(state.explore, arrays["rng.explore"])
        episode = np.asarray(arrays["copies.episode"], dtype=np.int64)
        steps = np.asarray(arrays["copies.steps"], dtype=np.int64)
        taken = np.asarray(arrays["copies.actions"], dtype=np.int64)
        stored_obs = np.asarray(arrays["copies.obs"], dtype=np.float32)
        if episode.shape != (p.copies,) or steps.shape != (p.copies,) or stored_obs.shape != state.obs.shape \
                or taken.ndim != 2 or taken.shape[0] != p.copies or (steps < 0).any() or (steps > taken.shape[1]).any():
            raise ValueError("the environment copies' arrays disagree with --copies")
        for c in range(p.copies):
            obs = self._reset(c, int(episode[c]))
            for a in taken[c, :steps[c]]:
                obs, *_ = self._envs[c].step(int(a))
            if not np.array_equal(np.asarray(obs, dtype=np.float32), stored_obs[c]):
                raise ValueError(f"--env {p.env} did not replay to the stored state (it is not deterministic "
                                 "given its seed and actions), so this run cannot resume exactly")
            state.copy_actions[c] = [int(a) for a in taken[c, :steps[c]]]
        state.obs = stored_obs.copy()
        state.copy_episode = episode.copy()
        state.copy_return = np.asarray(arrays["copies.return"], dtype=np.float64).copy()
        restore_progress(state, arrays, counters)
        self._note(state)
        return state

    def summary_fields(self, state: RolloutState, seconds: float) -> dict[str, Any]:
        fields = super().summary_fields(state, seconds)
        fields["topology"] = "sequential"
        return fields

    def summary_extras(self, state: RolloutState) -> dict[str, Any]:
        return {"return": recent_mean(state.returns), "updates": state.agent.updates}

    def quality(self, state: RolloutState, episodes: int | None = None) -> float:
        """Mean return of the greedy policy over ``eval_episodes`` episodes; NaN for 0."""
        n = self.params.eval_episodes if episodes is None else episodes
        if n == 0:
            return math.nan
        return greedy_quality(self.params.env, state.agent.greedy, n, self.params.seed)[0]

    def returns_of_greedy(self, state: RolloutState, episodes: int, seed: int) -> np.ndarray:
        return greedy_quality(self.params.env, state.agent.greedy, episodes, seed)[1]



class PPOPopulation(ActorCriticPopulation):
    """``--agents`` P PPO learners batched in one process, ``--copies`` environments
    each (:mod:`popplay.deep.topologies.population`)."""

    domain = "ppo"
    hyper_bounds = HYPER_BOUNDS
    learner_class = PPOMembers

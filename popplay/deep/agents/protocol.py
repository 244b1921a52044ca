"""What a topology may ask of an agent: the two protocols every deep agent meets.

A topology (:mod:`popplay.deep.topologies`) never names an agent. It builds the
learner with ``params.new_learner(info)`` (every rank builds the same one from the
seed), ships the weights of ``policy`` to whoever acts, and talks to the agent only
through one of these protocols, so that any replay agent runs in any replay topology
and any on-policy agent in any on-policy one (TorchRL's collector / replay / loss
split, stable-baselines3's ``collect_rollouts`` / ``train``).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn


class Explorer(Protocol):
    """The acting side of a replay agent: actions for a batch of observations, with a
    schedule value ``exploration`` that the learner's update count sets."""

    exploration: float

    def __call__(self, obs: np.ndarray) -> np.ndarray: ...


class ReplayAgent(Protocol):
    """An off-policy learner (DQN, TD3, DDPG): it stores the transitions it is given
    and owes ``update_ratio`` updates per transition (:class:`~popplay.deep.agents.credit.UpdateCredit`).

    Transitions travel as float64 rows ``[obs, action (action_dim), reward, next_obs,
    terminated]`` (:func:`popplay.deep.agents.replay.episode_rows`; ``discrete``:
    the action is an index)."""

    on_policy: bool  # False
    discrete: bool
    action_dim: int
    config: Any  # with learning_starts, update_ratio
    replay: Any
    updates: int
    received: int
    update_credit: float

    @property
    def policy(self) -> nn.Module: ...

    def networks(self) -> nn.Module: ...

    def exploration_at(self, updates: int) -> float:
        """The explorer's schedule value once the learner has made ``updates`` updates
        (an actor holding weights of that version acts with it)."""
        ...

    def explorer(self, policy: nn.Module, generator: torch.Generator) -> Explorer:
        """An explorer acting with ``policy`` (the learner's own, or an actor's copy whose
        weights are loaded in place), drawing from ``generator``."""
        ...

    def receive(self, batch: Any) -> None: ...

    def owed_updates(self) -> int: ...

    def train(self, max_updates: int | None = None) -> int: ...

    def update(self) -> Any: ...

    def average_gradients(self, reduce: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
        """From now on, every gradient step uses ``reduce(flat gradient, weight)``
        (data-parallel learners: the weighted mean over the learners). The weight is 1,
        or 0 where the learner holds no replay yet and steps on a blank batch."""
        ...


class OnPolicyAgent(Protocol):
    """An on-policy learner (A2C, PPO): it learns from whole trajectories of the policy
    it ships, ``learn_shared(trajectory or None, peers)`` making every collective with
    its peers (:class:`popplay.deep.topologies.exarl_ranks.Peers`)."""

    on_policy: bool  # True
    updates: int
    received: int

    @property
    def policy(self) -> nn.Module: ...

    def networks(self) -> nn.Module: ...

    def learn_shared(self, trajectory: Any, peers: Any) -> None: ...


class ServerExplorer(Protocol):
    """An actor's side of a parameter-server agent: it acts with the weights last
    pulled from the servers."""

    def load(self, vector: torch.Tensor, server_version: int) -> None:
        """Act from now on with the parameter ``vector`` the servers held at ``server_version``
        (the version sets the exploration schedule)."""
        ...

    def __call__(self, obs: np.ndarray) -> np.ndarray: ...


class ServerAgent(Protocol):
    """An off-policy agent as a parameter-server topology (Gorila) runs it: its online
    networks are one flat vector the servers hold and update; its learners compute the
    gradient of the agent's loss at the vector they last pulled, against the target
    vector they last refreshed; its actors act from the vector they last pulled.

    Transitions travel as the rows of :class:`ReplayAgent` (``discrete``: the action is
    an index; ``action_dim`` columns otherwise)."""

    discrete: bool
    action_dim: int
    max_grad_norm: float  # the norm the agent clips its gradients to (0: none), after the topology's outlier check

    def initial(self) -> torch.Tensor:
        """The starting vector, the same on every rank (drawn from the seed alone)."""
        ...

    def load_online(self, vector: torch.Tensor) -> None: ...

    def load_target(self, vector: torch.Tensor) -> None: ...

    def gradient(self, batch: Any, step: int, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        """The flat gradient of the loss on ``batch`` (laid out as the vector) and the
        loss; ``step``: this learner's updates before this one (schedules such as TD3's
        delayed actor); ``generator``: the learner's own draws (target smoothing)."""
        ...

    def explorer(self, generator: torch.Generator) -> ServerExplorer: ...

    def greedy(self, vector: torch.Tensor) -> Callable[[np.ndarray], np.ndarray]:
        """The noiseless policy of ``vector``, for evaluation."""
        ...

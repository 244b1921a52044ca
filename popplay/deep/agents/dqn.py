"""Double DQN (van Hasselt et al. 2016) as Grandio's MPI DQN uses it.

The target of a transition (s, a, r, s', done) is equation (1) of the seed,

    y = r + γ (1 - done) Q_target(s', argmax_a' Q_online(s', a')),

the online network picks the next action and the target network values it. The
online network minimises the Huber loss between Q_online(s, a) and y over uniform
replay minibatches (Adam, gradients clipped to a norm); the target network is a copy
of the online one refreshed every ``target_every`` updates. Exploration is ε-greedy
with ε falling linearly with *learner updates* from ``epsilon_start`` to
``epsilon_end`` over ``epsilon_updates`` (Grandio §III-D: tying ε to training, not to
simulation, keeps fast early simulators from ending exploration before anything is
learned; every topology uses the same rule).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from popplay.deep.agents import networks
from popplay.deep.agents.config import DQNConfig
from popplay.deep.agents.credit import UpdateCredit
from popplay.deep.agents.flat import FlatAdam, FlatMLP, clip_norm_
from popplay.deep.agents.replay import Batch, ReplayBuffer


def epsilon(updates: int, config: DQNConfig) -> float:
    """ε after ``updates`` learner updates (linear, then flat at ``epsilon_end``)."""
    fraction = min(1.0, updates / config.epsilon_updates)
    return config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)


def learning_rate(updates: int, config: DQNConfig) -> float:
    """Adam's step size for update number ``updates`` + 1: ``lr`` falling linearly to
    ``lr_end`` over ``lr_updates`` updates (constant when ``lr_updates`` is 0). Offered
    because a falling rate can let the Q-network settle late in training instead of
    swinging between good and collapsed policies; on CartPole it rescued some seeds and
    lost others (docs/deep.md), so it is off by default."""
    if config.lr_updates == 0:
        return config.lr
    fraction = min(1.0, updates / config.lr_updates)
    return config.lr + fraction * (config.lr_end - config.lr)


def double_dqn_targets(batch: Batch, online: nn.Module, target: nn.Module, gamma: float) -> torch.Tensor:
    """Equation (1): y = r + γ (1 - terminated) Q_target(s', argmax_a Q_online(s', a))."""
    with torch.no_grad():
        best = online(batch.next_obs).argmax(dim=1, keepdim=True)
        value = target(batch.next_obs).gather(1, best).squeeze(1)
        return batch.reward + gamma * (1.0 - batch.terminated) * value


def dqn_loss(batch: Batch, online: nn.Module, targets: torch.Tensor) -> torch.Tensor:
    """Huber (smooth L1) loss of Q_online(s, a) against the targets."""
    q = online(batch.obs).gather(1, batch.action.view(-1, 1)).squeeze(1)
    return F.smooth_l1_loss(q, targets)


def double_dqn_gradient(batch: Batch, online: FlatMLP, target: FlatMLP, gamma: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of :func:`dqn_loss` against :func:`double_dqn_targets` with respect to
    ``online``'s flat parameters, written out (no autograd), and the TD errors
    Q_online(s, a) - y (the loss is ``smooth_l1_loss(errors, 0)``).

    One pass of the online network over s and s' stacked (its rows for s' pick the next
    actions), the target's pass over s', the Huber loss's gradient, then
    :meth:`FlatMLP.backward`. The gradient is ``online.grad``, overwritten by the next
    call."""
    n = batch.obs.shape[0]
    states = torch.cat([batch.obs, batch.next_obs])
    hidden: list[torch.Tensor] = []
    q_both = online.forward(states, hidden)
    best = q_both[n:].argmax(dim=1, keepdim=True)
    value = target.forward(batch.next_obs).gather(1, best).squeeze(1)
    targets = batch.reward + gamma * (1.0 - batch.terminated) * value
    action = batch.action.view(-1, 1)
    errors = q_both[:n].gather(1, action).squeeze(1) - targets
    # smooth_l1_loss's gradient (β = 1, mean over the batch): the error clipped to ±1, over n
    grad_q = errors.clamp(-1.0, 1.0).mul_(1.0 / n)
    grad_output = torch.zeros_like(q_both[:n]).scatter_(1, action, grad_q.view(-1, 1))
    return online.backward(states[:n], [h[:n] for h in hidden], grad_output), errors


def huber(errors: torch.Tensor) -> float:
    """:func:`dqn_loss`'s value from the TD errors :func:`double_dqn_gradient` returns."""
    return float(F.smooth_l1_loss(errors, torch.zeros_like(errors)))


@dataclass
class DoubleDQN(UpdateCredit):
    """The learner's state: online and target networks, Adam, the replay buffer and
    the sampling generator, plus counters. Simulators only need :func:`act`."""

    config: DQNConfig
    obs_dim: int
    actions: int
    seed: int
    device: str = "cpu"  # where the networks, Adam and replay live (acting takes and gives CPU arrays)
    online: nn.Module = field(init=False)
    target: nn.Module = field(init=False)
    adam: Any = field(init=False)  # popplay.deep.agents.flat.FlatAdam over the online network
    replay: ReplayBuffer = field(init=False)
    sampler: torch.Generator = field(init=False)
    updates: int = 0
    received: int = 0  # transitions given to the learner
    update_credit: float = 0.0  # updates owed (update_ratio per transition), not yet done
    _last_loss: float = field(default=float("nan"), init=False)
    _last_errors: torch.Tensor | None = field(default=None, init=False, repr=False)  # the latest update's, for last_loss
    _reduce: Callable[[torch.Tensor, float], torch.Tensor] | None = field(default=None, init=False, repr=False)

    #: A replay agent (:class:`popplay.deep.agents.protocol.ReplayAgent`) with action indices.
    on_policy = False
    discrete = True
    action_dim = 1

    def __post_init__(self) -> None:
        # drawn on the CPU from the seed alone, so every device starts from the same weights
        self.online = networks.seeded_mlp(self.seed, self.obs_dim, self.actions, self.config.hidden).to(self.device)
        self.target = networks.seeded_mlp(self.seed, self.obs_dim, self.actions, self.config.hidden).to(self.device)
        # Both networks' parameters move into flat vectors that the written-out update
        # works on (popplay.deep.agents.flat); the modules keep views into them, so acting,
        # broadcasts and run files see the same weights.
        self._online = FlatMLP(self.online)
        self._target = FlatMLP(self.target)
        self._target.vector.copy_(self._online.vector)
        self.adam = FlatAdam(self._online, self.config.lr)
        self.replay = ReplayBuffer(self.config.replay_capacity, self.obs_dim, device=self.device)
        self.sampler = networks.generator(self.seed * 7919 + 1)

    @property
    def epsilon(self) -> float:
        return epsilon(self.updates, self.config)

    # --- the replay agent's side for topologies ---------------------------------------
    @property
    def policy(self) -> nn.Module:
        """The network actors act with (its weights are what topologies ship to them)."""
        return self.online

    def networks(self) -> nn.Module:
        return nn.ModuleList([self.online, self.target])

    def exploration_at(self, updates: int) -> float:
        """ε after ``updates`` learner updates: exploration follows training."""
        return epsilon(updates, self.config)

    def explorer(self, policy: nn.Module, generator: torch.Generator) -> "EpsilonGreedy":
        # The learner's own network acts through its flat kernels; a copy held by an
        # actor is flattened once, so that weights loaded in place reach the kernels too.
        q = self.q_values if policy is self.online else FlatMLP(policy).forward
        return EpsilonGreedy(q, self.actions, generator)

    def average_gradients(self, reduce: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
        """Step along ``reduce(gradient, weight)`` of every update (before clipping; weight
        0 on a blank batch, see :meth:`update`): data-parallel learners pass the weighted
        mean over the learners."""
        self._reduce = reduce

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """The online network's Q values of a CPU batch, on the CPU (no autograd; the
        same kernels as ``online``)."""
        return self._online.forward(obs.to(self.device)).cpu()

    def update(self) -> None:
        """One gradient step on a uniform minibatch (:func:`double_dqn_gradient`,
        clipped to ``max_grad_norm``, then Adam); refreshes the target when due. The
        loss itself is only computed when :attr:`last_loss` is read. A data-parallel
        learner whose replay is still empty takes part in its peers' step on a blank
        batch, whose gradient the mean over the learners weighs 0."""
        config = self.config
        blank = self._reduce is not None and len(self.replay) == 0
        batch = self.replay.blank(config.batch_size) if blank else self.replay.sample(config.batch_size, self.sampler)
        grad, errors = double_dqn_gradient(batch, self._online, self._target, config.gamma)
        if self._reduce is not None:
            grad.copy_(self._reduce(grad, 0.0 if blank else 1.0))
        clip_norm_(grad, config.max_grad_norm)
        self.adam.step(grad, learning_rate(self.updates, config))
        self.updates += 1
        if self.updates % config.target_every == 0:
            self._target.vector.copy_(self._online.vector)
        if not blank:
            self._last_errors = errors

    @property
    def last_loss(self) -> float:
        """The Huber loss of the latest update's minibatch (NaN before any)."""
        if self._last_errors is not None:
            self._last_loss = huber(self._last_errors)
            self._last_errors = None
        return self._last_loss

    @last_loss.setter
    def last_loss(self, value: float) -> None:
        self._last_loss = float(value)
        self._last_errors = None

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        out = {**networks.module_arrays(self.online, "online"), **networks.module_arrays(self.target, "target"),
               **self.adam.arrays("adam"), **self.replay.arrays("replay"),
               "rng.sampler": networks.generator_array(self.sampler)}
        return out

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates, "received": self.received, "update_credit": self.update_credit,
                "replay_added": self.replay.added, "last_loss": self.last_loss}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        networks.load_module_arrays(self.online, "online", arrays)
        networks.load_module_arrays(self.target, "target", arrays)
        self.adam.load(arrays, "adam")
        self.replay.load(arrays, int(counters["replay_added"]), "replay")
        networks.load_generator(self.sampler, arrays["rng.sampler"])
        self.updates = int(counters["updates"])
        self.received = int(counters["received"])
        self.update_credit = float(counters["update_credit"])
        self.last_loss = float(counters.get("last_loss", float("nan")))


class EpsilonGreedy:
    """The acting side of DQN: greedy on a Q function (a network, or any callable from
    an observation batch to Q values), uniform with probability ε. Draws come from its
    own generator (one per simulator), so runs repeat exactly."""

    def __init__(self, q_network: Callable[[torch.Tensor], torch.Tensor], actions: int,
                 generator: torch.Generator) -> None:
        self.q = q_network
        self.actions = actions
        self.generator = generator
        self.epsilon = 1.0

    @property
    def exploration(self) -> float:
        return self.epsilon

    @exploration.setter
    def exploration(self, value: float) -> None:
        self.epsilon = float(value)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        n = obs.shape[0]
        explore = torch.rand(n, generator=self.generator) < self.epsilon
        random = torch.randint(self.actions, (n,), generator=self.generator)
        if bool(explore.all()):
            return random.numpy()
        with torch.no_grad():
            greedy = self.q(torch.as_tensor(obs, dtype=torch.float32)).argmax(dim=1)
        if n == 1:  # one copy (every topology's case), not exploring: no blend to make
            return greedy.numpy()
        return torch.where(explore, random, greedy).numpy()


def greedy_policy(q_network: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Actions maximising Q (ties: the lowest action), for evaluation. ``q_network``: a
    network, or any callable from a CPU observation batch to CPU Q values."""
    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return q_network(torch.as_tensor(obs, dtype=torch.float32)).argmax(dim=1).numpy()
    return act


class DQNServer:
    """Double DQN as a parameter-server topology runs it
    (:class:`~popplay.deep.agents.protocol.ServerAgent`): the vector is the Q-network's,
    the gradient :func:`double_dqn_gradient`'s, and actors are ε-greedy with ε falling
    with the server's version (its applied updates) as :func:`epsilon` does with a
    learner's."""

    discrete = True
    action_dim = 1  # the action index's column in a transition row

    def __init__(self, config: DQNConfig, obs_dim: int, actions: int, seed: int) -> None:
        self.config, self.obs_dim, self.actions, self.seed = config, obs_dim, actions, seed
        self.max_grad_norm = config.max_grad_norm
        self._online, self._target = self._net(), self._net()
        self._online_flat, self._target_flat = FlatMLP(self._online), FlatMLP(self._target)

    def _net(self) -> nn.Sequential:
        return networks.mlp(self.obs_dim, self.actions, self.config.hidden)

    def initial(self) -> torch.Tensor:
        return networks.flat_parameters(networks.seeded_mlp(self.seed, self.obs_dim, self.actions,
                                                            self.config.hidden))

    def load_online(self, vector: torch.Tensor) -> None:
        networks.load_flat_parameters(self._online, vector)

    def load_target(self, vector: torch.Tensor) -> None:
        networks.load_flat_parameters(self._target, vector)

    def gradient(self, batch: Batch, step: int, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        grad, errors = double_dqn_gradient(batch, self._online_flat, self._target_flat, self.config.gamma)
        return grad, huber(errors)

    def explorer(self, generator: torch.Generator) -> "ServerEpsilonGreedy":
        return ServerEpsilonGreedy(self._net(), self.actions, generator, self.config)

    def greedy(self, vector: torch.Tensor) -> Callable[[np.ndarray], np.ndarray]:
        q = self._net()
        networks.load_flat_parameters(q, vector)
        return greedy_policy(q)


class ServerEpsilonGreedy(EpsilonGreedy):
    """:class:`EpsilonGreedy` on pulled parameter vectors, ε set by the server's version."""

    def __init__(self, q_network: nn.Module, actions: int, generator: torch.Generator, config: DQNConfig) -> None:
        super().__init__(q_network, actions, generator)
        self._config = config

    def load(self, vector: torch.Tensor, server_version: int) -> None:
        networks.load_flat_parameters(self.q, vector)
        self.epsilon = epsilon(server_version, self._config)

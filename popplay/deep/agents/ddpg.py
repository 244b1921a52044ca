"""DDPG (Lillicrap et al. 2016): a deterministic actor and a Q critic for continuous actions.

The critic regresses ``Q(s, a)`` on ``y = r + gamma (1 - terminated) Q'(s', mu'(s'))``
under slowly moving (Polyak-averaged) target networks ``Q'`` and ``mu'``; the
actor climbs ``Q(s, mu(s))``. With prioritised replay (``per``) the squared TD
errors are weighted by the draw's importance weights and the TD errors go back as
the items' new priorities (:mod:`popplay.deep.agents.per`), as EXARL's DDPG+PER does.

Batches are :class:`~popplay.deep.agents.replay.Batch` with ``action (B, action_dim)``.
The pieces here (actor, critic, soft update, exploration, the learner's
bookkeeping and run-file arrays) are shared with TD3 (:mod:`popplay.deep.agents.td3`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from popplay.deep.agents import networks
from popplay.deep.agents.adam import Adam
from popplay.deep.agents.config import DDPGConfig
from popplay.deep.agents.credit import UpdateCredit
from popplay.deep.agents.per import PrioritizedReplay
from popplay.deep.agents.replay import Batch, ReplayBuffer


class Actor(nn.Module):
    """``mu(s)``: an MLP squashed by tanh onto the box ``[low, high]``."""

    def __init__(self, obs_dim: int, low: Sequence[float], high: Sequence[float], hidden: Sequence[int]) -> None:
        super().__init__()
        low_t = torch.as_tensor(low, dtype=torch.float32).reshape(-1)
        high_t = torch.as_tensor(high, dtype=torch.float32).reshape(-1)
        if low_t.shape != high_t.shape or not bool((high_t > low_t).all()):
            raise ValueError("the action box needs low < high in every dimension")
        self.net = networks.mlp(obs_dim, low_t.numel(), hidden)
        self.register_buffer("low", low_t)
        self.register_buffer("high", high_t)

    @property
    def scale(self) -> torch.Tensor:
        return (self.high - self.low) / 2

    def clip(self, action: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(action, self.high), self.low)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.low + (torch.tanh(self.net(obs)) + 1) * self.scale


class Critic(nn.Module):
    """``Q(s, a)``: an MLP over the concatenated observation and action; shape ``(B,)``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.net = networks.mlp(obs_dim + action_dim, 1, hidden)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, action], dim=-1)).squeeze(-1)


def frozen_copy(module: nn.Module) -> nn.Module:
    """A target network: same class and weights, no gradients."""
    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging ``target <- tau source + (1 - tau) target``, parameter by parameter."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1] (got {tau})")
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.mul_(1.0 - tau).add_(s, alpha=tau)


def weighted_mse(errors: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    sq = errors.pow(2)
    return (sq * weights).mean() if weights is not None else sq.mean()


class GaussianExplorer:
    """The acting side: ``mu(s)`` plus Gaussian noise of ``noise`` action half-ranges,
    kept in the box; uniform over the box while ``uniform`` is set (before the learner
    has updated, as TD3's authors start). Draws come from its own generator."""

    def __init__(self, actor: Actor, noise: float, generator: torch.Generator) -> None:
        self.actor = actor
        self.noise = noise
        self.generator = generator
        self.uniform = True

    @property
    def exploration(self) -> float:
        """The replay agents' explorer schedule (:meth:`ContinuousLearner.exploration_at`):
        1 while actions are uniform, 0 once they follow ``mu(s)`` plus noise."""
        return float(self.uniform)

    @exploration.setter
    def exploration(self, value: float) -> None:
        self.uniform = value > 0

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        n = obs.shape[0]
        shape = (n, self.actor.low.numel())
        if self.uniform:
            u = torch.rand(shape, generator=self.generator)
            return (self.actor.low + u * (self.actor.high - self.actor.low)).numpy()
        noise = torch.randn(shape, generator=self.generator) * self.noise * self.actor.scale
        with torch.no_grad():
            action = self.actor(torch.as_tensor(obs, dtype=torch.float32))
        return self.actor.clip(action + noise).numpy()


def deterministic_policy(actor: Actor) -> Callable[[np.ndarray], np.ndarray]:
    """``mu(s)`` without noise, for evaluation."""
    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return actor(torch.as_tensor(obs, dtype=torch.float32)).numpy()
    return act


class ContinuousLearner(UpdateCredit):
    """Bookkeeping shared by DDPG and TD3: replay (uniform or prioritised), update
    credit, and the run-file arrays of every network, optimiser and generator.
    Subclasses list them in :meth:`modules`, :meth:`optimizers`, :meth:`generators`
    and implement :meth:`learn` on one batch."""

    config: Any
    obs_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    seed: int
    replay: ReplayBuffer
    sampler: torch.Generator

    def _init_replay(self) -> None:
        cfg = self.config
        action_dim = len(self.action_low)
        if getattr(cfg, "per", False):
            self.replay = PrioritizedReplay(cfg.replay_capacity, self.obs_dim, action_dim, alpha=cfg.per_alpha,
                                            beta0=cfg.per_beta0, beta_steps=cfg.per_beta_updates)
        else:
            self.replay = ReplayBuffer(cfg.replay_capacity, self.obs_dim, action_dim)
        self.sampler = networks.generator(self.seed * 7919 + 1)
        self.updates = 0
        self.received = 0
        self.update_credit = 0.0
        self.last_loss = float("nan")
        self.data_parallel = False  # set by average_gradients
        self.blank_step = False  # an update on a blank batch is under way

    #: A replay agent (:class:`popplay.deep.agents.protocol.ReplayAgent`).
    on_policy = False
    discrete = False

    @property
    def action_dim(self) -> int:
        return len(self.action_low)

    @property
    def policy(self) -> nn.Module:
        """The network actors act with (its weights are what workflows ship to them)."""
        return self.actor  # type: ignore[attr-defined]

    @staticmethod
    def exploration_at(updates: int) -> float:
        """Uniform actions until the learner's first update (as TD3's authors start)."""
        return 1.0 if updates == 0 else 0.0

    def explorer(self, policy: nn.Module, generator: torch.Generator) -> GaussianExplorer:
        return GaussianExplorer(policy, self.config.exploration_noise, generator)

    def average_gradients(self, reduce: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
        """Before every optimiser step, replace the gradients by ``reduce(flat, weight)``
        (all of a step's parameters in one flat vector; weight 0 on a blank batch, see
        :meth:`update`): data-parallel learners pass the weighted mean over the learners."""

        def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            params = [q for g in optimizer.param_groups for q in g["params"]]
            flat = reduce(torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1)
                                     for q in params]), 0.0 if self.blank_step else 1.0)
            offset = 0
            for q in params:
                q.grad = flat[offset:offset + q.numel()].view_as(q).clone()
                offset += q.numel()

        for optimizer in self.optimizers().values():
            optimizer.register_step_pre_hook(hook)
        self.data_parallel = True

    def networks(self) -> nn.Module:
        """Every network, targets included (for checksums of the learners' copies)."""
        return nn.ModuleList(list(self.modules().values()))

    def modules(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def optimizers(self) -> dict[str, Adam]:
        raise NotImplementedError

    def generators(self) -> dict[str, torch.Generator]:
        return {"sampler": self.sampler}

    def learn(self, batch: Batch, weights: torch.Tensor | None) -> Any:
        raise NotImplementedError

    def critic_loss(self, batch: Batch, weights: torch.Tensor | None,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The critics' loss against the target networks' ``y``, with the TD errors
        ``y - Q(s, a)`` (of the first critic) and ``y``; ``generator``: the draws of
        target smoothing where the agent smooths (default: its own)."""
        raise NotImplementedError

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """``-Q(s, mu(s))`` averaged over ``obs`` (the first critic's)."""
        return -self.critics()[0](obs, self.actor(obs)).mean()  # type: ignore[attr-defined]

    def critics(self) -> list[nn.Module]:
        raise NotImplementedError

    def actor_due(self, updates: int) -> bool:
        """Whether critic step number ``updates`` (from 1) also moves the actor."""
        return True

    def update(self) -> float:
        """One update on a replay minibatch (prioritised: weighted, then re-prioritised).
        A data-parallel learner whose replay is still empty takes part in its peers' step
        on a blank batch, whose gradient the mean over the learners weighs 0."""
        if self.data_parallel and len(self.replay) == 0:
            self.blank_step = True
            try:
                self.learn(self.replay.blank(self.config.batch_size), None)
            finally:
                self.blank_step = False
            return self.last_loss
        if isinstance(self.replay, PrioritizedReplay):
            draw = self.replay.sample_prioritized(self.config.batch_size, self.sampler)
            stats = self.learn(draw.batch, draw.weights)
            self.replay.update_priorities(draw.indices, stats.td_errors)
        else:
            stats = self.learn(self.replay.sample(self.config.batch_size, self.sampler), None)
        self.last_loss = stats.critic_loss
        return self.last_loss

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name, module in self.modules().items():
            out.update(networks.module_arrays(module, name))
        for name, opt in self.optimizers().items():
            out.update(opt.arrays(name))
        out.update(self.replay.arrays("replay"))
        for name, g in self.generators().items():
            out[f"rng.{name}"] = networks.generator_array(g)
        return out

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates, "received": self.received, "update_credit": self.update_credit,
                "replay_added": self.replay.added, "last_loss": self.last_loss}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        for name, module in self.modules().items():
            networks.load_module_arrays(module, name, arrays)
        for name, opt in self.optimizers().items():
            opt.load(arrays, name)
        self.replay.load(arrays, int(counters["replay_added"]), "replay")
        for name, g in self.generators().items():
            networks.load_generator(g, arrays[f"rng.{name}"])
        self.updates = int(counters["updates"])
        self.received = int(counters["received"])
        self.update_credit = float(counters["update_credit"])
        self.last_loss = float(counters.get("last_loss", float("nan")))


def ddpg_targets(batch: Batch, actor_target: Actor, critic_target: Critic, gamma: float) -> torch.Tensor:
    """``y = r + gamma (1 - terminated) Q'(s', mu'(s'))``, without gradient."""
    with torch.no_grad():
        next_q = critic_target(batch.next_obs, actor_target(batch.next_obs))
        return batch.reward + gamma * (1.0 - batch.terminated) * next_q


@dataclass
class DDPGStats:
    critic_loss: float
    actor_loss: float
    td_errors: torch.Tensor  # (B,), y - Q(s, a) before the step: new priorities under PER
    targets: torch.Tensor  # (B,), y


@dataclass(eq=False)
class DDPG(ContinuousLearner):
    """The learner's state: actor, critic, their targets, Adam for each, replay."""

    config: DDPGConfig
    obs_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    seed: int
    actor: Actor = field(init=False)
    critic: Critic = field(init=False)

    def __post_init__(self) -> None:
        self.config.validate()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.actor = Actor(self.obs_dim, self.action_low, self.action_high, self.config.hidden)
            self.critic = Critic(self.obs_dim, len(self.action_low), self.config.hidden)
        self.actor_target = frozen_copy(self.actor)
        self.critic_target = frozen_copy(self.critic)
        self.actor_opt = Adam(self.actor.parameters(), lr=self.config.actor_lr)
        self.critic_opt = Adam(self.critic.parameters(), lr=self.config.critic_lr)
        self._init_replay()

    def modules(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic,
                "actor_target": self.actor_target, "critic_target": self.critic_target}

    def optimizers(self) -> dict[str, Adam]:
        return {"adam_actor": self.actor_opt, "adam_critic": self.critic_opt}

    def learn(self, batch: Batch, weights: torch.Tensor | None = None) -> DDPGStats:
        return ddpg_update(self, batch, weights)

    def critics(self) -> list[nn.Module]:
        return [self.critic]

    def critic_loss(self, batch: Batch, weights: torch.Tensor | None,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = ddpg_targets(batch, self.actor_target, self.critic_target, self.config.gamma)
        td = y - self.critic(batch.obs, batch.action)
        return weighted_mse(td, weights), td, y


def ddpg_update(agent: DDPG, batch: Batch, weights: torch.Tensor | None = None) -> DDPGStats:
    """One critic step, one actor step and one soft target update.

    ``weights``: importance weights of a prioritised draw (``None``: uniform replay).
    """
    n = batch.obs.shape[0]
    if weights is not None and tuple(weights.shape) != (n,):
        raise ValueError(f"weights have shape {tuple(weights.shape)}, expected ({n},)")
    cfg = agent.config
    critic_loss, td, y = agent.critic_loss(batch, weights)
    agent.critic_opt.zero_grad(set_to_none=True)
    critic_loss.backward()
    agent.critic_opt.step()

    actor_loss = agent.actor_loss(batch.obs)
    agent.actor_opt.zero_grad(set_to_none=True)
    actor_loss.backward()
    # this backward also leaves gradients on the critic; the critic's next zero_grad drops them
    agent.actor_opt.step()

    soft_update(agent.critic_target, agent.critic, cfg.tau)
    soft_update(agent.actor_target, agent.actor, cfg.tau)
    agent.updates += 1
    return DDPGStats(float(critic_loss.detach()), float(actor_loss.detach()), td.detach(), y)


class ContinuousServer:
    """A DDPG-family learner (DDPG, TD3) as a parameter-server topology runs it
    (:class:`~popplay.deep.agents.protocol.ServerAgent`). The vector holds the online
    networks, actor first, then the critics; the target vector, laid out alike, is a
    copy the topology refreshes (a hard update every so many server versions stands in
    for Polyak averaging). Each gradient is the critics' loss's with respect to the
    critics and, on the steps where the agent moves its actor, ``-Q(s, mu(s))``'s with
    respect to the actor (zeros otherwise), both at the same weights."""

    discrete = False
    # DDPG's and TD3's own updates clip nothing; clipping the joint vector would scale the
    # actor's part by the critics' norm (measured: a TD3 that barely learned Pendulum).
    max_grad_norm = 0.0

    def __init__(self, learner: ContinuousLearner, noise: float) -> None:
        self.learner = learner
        self.noise = noise
        modules = learner.modules()
        online = [name for name in modules if not name.endswith("_target")]
        self.online = nn.ModuleList([modules[name] for name in online])
        self.target = nn.ModuleList([modules[f"{name}_target"] for name in online])
        if self.online[0] is not learner.policy:
            raise ValueError("the actor must come first among the learner's modules")
        self.action_dim = learner.action_dim
        self._actor_size = networks.parameter_count(learner.policy)
        # loaded in place, so the same tensors at every step
        self._actor_params = list(learner.policy.parameters())
        self._critic_params = [p for critic in self.online[1:] for p in critic.parameters()]

    def initial(self) -> torch.Tensor:
        return networks.flat_parameters(self.online)

    def load_online(self, vector: torch.Tensor) -> None:
        networks.load_flat_parameters(self.online, vector)

    def load_target(self, vector: torch.Tensor) -> None:
        networks.load_flat_parameters(self.target, vector)

    def gradient(self, batch: Batch, step: int, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        learner = self.learner
        critic_loss, _, _ = learner.critic_loss(batch, None, generator)
        critic_grads = torch.autograd.grad(critic_loss, self._critic_params)
        if learner.actor_due(step + 1):
            actor_grads = torch.autograd.grad(learner.actor_loss(batch.obs), self._actor_params)
        else:  # AdaGrad leaves a parameter with a zero gradient (and its accumulator) as it was
            actor_grads = tuple(torch.zeros_like(p) for p in self._actor_params)
        grad = torch.cat([g.reshape(-1) for g in (*actor_grads, *critic_grads)])
        return grad, float(critic_loss.detach())

    def _actor_copy(self, vector: torch.Tensor | None = None) -> Actor:
        actor = copy.deepcopy(self.learner.policy)
        if vector is not None:
            networks.load_flat_parameters(actor, vector[:self._actor_size])
        return actor

    def explorer(self, generator: torch.Generator) -> "ServerGaussianExplorer":
        return ServerGaussianExplorer(self._actor_copy(), self.noise, generator, self._actor_size,
                                      self.learner.exploration_at)

    def greedy(self, vector: torch.Tensor) -> Callable[[np.ndarray], np.ndarray]:
        return deterministic_policy(self._actor_copy(vector))


class ServerGaussianExplorer(GaussianExplorer):
    """:class:`GaussianExplorer` on the actor part of pulled parameter vectors."""

    def __init__(self, actor: Actor, noise: float, generator: torch.Generator, actor_size: int,
                 schedule: Callable[[int], float]) -> None:
        super().__init__(actor, noise, generator)
        self._actor_size = actor_size
        self._schedule = schedule

    def load(self, vector: torch.Tensor, server_version: int) -> None:
        networks.load_flat_parameters(self.actor, vector[:self._actor_size])
        self.exploration = self._schedule(server_version)

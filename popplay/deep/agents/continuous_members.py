"""P DDPG or TD3 learners batched over a leading member axis, in one process.

The rule is :mod:`popplay.deep.agents.td3`'s (DDPG: one critic, no delay, no target
smoothing): critics regress on ``y = r + γ (1 − terminated) min_i Q'_i(s', a')`` with
``a'`` the target actor's action (smoothed by clipped noise for TD3), every
``policy_delay``-th critic step the actor climbs ``Q_1(s, μ(s))`` and every target
network moves by Polyak averaging with ``tau``. Actions are uniform over the box until
the first update, then ``μ(s)`` plus Gaussian noise of ``exploration_noise`` half-ranges,
kept in the box (the one agent's :class:`popplay.deep.agents.ddpg.GaussianExplorer`).

Each member has its own actor, critics, targets, two Adams (actor; critics together),
replay ring (:class:`popplay.deep.agents.member_replay.MemberReplay`), counter-based
streams keyed by (seed, member) — acting, minibatches, target smoothing — and
per-member hyper-parameters (:data:`CONTINUOUS_HYPER_BOUNDS`). The critics of a member
are one row, ``[critic 1 | critic 2]``, so one Adam moves both as the one agent's does.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from popplay import rng
from popplay.deep.agents import networks
from popplay.deep.agents.ddpg import Actor, Critic
from popplay.deep.agents.member_replay import MemberReplay
from popplay.deep.agents.stacked import (
    StackedAdam,
    StackedMLP,
    check_shapes,
    forward_layers,
    member_arrays,
    member_hypers,
    member_seed,
    stored_hypers,
)
from popplay.deep.topologies.exarl_params import CONTINUOUS_HYPER_BOUNDS
from popplay.xp import th

TAG_CONTINUOUS = 17
_ACT, _SAMPLE, _SMOOTH = 0, 1, 2


class ContinuousMembers:
    """P DDPG (``config`` a DDPGConfig) or TD3 (a TD3Config) learners for members
    ``members`` (slots) on an action box ``[low, high]``; member ``k`` starts from member
    ``init_from[k]``'s initial networks (default: its own)."""

    hyper_bounds = CONTINUOUS_HYPER_BOUNDS

    def __init__(self, config: Any, obs_dim: int, low: tuple[float, ...], high: tuple[float, ...], seed: int,
                 members: np.ndarray, hypers: dict[str, np.ndarray], device: str = "cpu",
                 init_from: np.ndarray | None = None) -> None:
        config.validate()
        if config.per:
            raise ValueError("per: a population's members keep uniform replay (prioritised replay is one agent's)")
        self.config = config
        self.td3 = hasattr(config, "policy_delay")
        self.critic_count = 2 if self.td3 else 1
        self.obs_dim, self.seed, self.device = obs_dim, seed, device
        self.members = np.asarray(members, dtype=np.int64).reshape(-1)
        p = len(self.members)
        self.low = torch.as_tensor(low, dtype=torch.float32, device=device).reshape(-1)
        self.high = torch.as_tensor(high, dtype=torch.float32, device=device).reshape(-1)
        self.scale = (self.high - self.low) / 2
        self.action_dim = int(self.low.numel())
        self.hypers = member_hypers(hypers, self.hyper_bounds, p)
        starts = self.members if init_from is None else np.asarray(init_from, dtype=np.int64).reshape(-1)
        actors, critics = [], []
        for k in starts:
            with torch.random.fork_rng(devices=[]):  # the one agent's order: the actor, then each critic
                torch.manual_seed(member_seed(seed, int(k)))
                actors.append(Actor(obs_dim, low, high, config.hidden).net)
                critics.append([Critic(obs_dim, self.action_dim, config.hidden).net for _ in range(self.critic_count)])
        self._critic_shapes = [tuple(q.shape) for q in critics[0][0].parameters()]
        self.actor = StackedMLP.from_modules(actors, device)
        rows = torch.stack([torch.cat([networks.flat_parameters(c) for c in pair]) for pair in critics])
        self.critic = StackedMLP(rows.to(device), self._critic_shapes * self.critic_count)
        self.actor_target = self.actor.matrix.clone()
        self.critic_target = self.critic.matrix.clone()
        self.adam_actor, self.adam_critic = StackedAdam(self.actor), StackedAdam(self.critic)
        self.replay = MemberReplay(p, config.replay_capacity, obs_dim, (self.action_dim,), torch.float32,
                                   batch_size=config.batch_size, learning_starts=config.learning_starts,
                                   update_ratio=config.update_ratio, device=device)
        self.updates = 0
        self._keys = torch.as_tensor(rng.stream_keys(seed, TAG_CONTINUOUS, [_ACT, _SAMPLE, _SMOOTH], self.members),
                                     device=device)
        self._rng = rng.make_rng(th)
        self.last_losses = np.full(p, np.nan)

    @property
    def count(self) -> int:
        return len(self.members)

    def _column(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(self.hypers[name], dtype=dtype, device=self.device)

    # --- the networks ------------------------------------------------------------------
    def _mu(self, matrix: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """(P, B, action_dim) actions of the actors ``matrix`` for (P, B, obs_dim)."""
        params = self.actor.split(matrix)
        out = forward_layers(params[0::2], params[1::2], obs, torch.relu)
        return self.low + (torch.tanh(out) + 1) * self.scale

    def _q(self, matrix: torch.Tensor, obs: torch.Tensor, action: torch.Tensor, which: int) -> torch.Tensor:
        """(P, B) values of critic ``which`` of the rows ``matrix``."""
        params = self.critic.split(matrix)
        n = len(self._critic_shapes)
        layers = params[which * n:(which + 1) * n]
        return forward_layers(layers[0::2], layers[1::2], torch.cat([obs, action], dim=-1), torch.relu).squeeze(-1)

    def _clip(self, action: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(action, self.high), self.low)

    def _normal(self, key: torch.Tensor, first: int, shape: tuple[int, ...]) -> torch.Tensor:
        """Standard normal draws (P, *shape) from each member's stream ``key``, words
        ``2·(first + i)`` and ``2·(first + i) + 1`` for draw ``i`` (Box–Muller)."""
        r = self._rng
        n = math.prod(shape)
        counters = torch.arange(2 * first, 2 * (first + n), dtype=torch.int64, device=self.device)
        words = r.draw(key.unsqueeze(1), r.mix_counter(counters).unsqueeze(0))
        u1, u2 = r.open53(words[:, 0::2]), r.uniform53(words[:, 1::2])
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
        return z.to(torch.float32).view(self.count, *shape)

    # --- acting ------------------------------------------------------------------------
    def act(self, obs: np.ndarray, step: int) -> np.ndarray:
        """Actions (P, action_dim) at member env-step ``step``: uniform over the box
        before the first update, then μ(s) plus noise, kept in the box."""
        a = self.action_dim
        if self.updates == 0:
            r = self._rng
            counters = r.mix_counter(torch.arange(step * a, (step + 1) * a, dtype=torch.int64, device=self.device))
            u = r.uniform53(r.draw(self._keys[_ACT].unsqueeze(1), counters.unsqueeze(0))).to(torch.float32)
            return (self.low + u * (self.high - self.low)).cpu().numpy()
        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device).unsqueeze(1)
            mu = self._mu(self.actor.matrix, x)[:, 0]
        noise = self._normal(self._keys[_ACT], step * a, (a,)) * self._column("exploration_noise").unsqueeze(1)
        return self._clip(mu + noise * self.scale).cpu().numpy()

    def greedy_actions(self, obs: np.ndarray) -> np.ndarray:
        """μ(s) of each member for one observation per member (P, obs_dim)."""
        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device).unsqueeze(1)
            return self._mu(self.actor.matrix, x)[:, 0].cpu().numpy()

    # --- learning ----------------------------------------------------------------------
    def receive(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray) -> None:
        """One transition per member; a time-limit cut still bootstraps (only
        ``terminated`` is stored)."""
        self.replay.store(obs, action, reward, next_obs, terminated)

    def train(self, progress: float = 0.0) -> int:
        """Run the updates owed (``update_ratio`` per transition once ``learning_starts``
        are stored); returns how many."""
        owed = self.replay.owed()
        for _ in range(owed):
            self.update()
        return owed

    def _targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The critics' regression targets y (P, B), no gradient."""
        cfg = self.config
        with torch.no_grad():
            action = self._mu(self.actor_target, batch["next_obs"])
            if self.td3 and cfg.target_smoothing:
                shape = tuple(action.shape[1:])
                noise = self._normal(self._keys[_SMOOTH], self.updates * math.prod(shape), shape)
                noise = torch.clamp(noise * cfg.target_noise, -cfg.noise_clip, cfg.noise_clip)
                action = self._clip(action + noise * self.scale)
            q = self._q(self.critic_target, batch["next_obs"], action, 0)
            if self.td3 and cfg.clipped_double_q:
                q = torch.minimum(q, self._q(self.critic_target, batch["next_obs"], action, 1))
            gamma = self._column("gamma").unsqueeze(1)
            return batch["reward"] + gamma * (1.0 - batch["terminated"]) * q

    def update(self) -> None:
        """One critic step of every member on its own minibatch; on actor steps also the
        actor and every target network."""
        batch = self.replay.batch(self.replay.sample_index(self._rng, self._keys[_SAMPLE], self.updates))
        y = self._targets(batch)
        leaf = self.critic.matrix.detach().requires_grad_(True)
        losses = sum(((y - self._q(leaf, batch["obs"], batch["action"], i)) ** 2).mean(dim=1)
                     for i in range(self.critic_count))
        (grad,) = torch.autograd.grad(losses.sum(), leaf)
        self.critic.grad.copy_(grad)
        self.adam_critic.step(self.critic.grad, self._column("critic_lr", torch.float64))
        self.updates += 1
        self.last_losses = losses.detach().cpu().numpy()
        if self.td3 and self.updates % self.config.policy_delay:
            return
        actor_leaf = self.actor.matrix.detach().requires_grad_(True)
        objective = -self._q(self.critic.matrix, batch["obs"], self._mu(actor_leaf, batch["obs"]), 0).mean(dim=1)
        (grad,) = torch.autograd.grad(objective.sum(), actor_leaf)
        self.actor.grad.copy_(grad)
        self.adam_actor.step(self.actor.grad, self._column("actor_lr", torch.float64))
        tau = self._column("tau").unsqueeze(1)
        with torch.no_grad():  # Polyak, as soft_update: target · (1 − τ) + online · τ
            for target, online in ((self.critic_target, self.critic.matrix), (self.actor_target, self.actor.matrix)):
                target.mul_(1.0 - tau).add_(online * tau)

    # --- population operators --------------------------------------------------------
    def losses(self) -> np.ndarray:
        return self.last_losses

    def parameter_tables(self) -> list[torch.Tensor]:
        return [self.actor.matrix, self.actor_target, self.critic.matrix, self.critic_target]

    def _adam_tables(self) -> list[torch.Tensor]:
        return [t for adam in (self.adam_actor, self.adam_critic) for t in (adam.exp_avg, adam.exp_avg_sq, adam.steps)]

    def member_tables(self, *, replay: bool) -> list[torch.Tensor]:
        """What a PBT copy moves, member axis first: networks, targets, both Adams and
        (with ``replay``) the replay memory."""
        return self.parameter_tables() + self._adam_tables() + (list(self.replay.tables.values()) if replay else [])

    def set_hypers(self, hypers: dict[str, np.ndarray]) -> None:
        self.hypers = member_hypers(hypers, self.hypers, self.count)

    def member_module(self, slot: int) -> Actor:
        """Member ``slot``'s actor as the :class:`popplay.deep.agents.ddpg.Actor` one agent has."""
        actor = Actor(self.obs_dim, self.low.cpu().tolist(), self.high.cpu().tolist(), self.config.hidden)
        torch.nn.utils.vector_to_parameters(self.actor.matrix[slot].detach().cpu().clone(), actor.net.parameters())
        return actor

    # --- run-file arrays ------------------------------------------------------------
    def _tables(self) -> dict[str, torch.Tensor]:
        names = ("actor", "actor_target", "critic", "critic_target", "adam_actor.exp_avg", "adam_actor.exp_avg_sq",
                 "adam_actor.steps", "adam_critic.exp_avg", "adam_critic.exp_avg_sq", "adam_critic.steps")
        return dict(zip(names, self.parameter_tables() + self._adam_tables()))

    def arrays(self) -> dict[str, np.ndarray]:
        out = {**self._tables(), **{f"replay.{name}": table for name, table in self.replay.arrays().items()}}
        return member_arrays(out, self.hypers)

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates, **self.replay.counters()}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        tables = self._tables()
        check_shapes(arrays, {f"members.{name}": tuple(table.shape) for name, table in tables.items()})
        hypers = stored_hypers(arrays, self.hyper_bounds, self.count)
        self.replay.load(arrays, counters, "members.replay.")
        for name, table in tables.items():
            table.copy_(torch.as_tensor(np.asarray(arrays[f"members.{name}"]), device=self.device))
        self.updates = int(counters["updates"])
        self.set_hypers(hypers)

"""P PPO learners batched over a leading member axis, in one process.

The rule is :mod:`popplay.deep.agents.ppo`'s (clipped surrogate, GAE(λ) with
time-limit cuts bootstrapped into the reward, value loss, entropy bonus, advantages
normalised per minibatch, gradient clipped to a norm, Adam, learning rate and clip
range falling linearly over an ``--env-steps`` budget); here every member has its own
policy and value networks (tanh, rows of one (P, n) matrix), Adam state, rollout of
``copies`` environments x ``n_steps``, random streams and per-member hyper-parameters
(:data:`HYPER_BOUNDS`). One autograd pass takes every member's minibatch at once: the
loss is the sum of the members' losses, so each member's gradient is its own loss's.

The action draws and the minibatch order are counter-based (:mod:`popplay.rng`) keyed
by (seed, member index), so member ``k`` is the same in a population of any size.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from popplay import rng
from popplay.deep.agents import networks
from popplay.deep.agents.ppo import gae
from popplay.deep.agents.ppo_params import HYPER_BOUNDS
from popplay.deep.agents.stacked import (
    StackedAdam,
    StackedMLP,
    check_shapes,
    clip_rows_,
    forward_layers,
    load_network_tables,
    member_hypers,
    member_seed,
    network_shapes,
    network_tables,
    stored_hypers,
)
from popplay.xp import th

TAG_PPO = 14
_ACT, _SHUFFLE = 0, 1

ROLLOUT_FIELDS = ("obs", "action", "log_prob", "value", "reward", "episode_start")


class PPOMembers:
    """P PPO learners for members ``members`` (slots), each with ``config.copies``
    environments; observations and actions come member-major, ``(P * copies, ...)``;
    member ``k`` starts from member ``init_from[k]``'s initial networks (default: its own).
    ``config`` is a :class:`popplay.deep.agents.ppo_params.PPOParams`.

    A subclass with another loss over the same rollouts (:class:`popplay.deep.agents.a2c_members.A2CMembers`)
    sets :attr:`hyper_bounds`, :attr:`stream_tag` and overrides :meth:`learn`."""

    #: the hyper-parameters each member holds (the population's --hp names)
    hyper_bounds: dict[str, Any] = HYPER_BOUNDS
    #: the tag of the members' counter-based streams: another agent's members draw other words
    stream_tag: int = TAG_PPO

    def __init__(self, config: Any, obs_dim: int, actions: int, seed: int, members: np.ndarray,
                 hypers: dict[str, np.ndarray], device: str = "cpu", init_from: np.ndarray | None = None) -> None:
        self.config = config
        self.obs_dim, self.actions, self.seed, self.device = obs_dim, actions, seed, device
        self.members = np.asarray(members, dtype=np.int64).reshape(-1)
        p, c, t = len(self.members), config.copies, config.n_steps
        self.hypers = member_hypers(hypers, self.hyper_bounds, p)
        starts = self.members if init_from is None else np.asarray(init_from, dtype=np.int64).reshape(-1)
        pairs = [networks.actor_critic(member_seed(seed, int(k)), obs_dim, actions, config.hidden) for k in starts]
        rows = [torch.cat([networks.flat_parameters(policy), networks.flat_parameters(value)])
                for policy, value in pairs]
        self._policy_shapes = [tuple(q.shape) for q in pairs[0][0].parameters()]
        self._value_shapes = [tuple(q.shape) for q in pairs[0][1].parameters()]
        self.net = StackedMLP(torch.stack(rows).to(device), self._policy_shapes + self._value_shapes)
        self.adam = StackedAdam(self.net, eps=getattr(config, "adam_eps", 1e-8))  # torch's Adam default
        self._split = sum(int(np.prod(s)) for s in self._policy_shapes)
        self.rollout = {name: torch.zeros((t, p, c) + ((obs_dim,) if name == "obs" else ()),
                                          dtype=torch.int64 if name == "action" else torch.float32, device=device)
                        for name in ROLLOUT_FIELDS}
        self.next_start = torch.ones(p, c, device=device)  # the next row begins an episode
        self.filled = 0  # rows of the current rollout
        self.updates = 0
        self.rollouts = 0
        self._keys = torch.as_tensor(rng.stream_keys(seed, self.stream_tag, [_ACT, _SHUFFLE], self.members),
                                     device=device)
        self._rng = rng.make_rng(th)
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.last_losses = np.full(p, np.nan)

    @property
    def count(self) -> int:
        return len(self.members)

    # --- the networks ------------------------------------------------------------------
    def _forward(self, matrix: torch.Tensor, obs: torch.Tensor, value: bool) -> torch.Tensor:
        """(P, B, out) outputs of every member's policy (or value) network for (P, B, obs_dim)."""
        params = self.net.split(matrix)
        layers = params[len(self._policy_shapes):] if value else params[:len(self._policy_shapes)]
        return forward_layers(layers[0::2], layers[1::2], obs, torch.tanh)

    def _members_obs(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device).view(self.count, self.config.copies, -1)

    # --- acting ------------------------------------------------------------------------
    def act(self, obs: np.ndarray, step: int) -> np.ndarray:
        """Sampled actions ``(P * copies,)`` for member-major observations at member
        env-step ``step`` (copy ``c``'s uniform is word ``step·copies + c`` of the
        member's action stream: inverse CDF, as :meth:`PPO.act`)."""
        c = self.config.copies
        x = self._members_obs(obs)
        with torch.no_grad():
            logp_all = torch.log_softmax(self._forward(self.net.matrix, x, value=False), dim=-1)
            values = self._forward(self.net.matrix, x, value=True).squeeze(-1)
        r = self._rng
        counters = r.mix_counter(torch.arange(step * c, (step + 1) * c, dtype=torch.int64, device=self.device))
        u = r.uniform53(r.draw(self._keys[_ACT].unsqueeze(1), counters.unsqueeze(0))).to(torch.float32).unsqueeze(-1)
        action = (logp_all.exp().cumsum(dim=-1) < u).sum(dim=-1).clamp_(max=self.actions - 1)
        self._pending = (logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1), values)
        return action.reshape(-1).cpu().numpy()

    def greedy_actions(self, obs: np.ndarray) -> np.ndarray:
        """The most probable action of each member for one observation per member (P, obs_dim)."""
        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device).unsqueeze(1)
            return self._forward(self.net.matrix, x, value=False)[:, 0].argmax(dim=-1).cpu().numpy()

    # --- learning ----------------------------------------------------------------------
    def receive(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray) -> None:
        """The step that :meth:`act` chose actions for; a time-limit cut's reward is
        bootstrapped with γ V(its last observation), then treated as an end."""
        if self._pending is None:
            raise RuntimeError("receive() follows act()")
        log_prob, values = self._pending
        self._pending = None
        shape = (self.count, self.config.copies)
        reward_t = torch.as_tensor(reward, dtype=torch.float32, device=self.device).view(shape)
        cut_here = np.asarray(truncated) & ~np.asarray(terminated)
        if cut_here.any():  # asked of the host's arrays: no wait for the device
            cut = torch.as_tensor(cut_here, device=self.device).view(shape)
            with torch.no_grad():
                tail = self._forward(self.net.matrix, self._members_obs(next_obs), value=True).squeeze(-1)
            gamma = torch.as_tensor(self.hypers["gamma"], dtype=torch.float32, device=self.device).unsqueeze(1)
            reward_t = reward_t + torch.where(cut, gamma * tail, torch.zeros_like(tail))
        t = self.filled
        rows = self.rollout
        rows["obs"][t] = self._members_obs(obs)
        rows["action"][t] = torch.as_tensor(action, device=self.device).view(shape)
        rows["log_prob"][t], rows["value"][t], rows["reward"][t] = log_prob, values, reward_t
        rows["episode_start"][t] = self.next_start
        done = np.asarray(terminated) | np.asarray(truncated)
        self.next_start = torch.as_tensor(done, dtype=torch.float32, device=self.device).view(shape)
        self._last_obs = next_obs
        self.filled += 1

    def train(self, progress: float = 0.0) -> int:
        """Learn from the rollout once it holds ``n_steps`` rows (``progress``: the
        fraction of an --env-steps budget done, for the schedules); returns the
        optimiser steps made."""
        if self.filled < self.config.n_steps:
            return 0
        return self.learn(self._last_obs, 1.0 - min(1.0, max(0.0, progress)))

    _last_obs: Any = None  # the latest step's successors: V of them bootstraps the rollout's end

    def _column(self, name: str) -> torch.Tensor:
        """Hyper-parameter ``name`` of every member, (P, 1) float32 on the device."""
        return torch.as_tensor(self.hypers[name], dtype=torch.float32, device=self.device).view(self.count, 1)

    def _member_rollout(self, next_obs: np.ndarray, lam: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rollout member-major, ``(P, n = n_steps * copies, ...)``: observations,
        actions, their log-probabilities at acting, GAE(``lam``) advantages and returns
        (the rollout's end bootstrapped with V(``next_obs``))."""
        cfg = self.config
        p, n = self.count, cfg.copies * cfg.n_steps
        rows = self.rollout
        with torch.no_grad():
            last_value = self._forward(self.net.matrix, self._members_obs(next_obs), value=True).squeeze(-1)
            advantages, returns = gae(rows["reward"], rows["value"], rows["episode_start"], last_value,
                                      self.next_start, self._column("gamma"), lam)
        member_rows = lambda x: x.transpose(0, 1).reshape(p, n, *x.shape[3:])  # noqa: E731  (P, T, C) -> (P, n)
        return tuple(member_rows(x) for x in (rows["obs"], rows["action"], rows["log_prob"], advantages, returns))

    def _step(self, lr: torch.Tensor) -> None:
        """One Adam step of every member along its gradient in ``net.grad``, clipped to its norm."""
        clip_rows_(self.net.grad, self._column("max_grad_norm").view(-1))
        self.adam.step(self.net.grad, lr)

    def _learned(self, losses: torch.Tensor, steps: int) -> int:
        """Bookkeeping after a rollout was learned from with ``steps`` optimiser steps."""
        self.last_losses = losses.detach().cpu().numpy()
        self.updates += steps
        self.rollouts += 1
        self.filled = 0
        return steps

    def learn(self, next_obs: np.ndarray, progress_remaining: float = 1.0) -> int:
        """``n_epochs`` passes of minibatch steps over the rollout, every member at once."""
        cfg = self.config
        p, n = self.count, cfg.copies * cfg.n_steps
        h = self.hypers
        obs, action, old_log_prob, advantages, returns = self._member_rollout(next_obs, self._column("gae_lambda"))
        progress = progress_remaining
        lr = torch.as_tensor(cfg.lr_end + (h["lr"] - cfg.lr_end) * progress, dtype=torch.float64, device=self.device)
        clip = torch.as_tensor(cfg.clip_range_end + (h["clip_range"] - cfg.clip_range_end) * progress,
                               dtype=torch.float32, device=self.device).view(p, 1)
        value_coef, entropy_coef = self._column("value_coef"), self._column("entropy_coef")
        r = self._rng
        steps = 0
        for epoch in range(cfg.n_epochs):
            first = (self.rollouts * cfg.n_epochs + epoch) * n
            counters = r.mix_counter(torch.arange(first, first + n, dtype=torch.int64, device=self.device))
            order = r.draw(self._keys[_SHUFFLE].unsqueeze(1), counters.unsqueeze(0)).argsort(dim=1)
            for start in range(0, n, cfg.batch_size):  # the last, partial minibatch is kept (SB3)
                idx = order[:, start:start + cfg.batch_size]
                pick = lambda x: x.gather(1, idx.view(p, -1, *([1] * (x.dim() - 2))).expand(  # noqa: E731
                    -1, -1, *x.shape[2:]))
                losses = self._losses(pick(obs), pick(action), pick(old_log_prob), pick(advantages), pick(returns),
                                      clip, value_coef, entropy_coef)
                self._step(lr)
                steps += 1
        return self._learned(losses, steps)

    def _losses(self, obs: torch.Tensor, action: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                returns: torch.Tensor, clip: torch.Tensor, value_coef: torch.Tensor,
                entropy_coef: torch.Tensor) -> torch.Tensor:
        """Each member's loss on its minibatch (P,); their gradients into ``net.grad``."""
        leaf, logp, entropy, values = self._terms(obs, action)
        if self.config.normalize_advantage and advantages.shape[1] > 1:
            std, mean = torch.std_mean(advantages, dim=1, keepdim=True)
            advantages = (advantages - mean) / (std + 1e-8)
        ratio = torch.exp(logp - old_log_prob)
        clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
        policy_loss = -torch.min(advantages * ratio, advantages * clipped).mean(dim=1, keepdim=True)
        value_loss = ((returns - values) ** 2).mean(dim=1, keepdim=True)
        losses = (policy_loss + value_coef * value_loss - entropy_coef * entropy).squeeze(1)
        return self._backward(losses, leaf)

    def _terms(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A leaf copy of the networks and, through it, each member's log-probabilities
        of ``action`` (P, B), mean entropy (P, 1) and values (P, B) on ``obs``."""
        leaf = self.net.matrix.detach().requires_grad_(True)
        logp_all = torch.log_softmax(self._forward(leaf, obs, value=False), dim=-1)
        logp = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean(dim=1, keepdim=True)
        return leaf, logp, entropy, self._forward(leaf, obs, value=True).squeeze(-1)

    def _backward(self, losses: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
        """Each member's gradient of its own loss into ``net.grad`` (one pass: the sum's)."""
        (grad,) = torch.autograd.grad(losses.sum(), leaf)
        self.net.grad.copy_(grad)
        return losses

    # --- population operators --------------------------------------------------------
    def losses(self) -> np.ndarray:
        return self.last_losses

    def parameter_tables(self) -> list[torch.Tensor]:
        return [self.net.matrix]

    def member_tables(self, *, replay: bool) -> list[torch.Tensor]:
        """What a PBT copy moves, member axis first: networks and Adam state (a rollout
        belongs to the member's own environments: kept)."""
        return [self.net.matrix, self.adam.exp_avg, self.adam.exp_avg_sq, self.adam.steps]

    def set_hypers(self, hypers: dict[str, np.ndarray]) -> None:
        self.hypers = member_hypers(hypers, self.hypers, self.count)

    def member_module(self, slot: int) -> torch.nn.Sequential:
        """Member ``slot``'s policy network (logits) as the ``nn.Sequential`` one PPO agent has."""
        module = networks.mlp(self.obs_dim, self.actions, self.config.hidden, "tanh")
        torch.nn.utils.vector_to_parameters(self.net.matrix[slot, :self._split].detach().cpu().clone(),
                                            module.parameters())
        return module

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        out = {**network_tables(self.net, self.adam), "members.next_start": self.next_start,
               **{f"members.rollout.{name}": table[:self.filled].transpose(0, 1)  # member axis first
                  for name, table in self.rollout.items()}}
        arrays = {name: value.detach().cpu().numpy().copy() for name, value in out.items()}
        arrays.update({f"hyper.{name}": values.copy() for name, values in self.hypers.items()})
        return arrays

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates, "rollouts": self.rollouts, "filled": self.filled}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        filled = int(counters["filled"])
        if not 0 <= filled < self.config.n_steps:
            raise ValueError(f"filled {filled} outside [0, {self.config.n_steps})")
        expected = {**network_shapes(self.net), "members.next_start": tuple(self.next_start.shape)}
        for name, table in self.rollout.items():
            expected[f"members.rollout.{name}"] = (table.shape[1], filled, *table.shape[2:])
        check_shapes(arrays, expected)
        hypers = stored_hypers(arrays, self.hyper_bounds, self.count)
        take = lambda key: torch.as_tensor(np.asarray(arrays[key]), device=self.device)  # noqa: E731
        load_network_tables(self.net, self.adam, arrays)
        self.next_start.copy_(take("members.next_start"))
        for name, table in self.rollout.items():
            table[:filled] = take(f"members.rollout.{name}").to(table.dtype).transpose(0, 1)
        self.filled = filled
        self.updates = int(counters["updates"])
        self.rollouts = int(counters["rollouts"])
        self.set_hypers(hypers)

"""PPO (Schulman et al. 2017), the clipped-surrogate variant, for discrete actions.

As stable-baselines3's ``PPO`` and CleanRL's ``ppo.py``: after each rollout, GAE(lambda)
advantages ``A_t`` and returns ``R_t = A_t + V_old(s_t)``, then ``n_epochs`` passes over
the rollout's rows in random minibatches, each one Adam step on

    L = -mean[min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)]
        + value_coef * mean[(R_t - V(s_t))^2] - entropy_coef * mean[H(pi(.|s_t))]

with ``r_t = pi(a_t|s_t) / pi_old(a_t|s_t)`` and ``A_t`` normalised within the minibatch
(``normalize_advantage``). The learning rate and ``eps`` decay linearly with the
``progress_remaining`` (1 at the start of the run, 0 at its end) given to :meth:`PPO.learn`.

Its hyper-parameters are :class:`popplay.deep.agents.ppo_params.PPOParams` (written once,
for the command line, the run file and the agent). Rollouts
(:class:`popplay.deep.agents.rollout.Rollout`) are time-major ``(T, B)``: column ``b`` is one copy of the environment. SB3's
conventions hold: ``episode_start`` marks the rows that begin an episode (so the row
before them ended one), and a time-limit cut is already bootstrapped by the caller into
its reward (``r + gamma V(final_obs)``) and is treated like a termination afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from popplay.deep.agents import networks
from popplay.deep.agents.adam import Adam
from popplay.deep.agents.rollout import Rollout


class PPOLoss(NamedTuple):
    loss: torch.Tensor  # scalar with gradient
    policy_loss: torch.Tensor  # the other fields: without gradient
    value_loss: torch.Tensor
    entropy: torch.Tensor  # mean entropy of pi(.|s)
    log_ratio: torch.Tensor  # (n,) log pi(a|s) - log pi_old(a|s)


def gae(reward: torch.Tensor, value: torch.Tensor, episode_start: torch.Tensor, last_value: torch.Tensor,
        last_episode_start: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) advantages and TD(lambda) returns of a ``(T, B)`` rollout (SB3's
    ``RolloutBuffer.compute_returns_and_advantage``, over all columns at once)."""
    T = reward.shape[0]
    advantages = torch.empty_like(reward)
    # the successor of row t is cut off where row t + 1 starts a new episode
    next_non_terminal = torch.cat([1.0 - episode_start[1:], (1.0 - last_episode_start).unsqueeze(0)])
    next_values = torch.cat([value[1:], last_value.unsqueeze(0)])
    deltas = reward + gamma * next_values * next_non_terminal - value
    carry = next_non_terminal * (gamma * lam)
    last = torch.zeros_like(last_value)
    for t in range(T - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        advantages[t] = last
    return advantages, advantages + value


def ppo_loss(policy: nn.Module, value: nn.Module, obs: torch.Tensor, action: torch.Tensor,
             old_log_prob: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor, clip_range: float,
             config: Any, statistics: bool = True) -> PPOLoss:
    """The loss above on one minibatch of ``n`` rows (``obs`` is ``(n, obs_dim)``).

    Without ``statistics`` and with ``entropy_coef`` 0 the entropy is not computed
    (its field is NaN): the minibatch loop skips what it does not report.
    """
    logp_all = torch.log_softmax(policy(obs), dim=-1)
    logp = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    if config.entropy_coef:
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    elif statistics:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    else:
        entropy = torch.tensor(float("nan"))
    values = value(obs).squeeze(-1)
    if config.normalize_advantage and advantages.shape[0] > 1:  # one row has no spread (SB3 #325)
        std, mean = torch.std_mean(advantages)
        advantages = (advantages - mean) / (std + 1e-8)
    log_ratio = logp - old_log_prob
    ratio = torch.exp(log_ratio)
    policy_loss = -torch.min(advantages * ratio, advantages * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)).mean()
    value_loss = F.mse_loss(values, returns)
    loss = policy_loss + config.value_coef * value_loss
    if config.entropy_coef:
        loss = loss - config.entropy_coef * entropy
    return PPOLoss(loss, policy_loss.detach(), value_loss.detach(), entropy.detach(), log_ratio.detach())


def ppo_statistics(log_ratio: torch.Tensor, clip_range: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(clip fraction, approximate KL(pi_old || pi)) as SB3 logs them (Schulman's k3 estimator)."""
    ratio = torch.exp(log_ratio)
    return ((ratio - 1.0).abs() > clip_range).float().mean(), ((ratio - 1.0) - log_ratio).mean()


@dataclass(eq=False)
class PPO:
    """The learner's state: separate policy and value networks (tanh MLPs, SB3's
    ``MlpPolicy`` for PPO), one Adam over both, and the generator that shuffles rows."""

    config: Any  # a PPOParams (popplay.deep.agents.ppo_params, which builds this agent)
    obs_dim: int
    actions: int
    seed: int

    def __post_init__(self) -> None:
        self.config.validate()
        self.policy, self.value = networks.actor_critic(self.seed, self.obs_dim, self.actions, self.config.hidden)
        self._params = [*self.policy.parameters(), *self.value.parameters()]
        self.optimizer = Adam(self._params, self.config.lr, eps=self.config.adam_eps, fused=True)
        self.shuffle = networks.generator(self.seed * 7919 + 3)
        self.updates = 0  # optimiser steps
        self.rollouts = 0  # learn calls
        self.received = 0  # env-steps learned from in a multi-process workflow (its schedule's clock)
        self.last_loss = float("nan")
        self.last_clip_fraction = float("nan")
        self.last_approx_kl = float("nan")
        self.last_entropy = float("nan")

    #: Learns from each rollout it is given, then drops it (no replay).
    on_policy = True

    def networks(self) -> nn.Module:
        """Every learned network (for checksums of the learners' copies)."""
        return nn.ModuleList([self.policy, self.value])

    def optimizers(self) -> dict[str, Adam]:
        return {"adam": self.optimizer}

    # --- acting -----------------------------------------------------------------------
    def act(self, obs: np.ndarray, generator: torch.Generator) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        """Sampled actions of a ``(B, obs_dim)`` batch: (actions int64, log pi(a|s), V(s))."""
        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32)
            logp_all = torch.log_softmax(self.policy(x), dim=-1)
            # inverse CDF with one uniform per row, as REINFORCE's SampledPolicy draws
            u = torch.rand(x.shape[0], 1, generator=generator)
            action = (logp_all.exp().cumsum(dim=-1) < u).sum(dim=-1).clamp_(max=self.actions - 1)
            log_prob = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
            values = self.value(x).squeeze(-1)
        return action.numpy(), log_prob, values

    def value_of(self, obs: np.ndarray) -> torch.Tensor:
        """``V(s)`` of a ``(B, obs_dim)`` batch, shape ``(B,)``."""
        with torch.no_grad():
            return self.value(torch.as_tensor(obs, dtype=torch.float32)).squeeze(-1)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """The most probable action (ties: the lowest), for evaluation."""
        with torch.no_grad():
            return self.policy(torch.as_tensor(obs, dtype=torch.float32)).argmax(dim=-1).numpy()

    # --- learning ---------------------------------------------------------------------
    def learn(self, rollout: Rollout, progress_remaining: float = 1.0) -> dict[str, float]:
        """``n_epochs`` passes of minibatch steps over ``rollout``; the last epoch's means."""
        cfg = self.config
        lr, clip_range = cfg.schedule(progress_remaining)
        r = Rollout(*(torch.as_tensor(x) for x in rollout))
        T, B = r.reward.shape
        for name in ("action", "log_prob", "value", "episode_start"):
            if tuple(getattr(r, name).shape) != (T, B):
                raise ValueError(f"rollout.{name} has shape {tuple(getattr(r, name).shape)}, expected {(T, B)}")
        if tuple(r.obs.shape) != (T, B, self.obs_dim):
            raise ValueError(f"rollout.obs has shape {tuple(r.obs.shape)}, expected {(T, B, self.obs_dim)}")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with torch.no_grad():
            advantages, returns = gae(r.reward.float(), r.value.float(), r.episode_start.float(),
                                      r.last_value.float().reshape(B), r.last_episode_start.float().reshape(B),
                                      cfg.gamma, cfg.gae_lambda)
        n = T * B
        obs = r.obs.reshape(n, self.obs_dim).float()
        action = r.action.reshape(n).long()
        old_log_prob = r.log_prob.reshape(n).float()
        advantages = advantages.reshape(n)
        returns = returns.reshape(n)
        stats: list[torch.Tensor] = []
        for epoch in range(cfg.n_epochs):
            last_epoch = epoch == cfg.n_epochs - 1
            order = torch.randperm(n, generator=self.shuffle)
            for start in range(0, n, cfg.batch_size):  # the last, partial minibatch is kept (SB3)
                idx = order[start:start + cfg.batch_size]
                out = ppo_loss(self.policy, self.value, obs[idx], action[idx], old_log_prob[idx],
                               advantages[idx], returns[idx], clip_range, cfg, last_epoch)
                self.optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm, foreach=True)
                self.optimizer.step()
                if last_epoch:  # statistics only where they are reported: one sync at the end
                    with torch.no_grad():
                        clip_fraction, approx_kl = ppo_statistics(out.log_ratio, clip_range)
                        stats.append(torch.stack([out.loss.detach(), out.policy_loss, out.value_loss,
                                                  out.entropy, clip_fraction, approx_kl]))
        self.updates += cfg.n_epochs * -(-n // cfg.batch_size)
        self.rollouts += 1
        *means, last_loss = torch.cat([torch.stack(stats).mean(0), stats[-1][:1]]).tolist()
        result = dict(zip(("loss", "policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl"), means))
        self.last_loss = last_loss  # the last minibatch's
        self.last_clip_fraction = result["clip_fraction"]
        self.last_approx_kl = result["approx_kl"]
        self.last_entropy = result["entropy"]
        return {**result, "lr": lr, "clip_range": clip_range}

    # --- learning beside data-parallel peers (EXARL's multi-learner workflow) ---------------
    def learn_shared(self, traj: Any, peers: Any) -> None:
        """One PPO update with the other learners of a workflow
        (:class:`popplay.deep.topologies.exarl_ranks.Peers`): each learner's rows are the
        whole episodes of ``traj`` (an A2C-style padded ``Trajectory``, or None), their old
        log-probabilities the acting policy's; every epoch cuts each learner's rows into the
        same number of minibatches (the most any learner needs), and every optimiser step
        follows the row-weighted mean gradient over the learners, so all stay identical."""
        cfg = self.config
        budget = getattr(cfg, "env_steps", 0)
        lr, clip_range = cfg.schedule(max(0.0, 1.0 - self.received / budget) if budget else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        data = self._episode_rows(traj) if traj is not None else None
        n = 0 if data is None else int(data[0].shape[0])
        per_epoch = peers.max(-(-n // cfg.batch_size))
        modules = self.networks()
        size = networks.parameter_count(modules)
        for _ in range(cfg.n_epochs):
            chunks = torch.randperm(n, generator=self.shuffle).tensor_split(per_epoch) if n else [None] * per_epoch
            for idx in chunks:
                rows = 0 if idx is None else int(idx.shape[0])
                if rows:
                    obs, action, old_log_prob, advantages, returns = (x[idx] for x in data)
                    out = ppo_loss(self.policy, self.value, obs, action, old_log_prob, advantages, returns,
                                   clip_range, cfg, statistics=False)
                    self.optimizer.zero_grad(set_to_none=True)
                    out.loss.backward()
                    grad = networks.flat_gradients(modules)
                    self.last_loss = float(out.loss.detach())
                else:
                    grad = torch.zeros(size)
                networks.set_flat_gradients(modules, peers.mean(grad, float(rows)).float())
                nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm, foreach=True)
                self.optimizer.step()
                self.updates += 1
        self.rollouts += 1

    def _episode_rows(self, traj: Any) -> tuple[torch.Tensor, ...]:
        """(obs, action, old log-prob, advantages, returns) of the real rows of a padded
        trajectory of whole episodes, one per column: GAE within each episode, a
        time-limit cut bootstrapped from the state it cut."""
        cfg = self.config
        T, B = traj.reward.shape
        with torch.no_grad():
            values = self.value(traj.obs).squeeze(-1) * traj.mask
            cut = traj.truncated * (1.0 - traj.terminated)
            reward = traj.reward + cfg.gamma * cut * self.value(traj.next_obs).squeeze(-1)
            # Each column is one episode: it starts at row 0, and padding (after its end)
            # starts "episodes" of its own, which cut it off from what follows.
            episode_start = torch.cat([torch.ones(1, B), 1.0 - traj.mask[1:]])
            advantages, returns = gae(reward * traj.mask, values, episode_start, torch.zeros(B), torch.ones(B),
                                      cfg.gamma, cfg.gae_lambda)
        real = traj.mask.reshape(-1) > 0
        return (traj.obs.reshape(T * B, -1)[real].float(), traj.action.reshape(-1)[real].long(),
                traj.behaviour_log_prob.reshape(-1)[real].float(), advantages.reshape(-1)[real],
                returns.reshape(-1)[real])

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {**networks.module_arrays(self.policy, "policy"), **networks.module_arrays(self.value, "value"),
                **self.optimizer.arrays("adam"),
                "rng.shuffle": networks.generator_array(self.shuffle)}

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates, "rollouts": self.rollouts, "received": self.received,
                "last_loss": self.last_loss,
                "last_clip_fraction": self.last_clip_fraction, "last_approx_kl": self.last_approx_kl,
                "last_entropy": self.last_entropy}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        networks.load_module_arrays(self.policy, "policy", arrays)
        networks.load_module_arrays(self.value, "value", arrays)
        self.optimizer.load(arrays, "adam")
        networks.load_generator(self.shuffle, arrays["rng.shuffle"])
        self.updates = int(counters["updates"])
        self.rollouts = int(counters["rollouts"])
        self.received = int(counters.get("received", 0))
        for name in ("last_loss", "last_clip_fraction", "last_approx_kl", "last_entropy"):
            setattr(self, name, float(counters.get(name, float("nan"))))

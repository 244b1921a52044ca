"""A2C (Mnih et al. 2016) for discrete actions, with or without V-trace (EXARL's A2C).

A learner receives trajectories played by actors whose copy of the policy may lag
its own (the behaviour policy ``mu``); its loss is

    L = -mean_t[A_t log pi(a_t|s_t)] + value_coef * 0.5 mean_t[(v_t - V(s_t))^2]
        - entropy_coef * mean_t[H(pi(.|s_t))]

with V-trace (:mod:`popplay.deep.agents.vtrace`) targets ``v_t`` and advantages ``A_t``
when ``vtrace`` is on, and otherwise the plain on-policy ones (n-step returns and
``G_t - V(s_t)``, i.e. V-trace with every ratio taken as 1: the behaviour policy is
ignored, which is what breaks A2C when actors lag).

Trajectories are time-major ``(T, B)`` segments: row ``t + 1`` of a column follows
row ``t`` unless an episode ended at ``t``; ``next_obs`` is the real successor
(also at episode ends), so a time-limit cut (``truncated``) is bootstrapped with
``gamma V(next_obs)`` while a termination is not; ``mask`` marks the real steps of
columns padded to a common length (padding comes after an episode end).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from torch import nn

from popplay.deep.agents import networks
from popplay.deep.agents.adam import Adam
from popplay.deep.agents.config import A2CConfig
from popplay.deep.agents.reinforce import SampledPolicy  # noqa: F401  (actors sample as REINFORCE's do)
from popplay.deep.agents.vtrace import vtrace


class Trajectory(NamedTuple):
    obs: torch.Tensor  # (T, B, obs_dim) float32
    action: torch.Tensor  # (T, B) int64
    reward: torch.Tensor  # (T, B) float32
    next_obs: torch.Tensor  # (T, B, obs_dim) float32, the real successor of each step
    terminated: torch.Tensor  # (T, B) float32, 1 where the environment ended the episode
    truncated: torch.Tensor  # (T, B) float32, 1 where a time limit cut the episode
    behaviour_log_prob: torch.Tensor  # (T, B) float32, log mu(a_t|s_t) of the actor that played
    mask: torch.Tensor  # (T, B) float32, 1 on real steps, 0 on padding


class A2CLoss(NamedTuple):
    loss: torch.Tensor  # scalar with gradient
    policy_loss: float
    value_loss: float
    entropy: float
    vs: torch.Tensor  # (T, B) value targets
    advantages: torch.Tensor  # (T, B)
    mean_rho: float  # mean untruncated ratio pi/mu over real steps (1 on policy)


def log_probs(policy: nn.Module, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``log pi(a|s)`` for any leading shape of ``obs``/``action``."""
    logp = torch.log_softmax(policy(obs), dim=-1)
    return logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def a2c_loss(traj: Trajectory, policy: nn.Module, value: nn.Module, config: A2CConfig) -> A2CLoss:
    """The loss above on one batch of trajectories (means over real steps)."""
    T, B = traj.reward.shape
    if traj.obs.shape[:2] != (T, B) or traj.next_obs.shape[:2] != (T, B):
        raise ValueError("trajectory fields disagree on (T, B)")
    mask = traj.mask
    n = mask.sum().clamp(min=1.0)
    logits = policy(traj.obs)
    logp_all = torch.log_softmax(logits, dim=-1)
    target_log_prob = logp_all.gather(-1, traj.action.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    values = value(traj.obs).squeeze(-1)

    with torch.no_grad():
        next_values = value(traj.next_obs).squeeze(-1)
        done = torch.clamp(traj.terminated + traj.truncated, max=1.0)
        # a time-limit cut bootstraps from the real successor inside the reward, so the
        # trace (and the successor row, which starts a new episode) can be cut at every end
        rewards = traj.reward + config.gamma * traj.truncated * (1.0 - traj.terminated) * next_values
        discounts = config.gamma * (1.0 - done)
        bootstrap = next_values[-1]  # weighted by discounts[-1], 0 where the last step ended an episode
        behaviour = traj.behaviour_log_prob if config.vtrace else target_log_prob.detach()
        # padding: ratio 1 and no reward, cut from what precedes it by the episode end
        behaviour = torch.where(mask > 0, behaviour, target_log_prob.detach())
        vt = vtrace(behaviour, target_log_prob.detach(), rewards * mask, values.detach(), bootstrap, discounts,
                    rho_bar=config.rho_bar, c_bar=config.c_bar)
        real_rhos = torch.exp(target_log_prob.detach() - traj.behaviour_log_prob)

    policy_loss = -(vt.pg_advantages * target_log_prob * mask).sum() / n
    value_loss = 0.5 * ((vt.vs - values).pow(2) * mask).sum() / n
    mean_entropy = (entropy * mask).sum() / n
    loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * mean_entropy
    return A2CLoss(loss, float(policy_loss.detach()), float(value_loss.detach()), float(mean_entropy.detach()),
                   vt.vs, vt.pg_advantages, float((real_rhos * mask).sum() / n))


@dataclass(eq=False)
class A2C:
    """The learner's state: policy and value networks and one Adam over both.

    Topologies that train data-parallel call :meth:`gradients` on each learner's share,
    average the flat vectors, and :meth:`apply` the result; a single learner calls
    :meth:`learn`.
    """

    config: A2CConfig
    obs_dim: int
    actions: int
    seed: int

    def __post_init__(self) -> None:
        self.config.validate()
        self.policy, self.value = networks.actor_critic(self.seed, self.obs_dim, self.actions, self.config.hidden)
        self.optimizer = Adam([*self.policy.parameters(), *self.value.parameters()], lr=self.config.lr)
        self.updates = 0
        self.received = 0  # real steps learned from
        self.last_loss = float("nan")
        self.last_mean_rho = float("nan")

    #: Learns from the trajectory it is given, once (no replay): the multi-process
    #: workflows all-reduce its gradient within the round.
    on_policy = True

    def _modules(self) -> nn.ModuleList:
        return nn.ModuleList([self.policy, self.value])

    def networks(self) -> nn.Module:
        """Every learned network (for checksums of the learners' copies)."""
        return self._modules()

    def gradients(self, traj: Trajectory) -> tuple[torch.Tensor, A2CLoss]:
        """The flat gradient (policy then value parameters) of the loss on ``traj``."""
        self.optimizer.zero_grad(set_to_none=True)
        out = a2c_loss(traj, self.policy, self.value, self.config)
        out.loss.backward()
        return networks.flat_gradients(self._modules()), out

    def apply(self, flat_gradient: torch.Tensor) -> None:
        """One Adam step along ``flat_gradient`` (clipped to ``max_grad_norm``)."""
        modules = self._modules()
        networks.set_flat_gradients(modules, flat_gradient)
        nn.utils.clip_grad_norm_(modules.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.updates += 1

    def learn_shared(self, traj: Trajectory | None, peers: Any) -> None:
        """Learn with data-parallel peers (:class:`popplay.deep.topologies.exarl_ranks.Peers`):
        one step along the mean gradient of the learners that hold a trajectory."""
        if traj is not None:
            grad, out = self.gradients(traj)
            self.last_loss, self.last_mean_rho = float(out.loss.detach()), out.mean_rho
        else:
            grad = torch.zeros(networks.parameter_count(self._modules()))
        self.apply(peers.mean(grad, 1.0 if traj is not None else 0.0).float())

    def learn(self, traj: Trajectory) -> A2CLoss:
        grad, out = self.gradients(traj)
        self.apply(grad)
        self.received += int(traj.mask.sum())
        self.last_loss = float(out.loss.detach())
        self.last_mean_rho = out.mean_rho
        return out

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {**networks.module_arrays(self.policy, "policy"), **networks.module_arrays(self.value, "value"),
                **self.optimizer.arrays("adam")}

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates, "received": self.received, "last_loss": self.last_loss,
                "last_mean_rho": self.last_mean_rho}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        networks.load_module_arrays(self.policy, "policy", arrays)
        networks.load_module_arrays(self.value, "value", arrays)
        self.optimizer.load(arrays, "adam")
        self.updates = int(counters["updates"])
        self.received = int(counters["received"])
        self.last_loss = float(counters.get("last_loss", float("nan")))
        self.last_mean_rho = float(counters.get("last_mean_rho", float("nan")))


def trajectory_from_episodes(episodes: Any, policy: nn.Module) -> Trajectory:
    """Pad :class:`~popplay.deep.envs.rollout.Episodes` (one per column) into a trajectory,
    with the behaviour log-probabilities of ``policy`` (the actor's copy that played)."""
    lengths = [int(x) for x in episodes.lengths]
    T, B = max(lengths), len(lengths)
    obs_dim = episodes.obs.shape[1]
    obs = torch.zeros(T, B, obs_dim)
    next_obs = torch.zeros(T, B, obs_dim)
    action = torch.zeros(T, B, dtype=torch.int64)
    reward = torch.zeros(T, B)
    terminated = torch.zeros(T, B)
    truncated = torch.zeros(T, B)
    mask = torch.zeros(T, B)
    start = 0
    for b, length in enumerate(lengths):
        rows = slice(start, start + length)
        obs[:length, b] = torch.as_tensor(episodes.obs[rows])
        next_obs[:length, b] = torch.as_tensor(episodes.next_obs[rows])
        action[:length, b] = torch.as_tensor(episodes.action[rows]).long()
        reward[:length, b] = torch.as_tensor(episodes.reward[rows])
        term = torch.as_tensor(episodes.terminated[rows]).float()
        terminated[:length, b] = term
        if length and term[-1] == 0:
            truncated[length - 1, b] = 1.0  # the episode stopped without the environment ending it
        mask[:length, b] = 1.0
        start += length
    with torch.no_grad():
        blp = log_probs(policy, obs, action)
    return Trajectory(obs, action, reward, next_obs, terminated, truncated, blp, mask)


def greedy_policy(policy: nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    """The most probable action (ties: the lowest), for evaluation."""
    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return policy(torch.as_tensor(obs, dtype=torch.float32)).argmax(dim=-1).numpy()
    return act

"""P REINFORCE learners batched over a leading member axis, in one process.

The rule is :mod:`popplay.deep.agents.reinforce`'s, with one worker per member: a
member plays one episode with its softmax policy, computes the discounted returns
G_t = Σ_k γ^k r_{t+k}, normalises them within the episode, (G − mean) / (std + 0.001),
and takes one Adam step on −Σ_t log π(a_t|s_t) Ĝ_t (summed, not averaged). Members
step in lockstep but their episodes end at different steps: each member learns at the
step its own episode ends, and only the members whose episode ended learn then (their
rows of the stacked network and of Adam move; the others' are untouched).

The episodes wait in (P, L, ...) buffers, L being the environment's time limit, and
every update runs over all L rows with a mask, so a member's arithmetic has the same
shapes whichever members learn beside it: member ``k`` is the same in a population of
any size. Action draws are counter-based (:mod:`popplay.rng`), keyed by (seed, member).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from popplay import rng
from popplay.deep.agents import networks
from popplay.deep.agents.reinforce import NORMALISE_EPS
from popplay.deep.agents.stacked import (
    StackedAdam,
    StackedMLP,
    check_shapes,
    forward_layers,
    load_network_tables,
    member_hypers,
    member_seed,
    network_shapes,
    network_tables,
    stored_hypers,
)
from popplay.deep.topologies.reinforce_params import REINFORCE_HYPER_BOUNDS
from popplay.xp import th

TAG_REINFORCE = 16
_ACT = 0


class ReinforceMembers:
    """P REINFORCE learners for members ``members`` (slots), one environment each whose
    episodes last at most ``horizon`` steps; member ``k`` starts from member
    ``init_from[k]``'s initial policy (default: its own). ``config`` is a
    :class:`popplay.deep.topologies.reinforce_params.ReinforceParams`."""

    hyper_bounds = REINFORCE_HYPER_BOUNDS

    def __init__(self, config: Any, obs_dim: int, actions: int, seed: int, members: np.ndarray,
                 hypers: dict[str, np.ndarray], horizon: int, device: str = "cpu",
                 init_from: np.ndarray | None = None) -> None:
        self.config = config
        self.obs_dim, self.actions, self.seed, self.device = obs_dim, actions, seed, device
        self.horizon = int(horizon)
        self.members = np.asarray(members, dtype=np.int64).reshape(-1)
        p = len(self.members)
        self.hypers = member_hypers(hypers, self.hyper_bounds, p)
        starts = self.members if init_from is None else np.asarray(init_from, dtype=np.int64).reshape(-1)
        policies = [networks.seeded_mlp(member_seed(seed, int(k)), obs_dim, actions, config.hidden) for k in starts]
        self.net = StackedMLP.from_modules(policies, device)
        self.adam = StackedAdam(self.net)
        self.episode_obs = torch.zeros(p, self.horizon, obs_dim, device=device)
        self.episode_action = torch.zeros(p, self.horizon, dtype=torch.int64, device=device)
        self.episode_reward = np.zeros((p, self.horizon), dtype=np.float64)
        self.length = np.zeros(p, dtype=np.int64)  # steps of each member's current episode so far
        self.updates = 0  # this process's optimiser steps, each of one or more members
        self.stepped = np.zeros(p, dtype=np.int64)  # steps of each slot's member (a PBT copy keeps its slot's count)
        self._ended = np.zeros(p, dtype=bool)
        self._keys = torch.as_tensor(rng.stream_keys(seed, TAG_REINFORCE, [_ACT], self.members), device=device)
        self._rng = rng.make_rng(th)
        self.last_losses = np.full(p, np.nan)

    @property
    def count(self) -> int:
        return len(self.members)

    def _logits(self, matrix: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        params = self.net.split(matrix)
        return forward_layers(params[0::2], params[1::2], obs, torch.relu)

    # --- acting ------------------------------------------------------------------------
    def act(self, obs: np.ndarray, step: int) -> np.ndarray:
        """Sampled actions ``(P,)`` at member env-step ``step`` (word ``step`` of each
        member's action stream, by inverse CDF); the observations join the episodes."""
        x = torch.as_tensor(obs, dtype=torch.float32, device=self.device).view(self.count, 1, -1)
        with torch.no_grad():
            probabilities = torch.softmax(self._logits(self.net.matrix, x)[:, 0], dim=-1)
        r = self._rng
        counters = r.mix_counter(torch.tensor([step], dtype=torch.int64, device=self.device))
        u = r.uniform53(r.draw(self._keys[_ACT].unsqueeze(1), counters.unsqueeze(0))).to(torch.float32)
        action = (probabilities.cumsum(dim=-1) < u).sum(dim=-1).clamp_(max=self.actions - 1)
        rows = torch.arange(self.count, device=self.device)
        at = torch.as_tensor(self.length, device=self.device)
        self.episode_obs[rows, at] = x[:, 0]
        self.episode_action[rows, at] = action
        return action.cpu().numpy()

    def greedy_actions(self, obs: np.ndarray) -> np.ndarray:
        """The most probable action of each member for one observation per member (P, obs_dim)."""
        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device).unsqueeze(1)
            return self._logits(self.net.matrix, x)[:, 0].argmax(dim=-1).cpu().numpy()

    # --- learning ----------------------------------------------------------------------
    def receive(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray) -> None:
        """The step :meth:`act` chose actions for: its rewards join the episodes; the
        members whose episode it ended learn at the next :meth:`train`."""
        rows = np.arange(self.count)
        self.episode_reward[rows, self.length] = np.asarray(reward, dtype=np.float64)
        self.length += 1
        self._ended = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        if ((self.length >= self.horizon) & ~self._ended).any():
            raise ValueError(f"an episode ran past the time limit of {self.horizon} steps")

    def train(self, progress: float = 0.0) -> int:
        """One Adam step of every member whose episode just ended; returns how many."""
        learners = np.flatnonzero(self._ended)
        if learners.size == 0:
            return 0
        self._ended[:] = False
        self._learn(learners)
        self.length[learners] = 0
        self.episode_reward[learners] = 0.0
        return int(learners.size)

    def _returns(self, learners: np.ndarray) -> torch.Tensor:
        """Each learner's normalised discounted returns (k, L), 0 past its episode's end."""
        reward = self.episode_reward[learners]
        gamma = self.hypers["gamma"][learners]
        returns = np.zeros_like(reward)
        running = np.zeros(len(learners))
        # float64, as the one-agent rule; past each episode's end the rewards and returns are 0
        for t in range(int(self.length[learners].max()) - 1, -1, -1):
            running = reward[:, t] + gamma * running
            returns[:, t] = running
        g = torch.as_tensor(returns, dtype=torch.float32, device=self.device)
        lengths = torch.as_tensor(self.length[learners], device=self.device)
        mask = (torch.arange(self.horizon, device=self.device).unsqueeze(0) < lengths.unsqueeze(1)).float()
        n = lengths.to(torch.float32).unsqueeze(1)
        mean = (g * mask).sum(dim=1, keepdim=True) / n
        # the sample standard deviation, 0 for a one-step episode (torch's std would be NaN)
        var = (((g - mean) * mask) ** 2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
        return (g - mean) / (var.sqrt() + NORMALISE_EPS) * mask

    def _learn(self, learners: np.ndarray) -> None:
        rows = torch.as_tensor(learners, device=self.device)
        weights = self._returns(learners)
        leaf = self.net.matrix.index_select(0, rows).detach().requires_grad_(True)
        logp_all = torch.log_softmax(self._logits(leaf, self.episode_obs.index_select(0, rows)), dim=-1)
        logp = logp_all.gather(-1, self.episode_action.index_select(0, rows).unsqueeze(-1)).squeeze(-1)
        losses = -(logp * weights).sum(dim=1)
        (grad,) = torch.autograd.grad(losses.sum(), leaf)
        self.net.grad.index_copy_(0, rows, grad)
        lr = torch.as_tensor(self.hypers["lr"], dtype=torch.float64, device=self.device)
        self.adam.step(self.net.grad, lr, rows=learners.tolist())
        self.last_losses[learners] = losses.detach().cpu().numpy()
        self.updates += 1
        self.stepped[learners] += 1

    def member_updates(self) -> np.ndarray:
        """The optimiser steps each member slot has taken (members learn at their own moments)."""
        return self.stepped

    # --- population operators --------------------------------------------------------
    def losses(self) -> np.ndarray:
        return self.last_losses

    def parameter_tables(self) -> list[torch.Tensor]:
        return [self.net.matrix]

    def member_tables(self, *, replay: bool) -> list[torch.Tensor]:
        """What a PBT copy moves, member axis first: the policy and Adam state. An
        episode under way belongs to the member's own environment and is kept: the copy
        plays it on with its new policy and learns from it whole at its end (the one
        step in which its earlier actions came from another policy)."""
        return [self.net.matrix, self.adam.exp_avg, self.adam.exp_avg_sq, self.adam.steps]

    def set_hypers(self, hypers: dict[str, np.ndarray]) -> None:
        self.hypers = member_hypers(hypers, self.hypers, self.count)

    def member_module(self, slot: int) -> torch.nn.Sequential:
        """Member ``slot``'s policy (logits) as the ``nn.Sequential`` one REINFORCE agent has."""
        module = networks.mlp(self.obs_dim, self.actions, self.config.hidden)
        torch.nn.utils.vector_to_parameters(self.net.matrix[slot].detach().cpu().clone(), module.parameters())
        return module

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        # the episodes under way, whole buffers: every rank's block has the same shape to gather
        out = {**network_tables(self.net, self.adam), "members.episode.obs": self.episode_obs,
               "members.episode.action": self.episode_action}
        arrays = {name: value.detach().cpu().numpy().copy() for name, value in out.items()}
        arrays["members.episode.reward"] = self.episode_reward.copy()
        arrays["members.episode.length"] = self.length.copy()
        arrays["members.stepped"] = self.stepped.copy()
        arrays.update({f"hyper.{name}": values.copy() for name, values in self.hypers.items()})
        return arrays

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        length = np.asarray(arrays.get("members.episode.length", np.zeros(0)), dtype=np.int64)
        if length.shape != (self.count,) or (length < 0).any() or (length >= self.horizon).any():
            raise ValueError(f"members.episode.length: {self.count} lengths in [0, {self.horizon}) expected")
        check_shapes(arrays, {**network_shapes(self.net), "members.episode.obs": tuple(self.episode_obs.shape),
                              "members.episode.action": tuple(self.episode_action.shape),
                              "members.episode.reward": self.episode_reward.shape})
        hypers = stored_hypers(arrays, self.hyper_bounds, self.count)
        take = lambda key: torch.as_tensor(np.asarray(arrays[key]), device=self.device)  # noqa: E731
        load_network_tables(self.net, self.adam, arrays)
        self.episode_obs.copy_(take("members.episode.obs").to(torch.float32))
        self.episode_action.copy_(take("members.episode.action").to(torch.int64))
        self.episode_reward[:] = np.asarray(arrays["members.episode.reward"], dtype=np.float64)
        self.length = length.copy()
        stepped = np.asarray(arrays.get("members.stepped", np.zeros(0)), dtype=np.int64)
        if stepped.shape != (self.count,) or (stepped < 0).any():
            raise ValueError(f"members.stepped: {self.count} non-negative counts expected")
        self.stepped = stepped.copy()
        self._ended[:] = False
        self.updates = int(counters["updates"])
        self.set_hypers(hypers)

"""P Double DQN learners batched over a leading member axis, in one process.

Each member has its own online and target networks (rows of a
:class:`popplay.deep.agents.stacked.StackedMLP`), Adam state, replay memory, random
streams and per-member hyper-parameters (:data:`HYPER_BOUNDS`); the rule is
:mod:`popplay.deep.agents.dqn`'s (equation (1) targets, Huber loss, clipped gradient,
Adam, periodic target refresh, ε falling with updates). Members step in lockstep, so
the shapes are fixed: every member holds the same number of transitions and has made
the same number of updates; only values differ.

Random streams are counter-based (:mod:`popplay.rng`) keyed by (seed, member index):
the ε-greedy draws at member env-step ``t`` and the minibatch of update ``u`` are pure
functions of those, so member ``k`` of a population behaves exactly as member ``k``
alone, on any number of members or ranks, and a resume needs only the counters.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from popplay import rng
from popplay.deep.agents import networks
from popplay.deep.agents.dqn import DQNConfig
from popplay.deep.agents.member_replay import MemberReplay
from popplay.deep.agents.stacked import (
    TAG_MEMBER,
    StackedAdam,
    StackedMLP,
    check_shapes,
    clip_rows_,
    member_arrays,
    member_hypers,
    member_seed,
    stored_hypers,
)
from popplay.deep.topologies.dqn_params import HYPER_BOUNDS
from popplay.xp import th

_EXPLORE, _SAMPLE = 0, 1
#: Env-steps whose exploration draws :meth:`DQNMembers.act` makes at once.
EXPLORE_BLOCK = 256

class DQNMembers:
    """P Double DQN learners with members ``members`` (their indices in the population).

    ``hypers`` maps each name of :data:`HYPER_BOUNDS` to a (P,) float64 array; member
    ``k`` starts from member ``init_from[k]``'s initial networks (default: its own).
    """

    def __init__(self, config: DQNConfig, obs_dim: int, actions: int, seed: int, members: np.ndarray,
                 hypers: dict[str, np.ndarray], device: str = "cpu", init_from: np.ndarray | None = None) -> None:
        config.validate()
        if config.lr_updates:
            raise ValueError("lr_updates: a population's learning rates are per member (--hp lr=...), "
                             "not a schedule")
        self.config = config
        self.obs_dim, self.actions, self.seed, self.device = obs_dim, actions, seed, device
        self._on_cpu = torch.device(device).type == "cpu"
        self.members = np.asarray(members, dtype=np.int64).reshape(-1)
        p = len(self.members)
        self.hypers = member_hypers(hypers, HYPER_BOUNDS, p)
        starts = self.members if init_from is None else np.asarray(init_from, dtype=np.int64).reshape(-1)
        modules = [networks.seeded_mlp(member_seed(seed, int(k)), obs_dim, actions, config.hidden) for k in starts]
        self.online = StackedMLP.from_modules(modules, device)
        self.target = StackedMLP(self.online.matrix.clone(), self.online.shapes)
        self.adam = StackedAdam(self.online)
        self.replay = MemberReplay(p, config.replay_capacity, obs_dim, (), torch.int64, batch_size=config.batch_size,
                                   learning_starts=config.learning_starts, update_ratio=config.update_ratio,
                                   device=device)
        self.updates = 0
        keys = rng.stream_keys(seed, TAG_MEMBER, [_EXPLORE, _SAMPLE], self.members)
        self._keys = torch.as_tensor(keys, device=device)
        self._rng = rng.make_rng(th)
        self._hyper_tensors()

    # --- hyper-parameters as tensors (refreshed when members change) ---------------
    def _hyper_tensors(self) -> None:
        h = self.hypers
        as32 = lambda name: torch.as_tensor(h[name], dtype=torch.float32, device=self.device)  # noqa: E731
        self._gamma = as32("gamma").unsqueeze(1)
        self._lr = torch.as_tensor(h["lr"], dtype=torch.float64, device=self.device)
        self._max_norm = as32("max_grad_norm")
        self._target_every = h["target_every"].astype(np.int64)
        self._epsilons_at = -1  # the ε schedules may have changed

    @property
    def count(self) -> int:
        return len(self.members)

    def epsilons(self) -> np.ndarray:
        """Each member's ε after :attr:`updates` updates (linear, then flat)."""
        h = self.hypers
        fraction = np.minimum(1.0, self.updates / h["epsilon_updates"])
        return h["epsilon_start"] + fraction * (h["epsilon_end"] - h["epsilon_start"])

    # --- acting ---------------------------------------------------------------------
    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """(P, B, actions) Q values of observations (P, B, obs_dim), no autograd."""
        if obs.dtype != torch.float32 or obs.device != self.online.matrix.device:
            obs = obs.to(self.device, torch.float32)
        return self.online.forward(obs)

    def act(self, obs: np.ndarray, step: int) -> np.ndarray:
        """ε-greedy actions (P,) for one observation per member (P, obs_dim) at member
        env-step ``step``: draw ``rng.draw(explore key, step)``, its high half against
        ε, its low half for the random action."""
        # On the CPU the choice is made in NumPy (the draws come as arrays there): a step's
        # handful of small tensor operations around the forward pass cost about as much as
        # the pass itself (64 members).
        chance, random = self._explore_draws(step)
        epsilons = self._epsilons_now()
        explore = chance < (epsilons if self._on_cpu else torch.as_tensor(epsilons, device=self.device))
        # Skipping the forward pass when every member explores pays on the CPU; on a
        # GPU the question would be a second wait per step (the actions are the first).
        if self._on_cpu and explore.all():
            return random
        values = self.q_values(torch.from_numpy(np.asarray(obs, dtype=np.float32)).unsqueeze(1))
        if self._on_cpu:  # NumPy's argmax: the first maximum, a NaN counting as one, as torch's
            return np.where(explore, random, values.numpy()[:, 0].argmax(axis=1))
        return torch.where(explore, random, values[:, 0].argmax(dim=1)).cpu().numpy()

    def _epsilons_now(self) -> np.ndarray:
        """:meth:`epsilons`, computed once per update count (acting asks at every step)."""
        if self._epsilons_at != self.updates:
            self._epsilons, self._epsilons_at = self.epsilons(), self.updates
        return self._epsilons

    _epsilons_at = -1

    def _explore_draws(self, step: int) -> tuple[Any, Any]:
        """Member env-step ``step``'s draws (P,): the uniform that ε is compared with and
        the random action, as NumPy arrays on the CPU (tensors elsewhere). The words of
        :data:`EXPLORE_BLOCK` steps are drawn at once (a stream's words are pure
        functions of their counters, so a block holds the same bits as one draw a step,
        with a twentieth of the small tensor operations)."""
        start = step - step % EXPLORE_BLOCK
        if self._explore_start != start:
            r = self._rng
            counters = r.mix_counter(torch.arange(start, start + EXPLORE_BLOCK, dtype=torch.int64, device=self.device))
            words = r.draw(self._keys[_EXPLORE].unsqueeze(0), counters.unsqueeze(1))  # (steps, P): rows contiguous
            self._explore_chance = r.uniform_hi32(words)
            self._explore_action = (r.uniform_lo32(words) * self.actions).to(torch.int64)
            if self._on_cpu:
                self._explore_chance, self._explore_action = self._explore_chance.numpy(), self._explore_action.numpy()
            self._explore_start = start
        # a copy: the actions go out to the environments, and must not alias the block
        return self._explore_chance[step - start], self._explore_action[step - start].copy() if self._on_cpu \
            else self._explore_action[step - start].clone()

    _explore_start = -1

    # --- learning -------------------------------------------------------------------
    def receive(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
                terminated: np.ndarray, truncated: np.ndarray) -> None:
        """One transition per member (rows in member order); owes ``update_ratio``
        updates per member transition once ``learning_starts`` are stored (the one-agent
        rule, :class:`popplay.deep.agents.credit.UpdateCredit`). A time-limit cut
        (``truncated``) still bootstraps: only ``terminated`` is stored."""
        self.replay.store(obs, action, reward, next_obs, terminated)

    def train(self, progress: float = 0.0) -> int:
        """Run the updates owed, once ``learning_starts`` transitions are stored; returns
        how many (``progress``, the fraction of the budget done, is for schedules DQN
        does not have)."""
        owed = self.replay.owed()
        for _ in range(owed):
            self.update()
        return owed

    def sample_index(self) -> torch.Tensor:
        """(P, batch) replay slots of update :attr:`updates`: uniform with replacement,
        word ``updates·batch + j`` of each member's sample stream."""
        return self.replay.sample_index(self._rng, self._keys[_SAMPLE], self.updates)

    def update(self) -> None:
        """One Double DQN step of every member on its own minibatch."""
        b = self.config.batch_size
        rows = self.replay.batch(self.sample_index())
        obs, next_obs, reward, terminated = rows["obs"], rows["next_obs"], rows["reward"], rows["terminated"]
        action = rows["action"].unsqueeze(2)
        states = torch.cat([obs, next_obs], dim=1)
        hidden: list[torch.Tensor] = []
        q_both = self.online.forward(states, hidden)
        best = q_both[:, b:].argmax(dim=2, keepdim=True)
        value = self.target.forward(next_obs).gather(2, best).squeeze(2)
        targets = reward + self._gamma * (1.0 - terminated) * value
        errors = q_both[:, :b].gather(2, action).squeeze(2) - targets
        grad_q = errors.clamp(-1.0, 1.0).mul_(1.0 / b)
        grad_output = torch.zeros_like(q_both[:, :b]).scatter_(2, action, grad_q.unsqueeze(2))
        grad = self.online.backward(states[:, :b], [h[:, :b] for h in hidden], grad_output)
        clip_rows_(grad, self._max_norm)
        self.adam.step(grad, self._lr)
        self.updates += 1
        due = np.flatnonzero(self.updates % self._target_every == 0)
        if due.size:
            index = torch.as_tensor(due, device=self.device)
            self.target.matrix[index] = self.online.matrix[index]
        self.last_errors = errors

    last_errors: torch.Tensor | None = None

    def losses(self) -> np.ndarray:
        """Each member's Huber loss on its latest minibatch (NaN before any update)."""
        if self.last_errors is None:
            return np.full(self.count, np.nan)
        e = self.last_errors
        return F.smooth_l1_loss(e, torch.zeros_like(e), reduction="none").mean(dim=1).cpu().numpy()

    # --- what the population operators act on -------------------------------------------
    def member_tables(self, *, replay: bool) -> list[torch.Tensor]:
        """What a PBT copy moves, member axis first: networks, Adam state and (with
        ``replay``) the replay memory."""
        tables = [self.online.matrix, self.target.matrix, self.adam.exp_avg, self.adam.exp_avg_sq, self.adam.steps]
        return tables + (list(self.replay.tables.values()) if replay else [])

    def member_module(self, slot: int) -> torch.nn.Sequential:
        """Member ``slot``'s online network as the ``nn.Sequential`` one DQN agent has (a CPU copy)."""
        module = networks.mlp(self.obs_dim, self.actions, self.config.hidden)
        torch.nn.utils.vector_to_parameters(self.online.matrix[slot].detach().cpu().clone(), module.parameters())
        return module

    def parameter_tables(self) -> list[torch.Tensor]:
        """The (P, n) tables that sharing averages: online and target networks."""
        return [self.online.matrix, self.target.matrix]

    def set_hypers(self, hypers: dict[str, np.ndarray]) -> None:
        self.hypers = member_hypers(hypers, self.hypers, self.count)
        self._hyper_tensors()

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """Everything that changes, member axis first; replay rows oldest first."""
        out = {"online": self.online.matrix, "target": self.target.matrix, "adam.exp_avg": self.adam.exp_avg,
               "adam.exp_avg_sq": self.adam.exp_avg_sq, "adam.steps": self.adam.steps,
               **{f"replay.{name}": table for name, table in self.replay.arrays().items()}}
        return member_arrays(out, self.hypers)

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates, **self.replay.counters()}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any]) -> None:
        """Restore :meth:`arrays` and :meth:`counters`; ValueError (one line) on shapes
        that do not fit this population."""
        expected = {"online": tuple(self.online.matrix.shape), "target": tuple(self.online.matrix.shape),
                    "adam.exp_avg": tuple(self.online.matrix.shape), "adam.exp_avg_sq": tuple(self.online.matrix.shape),
                    "adam.steps": (self.count,)}
        check_shapes(arrays, {f"members.{name}": shape for name, shape in expected.items()})
        hypers = stored_hypers(arrays, HYPER_BOUNDS, self.count)
        self.replay.load(arrays, counters, "members.replay.")
        take = lambda key: torch.as_tensor(np.asarray(arrays[key]), device=self.device)  # noqa: E731
        self.online.matrix.copy_(take("members.online"))
        self.target.matrix.copy_(take("members.target"))
        self.adam.exp_avg.copy_(take("members.adam.exp_avg"))
        self.adam.exp_avg_sq.copy_(take("members.adam.exp_avg_sq"))
        self.adam.steps.copy_(take("members.adam.steps"))
        self.updates = int(counters["updates"])
        self.set_hypers(hypers)

"""The replay memories of a population's members: (P, capacity, ...) rings written in
lockstep, the update credit they owe, and their minibatches.

Every member stores one transition per step, so the rings share one position and size;
a member's minibatch of update ``u`` is drawn from its own counter-based stream
(:mod:`popplay.rng`, word ``u·batch + j``), so member ``k`` samples the same slots in a
population of any size. Shared by the replay agents' population learners (DQN's,
DDPG's and TD3's).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from popplay.deep.agents.stacked import check_shapes
from popplay.xp import npx, th

FIELDS = ("obs", "action", "reward", "next_obs", "terminated")
#: Updates whose minibatch words :meth:`MemberReplay.sample_index` draws at once.
SAMPLE_BLOCK = 16


def _slots(xp: Any, uniform: Any, size: int) -> Any:
    """Ring slots from uniforms in [0, 1): ⌊u·size⌋, at most the last of ``size`` stored."""
    slots = xp.to_int(uniform * size)
    return xp.where(slots < size - 1, slots, size - 1)


class MemberReplay:
    """P rings of ``capacity`` transitions; actions of ``action_shape`` and ``action_dtype``
    (DQN: ``()`` int64; a continuous agent: ``(action_dim,)`` float32)."""

    def __init__(self, members: int, capacity: int, obs_dim: int, action_shape: tuple[int, ...],
                 action_dtype: torch.dtype, *, batch_size: int, learning_starts: int, update_ratio: float,
                 device: str = "cpu") -> None:
        self.count, self.capacity, self.obs_dim = members, capacity, obs_dim
        self.batch_size, self.learning_starts, self.update_ratio = batch_size, learning_starts, update_ratio
        self.device = device
        # One float32 row per transition, fields side by side (obs | action | reward |
        # next_obs | terminated): a minibatch is one gather of a few adjacent words per
        # slot, not one scattered read per field (five gathers cost about three times as
        # much at 64 members). Actions are held as float32, exact for the small integers
        # of a discrete agent and for a continuous agent's own values.
        self.action_dtype = action_dtype
        widths = {"obs": obs_dim, "action": math.prod(action_shape), "reward": 1, "next_obs": obs_dim,
                  "terminated": 1}
        shapes = {"obs": (obs_dim,), "action": tuple(action_shape), "reward": (), "next_obs": (obs_dim,),
                  "terminated": ()}
        self.packed = torch.zeros(members, capacity, sum(widths.values()), device=device)
        self._fields: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        start = 0
        for name in FIELDS:
            self._fields[name] = (start, widths[name], shapes[name])
            start += widths[name]
        #: Each field as a view (P, capacity, ...) into :attr:`packed`: a write to one
        #: writes the row a minibatch reads. A PBT copy moves these field by field, so a
        #: copy across ranks buffers one field at a time, not whole packed rows.
        self.tables = {name: self._field(self.packed, name) for name in FIELDS}
        self._row = np.zeros((members, self.packed.shape[2]), dtype=np.float32)
        self._host_packed = self.packed.numpy() if self.packed.device.type == "cpu" else None
        self.position = 0  # next slot of every ring
        self.size = 0
        self.added = 0  # transitions each member has stored (the ring's next slot: this mod capacity)
        self.update_credit = 0.0
        self._row_base = torch.arange(members, device=device) * capacity

    def store(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
              terminated: np.ndarray) -> None:
        """One transition per member (rows in member order); owes ``update_ratio``
        updates per member transition once ``learning_starts`` are stored (the one-agent
        rule, :class:`popplay.deep.agents.credit.UpdateCredit`)."""
        at, row = self.position, self._row
        # On the CPU the slot is written in place through a NumPy view of the rings:
        # staging a row and copying it in as a tensor took twice as long (64 members).
        target = row if self._host_packed is None else self._host_packed[:, at]
        for name, values in (("obs", obs), ("action", action), ("reward", reward), ("next_obs", next_obs),
                             ("terminated", terminated)):
            start, width, _ = self._fields[name]
            target[:, start:start + width] = np.asarray(values).reshape(len(row), width)
        if self._host_packed is None:
            self.packed[:, at] = torch.from_numpy(row).to(self.device)
        self.position = (at + 1) % self.capacity
        self.size = min(self.capacity, self.size + 1)
        self.added += 1
        if self.size >= self.learning_starts:  # owed from then on, as UpdateCredit owes them
            self.update_credit += self.update_ratio

    def owed(self) -> int:
        """The updates owed now (taken off the credit); none before ``learning_starts``."""
        if self.size < max(1, self.learning_starts):
            return 0
        owed = int(self.update_credit)
        self.update_credit -= owed
        return owed

    def sample_index(self, rng: Any, keys: torch.Tensor, update: int) -> torch.Tensor:
        """(P, batch) slots of update ``update``: uniform with replacement, word
        ``update·batch + j`` of each member's stream ``keys`` (P,). The words of
        :data:`SAMPLE_BLOCK` updates are drawn at once (pure functions of their counters:
        the same bits as a draw per update, with a sixteenth of the small operations)."""
        b = self.batch_size
        start = update - update % SAMPLE_BLOCK
        if self._sample_start != start or not self._drawn_with(keys):
            counters = rng.mix_counter(torch.arange(start * b, (start + SAMPLE_BLOCK) * b, dtype=torch.int64,
                                                    device=self.device))
            self._sample_uniform = rng.uniform53(rng.draw(keys.unsqueeze(1), counters.unsqueeze(0)))
            # held, so no other tensor can take its address while the block is used
            self._sample_start, self._sample_keys, self._sample_version = start, keys, keys._version
        at = (update - start) * b
        if self._host_packed is not None:  # in NumPy: as three small tensor operations they took 1.5x as long
            return torch.from_numpy(_slots(npx, self._sample_uniform.numpy()[:, at:at + b], self.size))
        return _slots(th, self._sample_uniform[:, at:at + b], self.size)

    _sample_start = -1
    _sample_keys: torch.Tensor | None = None
    _sample_version = -1

    def _drawn_with(self, keys: torch.Tensor) -> bool:
        """Whether the block was drawn with these very keys, unchanged since: compared by
        address, shape and version counter (comparing values would make the host wait
        for a device every update)."""
        held = self._sample_keys
        return held is not None and keys.data_ptr() == held.data_ptr() and keys.shape == held.shape \
            and keys.stride() == held.stride() and keys._version == self._sample_version

    def batch(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every field at slots ``index`` (P, batch), member-major: (P, batch, ...)."""
        p, b = index.shape
        flat = (self._row_base.unsqueeze(1) + index).reshape(-1)
        # index_select, not table[flat]: advanced indexing's general kernel took about 3x as
        # long for these few thousand rows
        rows = torch.index_select(self.packed.view(p * self.capacity, -1), 0, flat).view(p, b, -1)
        out = {name: self._field(rows, name) for name in FIELDS}
        out["action"] = out["action"].to(self.action_dtype)
        return out

    def _field(self, rows: torch.Tensor, name: str) -> torch.Tensor:
        """Field ``name`` of packed ``rows`` (P, n, width) as a view (P, n, *shape)."""
        start, width, shape = self._fields[name]
        piece = rows[:, :, start:start + width]
        return piece.squeeze(2) if shape == () else piece.unflatten(2, shape)

    # --- run-file arrays ------------------------------------------------------------
    def arrays(self) -> dict[str, torch.Tensor]:
        """The stored rows, oldest first, member axis first."""
        slots = torch.arange(self.size, device=self.device)
        order = slots if self.size < self.capacity else (self.position + slots) % self.capacity
        return {name: table[:, order].to(self.action_dtype if name == "action" else table.dtype)
                for name, table in self.tables.items()}

    def counters(self) -> dict[str, Any]:
        return {"update_credit": self.update_credit, "replay_size": self.size, "replay_added": self.added}

    def expected(self, size: int) -> dict[str, tuple[int, ...]]:
        """The shapes :meth:`arrays` gives for ``size`` stored rows."""
        return {name: (self.count, size, *table.shape[2:]) for name, table in self.tables.items()}

    def load(self, arrays: dict[str, np.ndarray], counters: dict[str, Any], prefix: str) -> None:
        """Restore :meth:`arrays` (named ``prefix + field``) and :meth:`counters`;
        ValueError (one line) on counts or shapes that do not fit."""
        size = int(counters["replay_size"])
        if not 0 <= size <= self.capacity:
            raise ValueError(f"replay_size {size} outside [0, {self.capacity}]")
        added = int(counters["replay_added"])
        if added < size:
            raise ValueError(f"replay_added {added} is below replay_size {size}")
        check_shapes(arrays, {prefix + name: shape for name, shape in self.expected(size).items()})
        cap = self.capacity
        # each transition back in its slot (minibatches draw slots): a full ring's next slot is added mod capacity
        position = added % cap if size == cap else size
        slots = ((position + torch.arange(size)) % cap if size == cap else torch.arange(size)).to(self.device)
        self.packed.zero_()
        for name, table in self.tables.items():
            table[:, slots] = torch.as_tensor(np.asarray(arrays[prefix + name]), device=self.device).to(table.dtype)
        self.size, self.position, self.added = size, position, added
        self.update_credit = float(counters["update_credit"])

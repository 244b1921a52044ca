"""The update credit every replay learner keeps: ``update_ratio`` gradient updates
owed per transition received once replay holds ``learning_starts`` (Grandio §III-C),
paid by :meth:`UpdateCredit.train`."""
from __future__ import annotations

from typing import Any


class UpdateCredit:
    """Mix-in for learners with ``config``, ``replay``, ``received``,
    ``update_credit`` and an ``update()`` that runs one gradient step."""

    config: Any
    replay: Any
    received: int
    update_credit: float

    def update(self) -> float | None:
        raise NotImplementedError

    def receive(self, batch: Any) -> None:
        """Store transitions and owe ``update_ratio`` updates for each."""
        self.replay.add(batch)
        self.received += int(batch.obs.shape[0])
        if len(self.replay) >= self.config.learning_starts:
            self.update_credit += self.config.update_ratio * int(batch.obs.shape[0])

    def owed_updates(self) -> int:
        return int(self.update_credit)

    def train(self, max_updates: int | None = None) -> int:
        """Run the owed updates (at most ``max_updates``); return how many ran."""
        n = self.owed_updates() if max_updates is None else min(max_updates, self.owed_updates())
        for _ in range(n):
            self.update()
        self.update_credit -= n
        return n

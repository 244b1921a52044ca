"""What the deep agents' (and runs') config dataclasses share: ``hidden`` widths
stored as a list in run files, and the network checks every learner makes."""
from __future__ import annotations

import dataclasses
from typing import Any


class HiddenConfig:
    """Mix-in for frozen config dataclasses with a ``hidden`` tuple of layer widths."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        d["hidden"] = list(self.hidden)  # type: ignore[attr-defined]
        return d


def check_at_least_one(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1 (got {value})")


def check_network(config: Any, positive: tuple[str, ...] = ("lr",)) -> None:
    """Positive layer widths, positive ``positive`` fields (learning rates...), γ in [0, 1]."""
    if not config.hidden or any(h < 1 for h in config.hidden):
        raise ValueError(f"hidden must list positive layer widths (got {config.hidden})")
    for name in positive:
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be positive (got {getattr(config, name)})")
    if not 0.0 <= config.gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1] (got {config.gamma})")


def check_replay_start(config: Any) -> None:
    """A replay agent's ``learning_starts``: non-negative, and within ``replay_capacity``
    (else the memory never holds that many transitions and the first update never comes)."""
    if config.learning_starts < 0:
        raise ValueError(f"learning_starts must be non-negative (got {config.learning_starts})")
    if config.learning_starts > config.replay_capacity:
        raise ValueError(f"learning_starts ({config.learning_starts}) exceeds the replay capacity "
                         f"({config.replay_capacity}): the memory never holds that many transitions, so "
                         "nothing would be learned")

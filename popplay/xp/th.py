"""Torch tensor namespace (see :mod:`popplay.xp`)."""
from __future__ import annotations

from typing import Any, Callable

import torch

vectorized = True


def fn(function: Callable) -> Callable:
    return function


# torch's int64 arithmetic wraps modulo 2**64 on every device.
def add64(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    return a + b


def mul64(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    return a * b


def to_float(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def to_int(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64)


floor = torch.floor
frexp = torch.frexp
ldexp = torch.ldexp
where = torch.where
abs = torch.abs  # noqa: A001


# Array plumbing for rules that run a state machine over pending lanes (the ziggurat).
def broadcast(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.broadcast_tensors(*tensors))


def nonzero(mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return mask.nonzero(as_tuple=True)


def size(x: torch.Tensor) -> int:
    return x.numel()


def arange(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(n, device=like.device)


def empty_float(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(like.shape, dtype=torch.float64, device=like.device)


def zeros_bool(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like, dtype=torch.bool)


zeros_like = torch.zeros_like


class _Table:
    """A float64 table copied once to each device that indexes it."""

    def __init__(self, values: Any) -> None:
        self._values = values
        self._by_device: dict[Any, torch.Tensor] = {}

    def on(self, device: Any) -> torch.Tensor:
        if device not in self._by_device:
            self._by_device[device] = torch.as_tensor(self._values, dtype=torch.float64, device=device)
        return self._by_device[device]

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        return self.on(index.device)[index]


def table(values: Any) -> _Table:
    """A float64 look-up table indexed by tensors on any device."""
    return _Table(values)


sigmoid = torch.sigmoid

"""Torch tensor namespace (see :mod:`popplay.xp`)."""
from __future__ import annotations

from typing import Callable

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

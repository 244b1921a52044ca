"""Small networks and the tensor plumbing every agent shares: flat parameter and
gradient vectors (what topologies send), and arrays for run files (no pickle)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


def mlp(in_dim: int, out_dim: int, hidden: Sequence[int] = (64, 64), activation: str = "relu") -> nn.Sequential:
    """A fully connected network ``in_dim -> hidden... -> out_dim`` (no output activation)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)} (got {activation!r})")
    layers: list[nn.Module] = []
    width = in_dim
    for size in hidden:
        layers += [nn.Linear(width, int(size)), ACTIVATIONS[activation]()]
        width = int(size)
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


def seeded_mlp(seed: int, *args: Any, **kwargs: Any) -> nn.Sequential:
    """:func:`mlp` with weights drawn from ``seed`` alone (the global generator is
    left as it was), so every rank can build the same network."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return mlp(*args, **kwargs)


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """All parameters as one detached float32 vector (the order of ``parameters()``)."""
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def load_flat_parameters(module: nn.Module, vector: torch.Tensor) -> None:
    """Copy a vector made by :func:`flat_parameters` into ``module`` in place."""
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            n = p.numel()
            p.copy_(vector[offset:offset + n].view_as(p))
            offset += n
    if offset != vector.numel():
        raise ValueError(f"parameter vector has {vector.numel()} values; the network has {offset}")


def flat_gradients(module: nn.Module) -> torch.Tensor:
    """All gradients as one vector (zeros where a parameter has none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in module.parameters()])


def set_flat_gradients(module: nn.Module, vector: torch.Tensor) -> None:
    """Make ``vector`` (laid out as :func:`flat_gradients`) the parameters' gradients."""
    offset = 0
    for p in module.parameters():
        n = p.numel()
        p.grad = vector[offset:offset + n].view_as(p).clone()
        offset += n


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- run-file arrays --------------------------------------------------------------

def module_arrays(module: nn.Module, prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}.{name}": t.detach().cpu().numpy().copy() for name, t in module.state_dict().items()}


def load_module_arrays(module: nn.Module, prefix: str, arrays: dict[str, np.ndarray]) -> None:
    state = {}
    for name, t in module.state_dict().items():
        value = arrays[f"{prefix}.{name}"]
        if tuple(value.shape) != tuple(t.shape):
            raise ValueError(f"{prefix}.{name}: shape {value.shape}, expected {tuple(t.shape)}")
        state[name] = torch.as_tensor(value, dtype=t.dtype)
    module.load_state_dict(state)


def generator_array(generator: torch.Generator) -> np.ndarray:
    """A torch generator's position as bytes (restored by :func:`load_generator`)."""
    return generator.get_state().numpy().copy()


def load_generator(generator: torch.Generator, array: np.ndarray) -> None:
    generator.set_state(torch.as_tensor(np.asarray(array, dtype=np.uint8)))


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed) & ((1 << 63) - 1))
    return g


def actor_critic(seed: int, obs_dim: int, actions: int, hidden: tuple[int, ...]) -> tuple[nn.Module, nn.Module]:
    """Separate tanh policy (logits) and value networks, seeded ``seed`` and ``seed + 1``
    (A2C's and PPO's, as stable-baselines3's ``MlpPolicy``)."""
    return seeded_mlp(seed, obs_dim, actions, hidden, "tanh"), seeded_mlp(seed + 1, obs_dim, 1, hidden, "tanh")

"""The written-out network update (popplay.deep.agents.flat) against torch's own: autograd
gradients, torch.optim.Adam, clip_grad_norm_, and Double DQN's update against the
autograd loss it replaces."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from popplay.deep.agents import dqn
from popplay.deep.agents import networks
from popplay.deep.agents.flat import FlatAdam, FlatMLP, clip_norm_
from popplay.deep.agents.replay import Batch
from tests.reference.dqn import AutogradDoubleDQN


@pytest.mark.parametrize("in_dim, hidden, out_dim", [(4, (256, 256), 2), (3, (8,), 5), (40, (16, 32, 8), 3)])
def test_backward_is_autograds_gradient(in_dim: int, hidden: tuple[int, ...], out_dim: int) -> None:
    module = networks.seeded_mlp(1, in_dim, out_dim, hidden)
    reference = networks.seeded_mlp(1, in_dim, out_dim, hidden)
    flat = FlatMLP(module)
    x = torch.randn(32, in_dim, generator=networks.generator(2))
    weights = torch.randn(32, out_dim, generator=networks.generator(3))
    hidden_out: list[torch.Tensor] = []
    out = flat.forward(x, hidden_out)
    assert torch.equal(out, reference(x).detach())  # the module's own kernels
    assert len(hidden_out) == len(hidden)
    grad = flat.backward(x, hidden_out, weights)  # d(sum(weights * out))/d(out) = weights
    (reference(x) * weights).sum().backward()
    torch.testing.assert_close(grad, networks.flat_gradients(reference), rtol=1e-5, atol=1e-6)


def test_module_parameters_are_views_of_the_vector() -> None:
    module = networks.seeded_mlp(0, 3, 2, (5,))
    before = networks.flat_parameters(module)
    flat = FlatMLP(module)
    assert torch.equal(flat.vector, before)
    flat.vector.add_(1.0)  # the module sees what the update writes
    assert torch.equal(networks.flat_parameters(module), before + 1.0)
    other = networks.seeded_mlp(7, 3, 2, (5,))
    module.load_state_dict(other.state_dict())  # in-place loads reach the vector
    assert torch.equal(flat.vector, networks.flat_parameters(other))
    x = torch.randn(4, 3)
    assert torch.equal(flat.forward(x), module(x).detach())


def test_only_relu_mlps_are_flattened() -> None:
    with pytest.raises(ValueError, match="ReLU"):
        FlatMLP(networks.mlp(3, 2, (4,), activation="tanh"))
    with pytest.raises(ValueError, match="Linear"):
        FlatMLP(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))


def test_clip_norm_is_clip_grad_norm() -> None:
    module = networks.seeded_mlp(0, 3, 2, (6, 6))
    for scale in (0.01, 100.0):  # below and above the bound
        for i, p in enumerate(module.parameters()):
            p.grad = scale * torch.randn(p.shape, generator=networks.generator(i))
        flat = networks.flat_gradients(module)
        norm = clip_norm_(flat, 1.0)
        expected = nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        torch.testing.assert_close(norm, expected)
        torch.testing.assert_close(flat, networks.flat_gradients(module))
        assert float(torch.linalg.vector_norm(flat)) <= 1.0 + 1e-5


@pytest.mark.parametrize("fused", [True, False])
def test_flat_adam_steps_as_torch_optim_adam(fused: bool) -> None:
    module = networks.seeded_mlp(0, 4, 2, (8, 8))
    reference = networks.seeded_mlp(0, 4, 2, (8, 8))
    flat = FlatMLP(module)
    adam = FlatAdam(flat, lr=0.01)
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01, fused=fused)
    for step in range(25):
        grad = torch.randn(flat.vector.shape, generator=networks.generator(step))
        lr = 0.01 / (1 + step)
        adam.step(grad.clone(), lr)
        networks.set_flat_gradients(reference, grad)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    if fused:  # the same kernel, bit for bit
        assert torch.equal(flat.vector, networks.flat_parameters(reference))
    torch.testing.assert_close(flat.vector, networks.flat_parameters(reference), rtol=1e-6, atol=1e-7)
    # Run-file arrays: torch.optim's names (as popplay's Adam writes them, which
    # tests/test_adam.py holds to torch's), loadable both ways.
    ours = adam.arrays("adam")
    theirs = {f"adam.{index}.{key}": torch.as_tensor(value).numpy()
              for index, state in optimizer.state_dict()["state"].items() for key, value in state.items()}
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-6, atol=1e-9)
    restored = FlatAdam(FlatMLP(networks.seeded_mlp(0, 4, 2, (8, 8))), lr=0.01)
    restored.load(theirs, "adam")
    assert float(restored.steps) == 25
    torch.testing.assert_close(restored.exp_avg_sq, adam.exp_avg_sq, rtol=1e-6, atol=1e-12)


def test_flat_adam_refuses_damaged_arrays() -> None:
    adam = FlatAdam(FlatMLP(networks.seeded_mlp(0, 4, 2, (8,))), lr=0.01)
    assert adam.arrays("adam") == {}  # torch.optim keeps no state before the first step
    adam.step(torch.ones_like(adam.network.vector))
    arrays = adam.arrays("adam")
    fresh = FlatAdam(FlatMLP(networks.seeded_mlp(0, 4, 2, (8,))), lr=0.01)
    with pytest.raises(ValueError, match="shape"):
        fresh.load({**arrays, "adam.0.exp_avg": np.zeros((3, 3), np.float32)}, "adam")
    with pytest.raises(ValueError, match="missing"):
        fresh.load({k: v for k, v in arrays.items() if k != "adam.1.exp_avg_sq"}, "adam")
    with pytest.raises(ValueError, match="step"):
        fresh.load({**arrays, "adam.2.step": np.array(7.0, np.float32)}, "adam")
    with pytest.raises(ValueError, match="adam.9.exp_avg: not a parameter"):
        fresh.load({**arrays, "adam.9.exp_avg": np.zeros(3, np.float32)}, "adam")


def test_double_dqn_update_follows_the_autograd_reference() -> None:
    config = dqn.DQNConfig(hidden=(32, 32), batch_size=16, learning_starts=0, target_every=7, lr=3e-3,
                           lr_end=1e-4, lr_updates=30, max_grad_norm=0.5, gamma=0.9)
    agent = dqn.DoubleDQN(config, obs_dim=3, actions=3, seed=4)
    g = networks.generator(9)
    n = 200
    agent.receive(Batch(torch.randn(n, 3, generator=g), torch.randint(3, (n,), generator=g),
                        3 * torch.randn(n, generator=g), torch.randn(n, 3, generator=g),
                        (torch.rand(n, generator=g) < 0.2).float()))
    reference = AutogradDoubleDQN(agent)
    losses = []
    for _ in range(40):
        agent.update()
        # the loss of the same minibatch before its step: what last_loss reports
        losses.append((agent.last_loss, reference.update()))
        torch.testing.assert_close(agent._online.vector, networks.flat_parameters(reference.online),
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(agent._target.vector, networks.flat_parameters(reference.target),
                                   rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(*zip(*losses), rtol=1e-4)
    assert agent.updates == 40 and not torch.equal(agent._target.vector, networks.flat_parameters(
        networks.seeded_mlp(4, 3, 3, config.hidden)))  # the target was refreshed
    assert np.isclose(agent.adam.lr, dqn.learning_rate(39, config))

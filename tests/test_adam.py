"""popplay's Adam against torch.optim.Adam: the same parameters and moments bit for bit,
the same run-file arrays, and a damaged state refused in one line."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from popplay.deep.agents import networks
from popplay.deep.agents.adam import Adam


def _steps(fused: bool, steps: int = 30) -> tuple[torch.nn.Module, Adam, torch.nn.Module, torch.optim.Adam]:
    """Both optimisers over the same network and gradients, the learning rate changed
    between steps (as PPO's schedule does) and the first layer's weight left without a
    gradient on some steps, the first included (torch skips such a parameter: no move,
    no step counted, its state made at its first gradient)."""
    ours_net = networks.seeded_mlp(0, 5, 3, (16, 8))
    theirs_net = networks.seeded_mlp(0, 5, 3, (16, 8))
    ours = Adam(ours_net.parameters(), lr=3e-3, eps=1e-5, fused=fused)
    theirs = torch.optim.Adam(theirs_net.parameters(), lr=3e-3, eps=1e-5, fused=fused)
    x = torch.randn(64, 5, generator=networks.generator(1))
    for step in range(steps):
        lr = 3e-3 / (1 + step)
        for net, opt in ((ours_net, ours), (theirs_net, theirs)):
            opt.param_groups[0]["lr"] = lr
            opt.zero_grad(set_to_none=True)
            (net(x * (1 + step)) ** 2).mean().backward()
            if step % 3 == 0:
                net[0].weight.grad = None
            opt.step()
    return ours_net, ours, theirs_net, theirs


@pytest.mark.parametrize("fused", [False, True])
def test_adam_steps_bit_for_bit_as_torch_optim_adam(fused: bool) -> None:
    ours_net, ours, theirs_net, theirs = _steps(fused)
    for mine, torchs in zip(ours_net.parameters(), theirs_net.parameters()):
        assert torch.equal(mine, torchs)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(ours.state[mine][key], theirs.state[torchs][key]), key
    assert float(ours.state[ours_net[0].weight]["step"]) == 20  # 10 of the 30 steps had no gradient for it


@pytest.mark.parametrize("fused", [False, True])
def test_adam_arrays_are_torch_optims_and_resume_exactly(fused: bool) -> None:
    ours_net, ours, theirs_net, theirs = _steps(fused, steps=5)
    arrays = ours.arrays("adam")
    expected = {f"adam.{index}.{key}": torch.as_tensor(value).numpy()
                for index, state in theirs.state_dict()["state"].items() for key, value in state.items()}
    assert list(arrays) == list(expected)  # the same names in the same order (the first layer's last)
    assert list(arrays)[-1] == "adam.0.exp_avg_sq"
    for name, value in expected.items():
        assert arrays[name].dtype == value.dtype and np.array_equal(arrays[name], value), name
    # a fresh optimiser loaded from the arrays continues exactly as the one that wrote them
    resumed_net = networks.seeded_mlp(0, 5, 3, (16, 8))
    resumed_net.load_state_dict(ours_net.state_dict())
    resumed = Adam(resumed_net.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    resumed.load(arrays, "adam")
    x = torch.randn(8, 5, generator=networks.generator(2))
    for net, opt in ((ours_net, ours), (resumed_net, resumed)):
        opt.zero_grad()
        net(x).sum().backward()
        opt.param_groups[0]["lr"] = 1e-3
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ours_net.parameters(), resumed_net.parameters()))


def test_adam_without_steps_has_no_arrays_and_loads_none() -> None:
    net = networks.seeded_mlp(0, 3, 2, (4,))
    adam = Adam(net.parameters(), lr=0.1)
    assert adam.arrays("adam") == {}
    adam.load({}, "adam")
    assert adam.state == {}


@pytest.mark.parametrize("damage, message", [
    (lambda a: {**a, "adam.0.exp_avg": np.zeros((3, 3), np.float32)}, "adam.0.exp_avg: shape"),
    (lambda a: {k: v for k, v in a.items() if k != "adam.1.exp_avg_sq"}, "adam.1.exp_avg_sq: missing"),
    (lambda a: {**a, "adam.9.step": np.float32(1)}, "adam.9.step: not a state entry"),
    (lambda a: {**a, "adam.0.step": np.array("x")}, "adam.0.step: dtype"),
])
def test_adam_refuses_a_damaged_state_in_one_line(damage, message: str) -> None:
    net = networks.seeded_mlp(0, 3, 2, (4,))
    adam = Adam(net.parameters(), lr=0.1)
    net(torch.ones(1, 3)).sum().backward()
    adam.step()
    fresh = Adam(networks.seeded_mlp(0, 3, 2, (4,)).parameters(), lr=0.1)
    with pytest.raises(ValueError, match=message) as raised:
        fresh.load(damage(adam.arrays("adam")), "adam")
    assert "\n" not in str(raised.value)


def test_adam_keeps_torchs_compiler_out_of_the_process() -> None:
    """The reason this class exists: building and stepping it must not import
    torch._dynamo (1.0-1.6 s of CPU per process with torch.optim)."""
    code = ("import sys, torch\n"
            "from popplay.deep.agents import networks\n"
            "from popplay.deep.agents.adam import Adam\n"
            "net = networks.seeded_mlp(0, 3, 2, (4,))\n"
            "for fused in (False, True):\n"
            "    adam = Adam(net.parameters(), lr=0.1, fused=fused)\n"
            "    net(torch.ones(1, 3)).sum().backward()\n"
            "    adam.step(); adam.zero_grad(); adam.load(adam.arrays('a'), 'a')\n"
            "print('torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"

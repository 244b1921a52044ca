"""Adam for the agents that learn through autograd (A2C, PPO, REINFORCE, TD3, DDPG).

It does what ``torch.optim.Adam`` does with torch's defaults (β = (0.9, 0.999), no
weight decay, no amsgrad), operation for operation, so parameters and moments come out
bit for bit the same as torch's (``tests/test_adam.py`` holds it to them):
``fused=False`` is torch's one-tensor-at-a-time rule (what ``torch.optim.Adam`` runs on
a CPU by default), ``fused=True`` its fused kernel.

Why not ``torch.optim``: every ``Optimizer`` method, the constructor included, imports
``torch._dynamo`` on first use (torch wraps them to keep its compiler out). That cost
every process that built one about 1.0-1.6 s of CPU (measured: ``import torch`` 1.7-2.3 s,
the same plus constructing an Adam 3.4-3.8 s; short ``train a2c`` and ``train ppo`` runs
1.0-1.3 s less with this class), paid by each CLI run and by every rank of a
multi-process job, actor ranks that never step included.

Run-file arrays keep ``torch.optim``'s names: ``<prefix>.<i>.step|exp_avg|exp_avg_sq``,
``i`` the parameter's place in the optimiser, none before the first step.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import torch

#: What Adam keeps per parameter once it has stepped, in torch's order.
STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")


class Adam:
    """Adam over ``params`` (one group, as every agent here has), learning rate in
    ``param_groups[0]["lr"]`` (schedules set it there, as with ``torch.optim``)."""

    betas = (0.9, 0.999)

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, *, eps: float = 1e-8,
                 fused: bool = False) -> None:
        self.param_groups: list[dict[str, Any]] = [{"params": list(params), "lr": float(lr), "eps": float(eps)}]
        self.fused = bool(fused)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}  # insertion order: torch's
        self._pre_hooks: list[Callable[[Adam, tuple, dict], Any]] = []

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return self.param_groups[0]["params"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    def register_step_pre_hook(self, hook: Callable[[Adam, tuple, dict], Any]) -> None:
        """``hook(optimizer, (), {})`` runs before every step (``torch.optim``'s signature)."""
        self._pre_hooks.append(hook)

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(p)
        if state is None:
            # torch keeps the step on the CPU for its one-tensor rule, by the parameter for the fused kernel
            step = (torch.zeros((), dtype=torch.float32, device=p.device) if self.fused
                    else torch.tensor(0.0, dtype=torch.float32))
            state = self.state[p] = {"step": step, "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return state

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of every parameter that has a gradient (the others, as in torch,
        neither move nor count the step)."""
        for hook in self._pre_hooks:
            hook(self, (), {})
        group = self.param_groups[0]
        lr, eps = group["lr"], group["eps"]
        beta1, beta2 = self.betas
        live = [p for p in self.params if p.grad is not None]
        if self.fused:
            by_kind: dict[tuple, list[torch.Tensor]] = {}
            for p in live:
                by_kind.setdefault((p.device, p.dtype), []).append(p)
            for params in by_kind.values():
                states = [self._state(p) for p in params]
                steps = [s["step"] for s in states]
                torch._foreach_add_(steps, 1)
                torch._fused_adam_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                                   [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=lr,
                                   beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps, maximize=False)
            return
        for p in live:
            state = self._state(p)
            grad, exp_avg, exp_avg_sq, step_t = p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"]
            step_t += 1
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = step_t.item()
            step_size = lr / (1 - beta1**step)
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)

    # --- run-file arrays ------------------------------------------------------------------
    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The per-parameter state as arrays, by ``torch.optim``'s names."""
        place = {p: i for i, p in enumerate(self.params)}
        return {f"{prefix}.{place[p]}.{key}": value.detach().cpu().numpy().copy()
                for p, state in self.state.items() for key, value in state.items()}

    def load(self, arrays: dict[str, np.ndarray], prefix: str) -> None:
        """Restore :meth:`arrays` (ValueError, one line, naming the entry: see
        :func:`state_entries`)."""
        params = self.params
        found = state_entries(arrays, prefix, [tuple(p.shape) for p in params])
        self.state = {}
        for index in sorted(found):
            p, entry = params[index], found[index]
            state = self._state(p)
            state["step"].fill_(float(entry["step"].reshape(())))
            for key in ("exp_avg", "exp_avg_sq"):
                state[key].copy_(torch.as_tensor(entry[key]).to(dtype=p.dtype))


def state_entries(arrays: dict[str, Any], prefix: str, shapes: list[tuple[int, ...]],
                  stranger: str = "not a state entry of this optimiser") -> dict[int, dict[str, np.ndarray]]:
    """Adam's run-file arrays under ``prefix`` (``torch.optim``'s names) for parameters
    shaped ``shapes``, by parameter index: either none (an optimiser that never stepped)
    or every parameter's whole state, each moment shaped like its parameter (ValueError,
    one line, naming the entry; torch itself would take a partial or misshapen state and
    fail at the next step). An entry of another name is refused as ``stranger``."""
    found: dict[int, dict[str, np.ndarray]] = {}
    for name, value in arrays.items():
        if not name.startswith(prefix + "."):
            continue
        index, _, key = name[len(prefix) + 1:].partition(".")
        if not index.isdigit() or int(index) >= len(shapes) or key not in STATE_KEYS:
            raise ValueError(f"{name}: {stranger}")
        value = np.asarray(value)
        if value.dtype.kind not in "fiu":
            raise ValueError(f"{name}: dtype {value.dtype}, expected numbers")
        shape = () if key == "step" else tuple(shapes[int(index)])
        if value.shape != shape and not (key == "step" and value.size == 1):
            raise ValueError(f"{name}: shape {value.shape}, expected {shape}")
        found.setdefault(int(index), {})[key] = value
    if found and (len(found) != len(shapes) or any(len(entry) != len(STATE_KEYS) for entry in found.values())):
        missing = [f"{prefix}.{i}.{key}" for i in range(len(shapes)) for key in STATE_KEYS
                   if key not in found.get(i, {})]
        raise ValueError(f"{missing[0]}: missing (the optimiser's state is incomplete)")
    return found

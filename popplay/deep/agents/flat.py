"""A ReLU MLP and its Adam state held in flat vectors, with the backward pass written out.

Why: for the small networks of the deep agents, autograd, ``nn.Module`` calls,
``clip_grad_norm_`` and ``Optimizer.step`` cost more than the arithmetic. A Double DQN
update on CartPole's 256-256 network (batch 64, one core) does about 0.45 ms of
matrix products inside 1.3 ms of bookkeeping. Here the parameters, their gradient
and Adam's moments are each one contiguous vector:
- gradient clipping is one norm;
- Adam is one fused kernel call over the whole vector;
- the backward pass is a handful of matrix products that write straight into the
  gradient vector.

The ``nn.Sequential`` stays the network everyone else sees. Its parameters become views
into the flat vector, so acting, evaluation, ``state_dict`` and run files are unchanged.
The rules are the autograd ones; ``tests/test_flat.py`` checks gradients and Adam steps
against ``torch.autograd`` and ``torch.optim.Adam``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from popplay.deep.agents.adam import state_entries

_threshold_backward = torch.ops.aten.threshold_backward


class FlatMLP:
    """A network made by :func:`popplay.deep.agents.networks.mlp` with ReLU activations.

    Its parameters move into one vector, ``vector``. The module's own parameters become
    views of that vector: they are still the tensors that acting and ``state_dict``
    use, and an in-place load (``load_state_dict``, ``copy_``) reaches the vector.
    Two things cut that link without an error, so neither is done to a flattened
    module: moving it (``.to()``, ``.cuda()``, ``.half()`` make new tensors; move it
    before flattening), and autograd through it across an update (the views share
    storage with the vector, not autograd's version counter).
    """

    def __init__(self, module: nn.Sequential) -> None:
        layers = list(module)
        linears = layers[0::2]
        if (len(layers) % 2 == 0 or not all(isinstance(m, nn.Linear) and m.bias is not None for m in linears)
                or not all(isinstance(m, nn.ReLU) for m in layers[1::2])):
            raise ValueError("FlatMLP takes Linear (with bias) and ReLU layers in turn, ending with a Linear")
        params = [p for m in linears for p in (m.weight, m.bias)]
        first = params[0]
        self.module = module
        self.vector = torch.empty(sum(p.numel() for p in params), dtype=first.dtype, device=first.device)
        self.shapes: list[tuple[int, ...]] = []
        self._offsets: list[tuple[int, int]] = []
        views = []
        offset = 0
        for p in params:
            n = p.numel()
            view = self.vector[offset:offset + n].view_as(p)
            view.copy_(p.detach())
            p.data = view
            views.append(view)
            self.shapes.append(tuple(p.shape))
            self._offsets.append((offset, offset + n))
            offset += n
        self.weights = views[0::2]
        self.biases = views[1::2]
        self.grad = torch.zeros_like(self.vector)
        grads = self.split(self.grad)
        self._weight_grads = grads[0::2]
        self._bias_grads = grads[1::2]

    def forward(self, x: torch.Tensor, hidden: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The network's output for ``x``, without autograd (the same kernels as the
        module: ``F.linear`` then ReLU). Every hidden activation is appended to
        ``hidden`` when given, for :meth:`backward`."""
        h = x
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = F.linear(h, w, b)
            if i < last:
                h = h.relu_()
                if hidden is not None:
                    hidden.append(h)
        return h

    def backward(self, x: torch.Tensor, hidden: list[torch.Tensor], grad_output: torch.Tensor) -> torch.Tensor:
        """d(loss)/d(parameters) into ``grad`` (laid out as ``vector``; returned), given
        d(loss)/d(output) of the pass that took ``x`` and left ``hidden``. Rows of ``x``,
        ``hidden`` and ``grad_output`` correspond."""
        inputs = [x, *hidden]
        g = grad_output
        for i in range(len(self.weights) - 1, -1, -1):
            out_features, in_features = self.shapes[2 * i]
            if in_features < out_features // 8:
                # MKL (CPU) is slow to write a tall, narrow product (256 x 4: ~3x the
                # time of its transpose plus a copy)
                self._weight_grads[i].copy_(torch.mm(inputs[i].t(), g).t())
            else:
                torch.mm(g.t(), inputs[i], out=self._weight_grads[i])
            torch.sum(g, 0, out=self._bias_grads[i])
            if i:
                g = _threshold_backward(torch.mm(g, self.weights[i]), inputs[i], 0.0)
        return self.grad

    def split(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """``vector`` (laid out as ``vector``) cut into per-parameter views."""
        return [vector[start:end].view(shape) for (start, end), shape in zip(self._offsets, self.shapes)]


def clip_norm_(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale ``grad`` in place to norm at most ``max_norm`` (``clip_grad_norm_``'s
    rule, 1e-6 guard included); returns the norm before clipping."""
    norm = torch.linalg.vector_norm(grad)
    grad.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))
    return norm


class FlatAdam:
    """Adam (torch's defaults: β = (0.9, 0.999), ε = 1e-8, no weight decay) over one
    flat parameter vector: the fused kernel ``torch.optim.Adam(fused=True)`` runs,
    called once for the whole vector.

    Run-file arrays use ``torch.optim.Adam``'s per-parameter names
    (``<prefix>.<i>.step|exp_avg|exp_avg_sq``, none before the first step), so files
    written before this class existed load, and its files load into ``torch.optim``.
    """

    betas = (0.9, 0.999)
    eps = 1e-8

    def __init__(self, network: FlatMLP, lr: float) -> None:
        self.network = network
        self.lr = lr
        self.exp_avg = torch.zeros_like(network.vector)
        self.exp_avg_sq = torch.zeros_like(network.vector)
        # float32, as torch.optim keeps it for its fused kernel
        self.steps = torch.zeros((), dtype=torch.float32, device=network.vector.device)

    def step(self, grad: torch.Tensor, lr: float | None = None) -> None:
        """One Adam step of the network's vector along ``grad``."""
        if lr is not None:
            self.lr = lr
        self.steps.add_(1)
        torch._fused_adam_([self.network.vector], [grad], [self.exp_avg], [self.exp_avg_sq], [], [self.steps],
                           lr=self.lr, beta1=self.betas[0], beta2=self.betas[1], weight_decay=0.0, eps=self.eps,
                           amsgrad=False, maximize=False)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        if float(self.steps) == 0:
            return {}
        out: dict[str, np.ndarray] = {}
        step = self.steps.detach().cpu().numpy().copy()
        for i, (m, v) in enumerate(zip(self.network.split(self.exp_avg), self.network.split(self.exp_avg_sq))):
            out[f"{prefix}.{i}.step"] = step.copy()
            out[f"{prefix}.{i}.exp_avg"] = m.detach().cpu().numpy().copy()
            out[f"{prefix}.{i}.exp_avg_sq"] = v.detach().cpu().numpy().copy()
        return out

    def load(self, arrays: dict[str, Any], prefix: str) -> None:
        """Restore from :meth:`arrays` (no arrays under ``prefix``: a fresh optimiser)."""
        self.exp_avg.zero_()
        self.exp_avg_sq.zero_()
        self.steps.zero_()
        found = state_entries(arrays, prefix, self.network.shapes, "not a parameter of this network")
        if not found:
            return
        for entry, m, v in zip((found[i] for i in range(len(found))), self.network.split(self.exp_avg),
                               self.network.split(self.exp_avg_sq)):
            m.copy_(torch.as_tensor(entry["exp_avg"]))
            v.copy_(torch.as_tensor(entry["exp_avg_sq"]))
        steps = {float(entry["step"].reshape(())) for entry in found.values()}
        if len(steps) != 1 or not all(s >= 1 and s == int(s) for s in steps):
            raise ValueError(f"{prefix}.*.step: one positive whole step count expected (got {sorted(steps)})")
        self.steps.fill_(steps.pop())

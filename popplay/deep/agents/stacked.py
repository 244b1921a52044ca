"""P ReLU MLPs of one shape and their Adam states, stacked along a leading member axis.

The population form of :mod:`popplay.deep.agents.flat`: member ``k``'s parameters are
row ``k`` of one (P, n) matrix laid out as :class:`FlatMLP`'s vector (weight, bias,
layer after layer), and every pass is one batched matrix product per layer over all
members (``baddbmm``/``bmm``), never a Python loop over them. Gradient clipping and
Adam act row by row with per-member step sizes and norms.

Exactness: every operation here either acts element by element or reduces within one
member's row, and the batched products compute each member's product alike in a stack of
any size, given two things: MKL's strict reproducibility mode (``MKL_CBWR``, set by
``import popplay``), without which MKL's code, and its rounding, follows the memory
alignment of a member's rows; and :func:`batched`, which never hands torch a batch of
one. So member ``k`` of a P-member stack follows the same bits as a stack holding member
``k`` alone (``tests/test_deep_population.py`` checks it).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from popplay import rng

TAG_MEMBER = 10
_INIT = 2

_threshold_backward = torch.ops.aten.threshold_backward
# A layer this narrow is computed transposed where MKL is faster so: a layer of this many
# inputs gets its weight gradient as the (in, out) product, transposed (for 64 members, batch
# 64 and 64 units 3-4x faster than the (out, in) one at 4 or 8 inputs, slower from 16 on; CPU,
# one thread), and one of this many outputs its forward pass (see forward_layers).
_NARROW = 8


def member_seed(seed: int, member: int) -> int:
    """The seed of member ``member``'s initial networks (a non-negative 63-bit int):
    a function of (run seed, member index) alone."""
    return rng.key_path(seed, TAG_MEMBER, _INIT, member) & ((1 << 63) - 1)


def layer_shapes(in_dim: int, out_dim: int, hidden: Sequence[int]) -> list[tuple[int, ...]]:
    """The parameter shapes of :func:`popplay.deep.agents.networks.mlp`, in order."""
    widths = [in_dim, *hidden, out_dim]
    shapes: list[tuple[int, ...]] = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        shapes += [(fan_out, fan_in), (fan_out,)]
    return shapes


def parameter_count(in_dim: int, out_dim: int, hidden: Sequence[int]) -> int:
    return sum(math.prod(shape) for shape in layer_shapes(in_dim, out_dim, hidden))


def batched(product: Any, *operands: torch.Tensor) -> torch.Tensor:
    """``product`` (``torch.bmm``, ``torch.baddbmm``) of operands with a leading member
    axis, never over a batch of one: torch computes a lone matrix product with other
    kernels (a matrix-vector one where the result has one column), whose sums round
    differently from the batched kernel's, and a member must get the same bits alone
    (one process's or one rank's only member) as in a population. A batch of one is
    computed as two copies of it; autograd gives the copy nothing back."""
    if operands[0].shape[0] != 1:
        return product(*operands)
    return product(*(x.expand(2, *x.shape[1:]) for x in operands))[:1]


def forward_layers(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor], x: torch.Tensor,
                   activation: Any, hidden: list[torch.Tensor] | None = None,
                   operands: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
    """A stack of MLPs' outputs (P, B, out) for inputs (P, B, in): one batched product
    per layer, ``activation`` between layers (``torch.relu_`` in place where no autograd
    runs through it, ``torch.tanh`` where one does); hidden activations appended to
    ``hidden`` when given. ``operands``: each layer's ``(bias.unsqueeze(1),
    weight.transpose(1, 2))`` made beforehand (views of the same tensors)."""
    h = x
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases)):
        if w.shape[1] <= _NARROW < h.shape[1] and not (
                torch.is_grad_enabled() and (w.requires_grad or b.requires_grad or h.requires_grad)):
            # A few outputs (Q values; values taken without a gradient) of many rows: MKL
            # computes W·hᵀ (a few long rows) 1.5-3x faster than h·Wᵀ (many rows a few
            # wide), e.g. 61 against 119 µs at 64 members x 64 rows x 64 inputs x 2 outputs
            # (CPU). At one output it rounds differently from h·Wᵀ; the shape alone
            # decides, so a member still computes alike in a stack of any size. Never
            # under autograd, whose backward of this form sums the bias gradient along the
            # rows with a split that depends on the number of members. Made contiguous
            # again (a small copy): an argmax along the transposed view took 10x as long.
            h = batched(torch.baddbmm, b.unsqueeze(2), w, h.transpose(1, 2)).transpose(1, 2).contiguous()
        else:
            bias_rows, transposed = operands[i] if operands is not None else (b.unsqueeze(1), w.transpose(1, 2))
            h = batched(torch.baddbmm, bias_rows, h, transposed)
        if i < last:
            h = activation(h)
            if hidden is not None:
                hidden.append(h)
    return h


class StackedMLP:
    """P networks made by :func:`popplay.deep.agents.networks.mlp` (ReLU), as rows of
    ``matrix`` (P, n). ``weights[i]`` (P, out, in) and ``biases[i]`` (P, out) are views
    into it, so an in-place write to a row of ``matrix`` (a copy from another member,
    an average) is what the next pass uses."""

    def __init__(self, matrix: torch.Tensor, shapes: Sequence[tuple[int, ...]]) -> None:
        if matrix.dim() != 2 or matrix.shape[1] != sum(math.prod(s) for s in shapes):
            raise ValueError(f"matrix must be (members, {sum(math.prod(s) for s in shapes)}) "
                             f"(got {tuple(matrix.shape)})")
        self.matrix = matrix
        self.shapes = [tuple(s) for s in shapes]
        self.grad = torch.zeros_like(matrix)
        params = self.split(matrix)
        grads = self.split(self.grad)
        self.weights, self.biases = params[0::2], params[1::2]
        self._weight_grads, self._bias_grads = grads[0::2], grads[1::2]
        # made once: a network acting on one observation per member spent a quarter of
        # its pass making these views again (64 members, 64-64 units)
        self._operands = [(b.unsqueeze(1), w.transpose(1, 2)) for w, b in zip(self.weights, self.biases)]

    @classmethod
    def from_modules(cls, modules: Sequence[nn.Sequential], device: str | torch.device = "cpu") -> "StackedMLP":
        """The stack of ``modules`` (same shapes; Linear and ReLU in turn), copied onto ``device``."""
        rows = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in modules]
        shapes = [tuple(p.shape) for p in modules[0].parameters()]
        return cls(torch.stack(rows).to(device), shapes)

    @property
    def members(self) -> int:
        return int(self.matrix.shape[0])

    def split(self, matrix: torch.Tensor) -> list[torch.Tensor]:
        """``matrix`` (laid out as :attr:`matrix`) cut into per-parameter views (P, *shape)."""
        out, offset = [], 0
        for shape in self.shapes:
            n = math.prod(shape)
            out.append(matrix[:, offset:offset + n].view(matrix.shape[0], *shape))
            offset += n
        return out

    def forward(self, x: torch.Tensor, hidden: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Outputs (P, B, out) for inputs ``x`` (P, B, in), member by member; the hidden
        activations are appended to ``hidden`` when given, for :meth:`backward`."""
        return forward_layers(self.weights, self.biases, x, torch.relu_, hidden, self._operands)

    def backward(self, x: torch.Tensor, hidden: list[torch.Tensor], grad_output: torch.Tensor) -> torch.Tensor:
        """d(loss)/d(parameters) into :attr:`grad` (P, n; returned), given d(loss)/d(output)
        (P, B, out) of the pass that took ``x`` and left ``hidden``."""
        inputs = [x, *hidden]
        g = grad_output
        for i in range(len(self.weights) - 1, -1, -1):
            if self.weights[i].shape[2] <= _NARROW:  # an observation of a few features
                self._weight_grads[i].copy_(batched(torch.bmm, inputs[i].transpose(1, 2), g).transpose(1, 2))
            else:
                self._weight_grads[i].copy_(batched(torch.bmm, g.transpose(1, 2), inputs[i]))
            self._bias_grads[i].copy_(g.sum(1))
            if i:
                g = _threshold_backward(batched(torch.bmm, g, self.weights[i]), inputs[i], 0.0)
        return self.grad


def clip_rows_(grad: torch.Tensor, max_norm: torch.Tensor) -> torch.Tensor:
    """Scale each row of ``grad`` (P, n) in place to norm at most ``max_norm`` (P,)
    (``clip_grad_norm_``'s rule, 1e-6 guard included); returns the norms before."""
    norm = torch.linalg.vector_norm(grad, dim=1)
    grad.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0).unsqueeze(1))
    return norm


#: Adam moments of at most this magnitude are set to 0 after each step (see StackedAdam).
MOMENT_FLOOR = 2.0 ** -100


class StackedAdam:
    """Adam (β = (0.9, 0.999), ε = 1e-8 unless given, no weight decay: torch's defaults) over the rows
    of a :class:`StackedMLP`, each member with its own step size and step count.

    One departure from torch's Adam: after each step, moments of magnitude at most
    :data:`MOMENT_FLOOR` (2^-100, about 7.9e-31) become 0. A parameter whose gradient stays
    0 (a dead ReLU unit, common in DQN) has its first moment decay by 0.9 a step, into
    float32's subnormal range after about 800 steps, where every operation on it takes the
    CPU's slow microcode path: after 7,250 updates of a 16-member DQN population on
    CartPole, 24 % of the first moments were subnormal and an update took 2.37 ms against
    1.75 ms with them at 0 (medians of five rounds; this project's 2-core CPU). A first
    moment that small moves its parameter by under 1e-21 times the learning rate
    (ε = 1e-8); a second moment that small changes the denominator √v̂ + ε by under 3e-6
    of ε. So a run changes only by roundings, but its bits are not torch.optim's. NaN
    stays NaN; the floor is the same on every member's row, so a member still computes
    alike in a stack of any size.

    torch's fused Adam kernel takes one step size, so it runs with step size 1 into a
    zeroed scratch matrix, which then moves each row by its member's step size: one
    fused pass and one multiply-add instead of the dozen passes of Adam written out
    element by element (about 5x faster at 64 members of a 128-128 network). The kernel
    rounds the tail of a tensor (its length modulo the vector width) differently from
    its vectorised body, so each member's row is stepped as a tensor of its own would
    be: a row is then computed alike in a stack of any size. On the CPU, when every
    member has made as many steps, that takes one call over the whole matrix plus a
    call for the few numbers it rounds otherwise (see :class:`_WholeStep`); elsewhere,
    or for some rows only, a call with each row as a tensor. ``grad`` must always be
    the same matrix (the network's :attr:`StackedMLP.grad`), whose row views are made
    once."""

    betas = (0.9, 0.999)
    eps = 1e-8

    def __init__(self, network: StackedMLP, eps: float = 1e-8) -> None:
        self.network = network
        self.eps = float(eps)
        # both moments in one tensor, so that the floor is one pass over both
        self._moments = network.matrix.new_zeros((2, *network.matrix.shape))
        self.exp_avg, self.exp_avg_sq = self._moments.unbind(0)
        # float32, as torch.optim keeps the count for its fused kernel; one per member
        self.steps = torch.zeros(network.members, dtype=torch.float32, device=network.matrix.device)
        self._scratch = torch.zeros_like(network.matrix)
        self._rows = [list(t.unbind(0)) for t in (self._scratch, network.grad, self.exp_avg, self.exp_avg_sq)]
        self._counts = list(self.steps.view(-1, 1).unbind(0))
        self._on_cpu = network.matrix.device.type == "cpu"
        members, width = network.matrix.shape
        self._whole = _WholeStep(self._scratch, network.grad, self._moments, self._counts[0]) \
            if self._on_cpu and width >= _UNIT and members * width >= WHOLE_STEP_FROM else None

    def step(self, grad: torch.Tensor, lr: torch.Tensor, rows: list[int] | None = None) -> None:
        """One Adam step of every row along the same row of ``grad``; ``lr`` (P,).
        ``rows``: only these members step (the others' rows, moments and counts stay)."""
        if grad.data_ptr() != self.network.grad.data_ptr():
            raise ValueError("StackedAdam.step takes the network's own gradient matrix")
        lists = self._rows + [self._counts]
        if rows is None:
            self.steps.add_(1)  # the kernel reads the count after this step, as torch.optim gives it
            self._scratch.zero_()
            moments = [self._moments]  # floored whole: one pass, not 2P
        else:
            lists = [[rows_of[i] for i in rows] for rows_of in lists]
            for count, row in zip(lists[4], lists[0]):
                count.add_(1)
                row.zero_()
            moments = lists[2] + lists[3]
        scratch, grads, exp_avgs, exp_avg_sqs, counts = lists
        if rows is None and self._whole is not None and self._lockstep():
            self._whole(self._fused)
        else:
            self._fused(scratch, grads, exp_avgs, exp_avg_sqs, counts)
        for table in moments:
            torch.hardshrink(table, MOMENT_FLOOR, out=table)
        if rows is None:
            self.network.matrix.addcmul_(self._scratch, lr.to(grad.dtype).unsqueeze(1))
            return
        for i, row in zip(rows, scratch):  # each member's row as the whole matrix's would be, one at a time
            self.network.matrix[i].addcmul_(row, lr[i].to(grad.dtype))

    def _fused(self, scratch: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
               exp_avg_sqs: list[torch.Tensor], counts: list[torch.Tensor]) -> None:
        """torch's fused Adam kernel, step size 1, over the tensors of the lists."""
        torch._fused_adam_(scratch, grads, exp_avgs, exp_avg_sqs, [], counts, lr=1.0, beta1=self.betas[0],
                           beta2=self.betas[1], weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False)

    def _lockstep(self) -> bool:
        """Whether every member has made as many steps (the host's copy: CPU only)."""
        steps = self.steps.numpy()
        return bool(steps.min() == steps.max())


#: The fused Adam kernel's task unit in float32 numbers (a 64-byte cache line): it hands
#: its threads whole units, and every vector width torch has on a CPU divides it.
_UNIT = 16
#: Stacks of at least this many parameters take :class:`_WholeStep` on the CPU. Below,
#: its fixed cost (the pieces stepped again) outweighs a call per row: 2-core CPU, a
#: step of 64-64 networks (4,610 parameters) took 157 against 158 us at 16 members, 193
#: against 222 at 24 and 346 against 529 at 64; of 128-128 networks (17,410), 199
#: against 179 at 8 members and 945 against 1,104 at 64.
WHOLE_STEP_FROM = 1 << 17


class _WholeStep:
    """The fused Adam step of every row of a (P, n) stack in one call over the whole
    matrix, with each row's numbers rounded as a call on that row alone rounds them.

    The kernel gives its threads whole 16-number units and, within each thread's part,
    runs the vector code on a multiple of the vector width V and scalar code on the
    rest; V divides 16. A row alone thus runs its last n mod V numbers (its *tail*) in
    scalar code and the rest in vector code. Over the first L numbers of the whole
    matrix (L the largest multiple of 16 within it) every number runs in vector code,
    which is right for all but the tails. So the last n mod 16 numbers of every row
    (their *edges*, which hold the tails) and the last row's numbers from a 16-aligned
    point before L up to its edge are put back as they were and stepped again in one
    call that has each as a tensor of its own: an edge alone rounds as the row's end
    does (its own tail is n mod 16 mod V = n mod V numbers), and the last row's body
    piece, a multiple of 16 long, runs in vector code. The tests compare this with a
    call per row bit for bit over many shapes."""

    def __init__(self, scratch: torch.Tensor, grad: torch.Tensor, moments: torch.Tensor, count: torch.Tensor) -> None:
        p, n = scratch.shape
        edge = n % _UNIT
        body_end = n - edge  # a multiple of 16
        self._length = p * n // _UNIT * _UNIT
        last = (p - 1) * n
        missed = min(body_end, self._length - last)  # where the whole call stops in the last row, up to its edge
        start = body_end - -(-(body_end - missed) // _UNIT) * _UNIT  # ... moved back onto a 16-aligned piece
        tables = (scratch, grad, *moments.unbind(0))
        self._flat = [t.view(-1) for t in tables]
        self._whole = [[t[:self._length]] for t in self._flat]
        self._again = [[t[k, body_end:] for k in range(p) if edge] + ([t[p - 1, start:body_end]] if start < body_end
                                                                        else []) for t in tables]
        again = [k * n + j for k in range(p) for j in range(body_end, n)] + [last + j for j in range(start, body_end)]
        index = torch.tensor(again, dtype=torch.int64, device=scratch.device)
        self._index = index
        self._moment_index = torch.cat([index, index + p * n])  # both moments, flat (2, P, n)
        self._moments_flat = moments.view(-1)
        self._count = count
        self._counts = [count] * len(self._again[0])

    def __call__(self, fused: Any) -> None:
        """One step: ``fused(scratch, grads, exp_avgs, exp_avg_sqs, counts)`` on lists."""
        held = self._moments_flat[self._moment_index]
        fused(*self._whole, [self._count])
        if not self._counts:
            return
        self._moments_flat[self._moment_index] = held
        self._flat[0][self._index] = 0.0
        fused(*self._again, self._counts)


# --- run-file arrays of a population learner ------------------------------------------

def check_shapes(arrays: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]]) -> None:
    """ValueError (one line) unless every array of ``expected`` is stored with its shape."""
    for key, shape in expected.items():
        if key not in arrays:
            raise ValueError(f"{key} is missing")
        if tuple(np.shape(arrays[key])) != tuple(shape):
            raise ValueError(f"{key}: shape {tuple(np.shape(arrays[key]))}, expected {tuple(shape)}")
    if "members.adam.steps" in expected:
        steps = np.asarray(arrays["members.adam.steps"])
        if not ((steps >= 0) & (steps == np.round(steps))).all():
            raise ValueError("members.adam.steps: step counts are whole non-negative numbers")


def member_arrays(tables: Mapping[str, torch.Tensor], hypers: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A population learner's run-file arrays: each table as ``members.<name>`` and each
    hyper-parameter as ``hyper.<name>``, host copies, member axis first."""
    arrays = {f"members.{name}": value.detach().cpu().numpy().copy() for name, value in tables.items()}
    arrays.update({f"hyper.{name}": np.asarray(values).copy() for name, values in hypers.items()})
    return arrays


def network_tables(net: StackedMLP, adam: StackedAdam) -> dict[str, torch.Tensor]:
    """A one-network learner's run-file tables: ``members.net`` and its Adam state."""
    return {"members.net": net.matrix, "members.adam.exp_avg": adam.exp_avg,
            "members.adam.exp_avg_sq": adam.exp_avg_sq, "members.adam.steps": adam.steps}


def network_shapes(net: StackedMLP) -> dict[str, tuple[int, ...]]:
    """The shapes :func:`network_tables` stores, for :func:`check_shapes`."""
    shape = tuple(net.matrix.shape)
    return {"members.net": shape, "members.adam.exp_avg": shape, "members.adam.exp_avg_sq": shape,
            "members.adam.steps": (shape[0],)}


def load_network_tables(net: StackedMLP, adam: StackedAdam, arrays: Mapping[str, Any]) -> None:
    """Copy :func:`network_tables` back from checked ``arrays``, in place."""
    for name, table in network_tables(net, adam).items():
        table.copy_(torch.as_tensor(np.asarray(arrays[name]), device=table.device))


def member_hypers(hypers: Mapping[str, Any], names: Any, count: int) -> dict[str, np.ndarray]:
    """Each hyper-parameter of ``names`` as its own (count,) float64 array (copies)."""
    return {name: np.asarray(hypers[name], dtype=np.float64).reshape(count).copy() for name in names}


def stored_hypers(arrays: Mapping[str, Any], bounds: Mapping[str, Any], count: int) -> dict[str, np.ndarray]:
    """The members' hyper-parameters from ``hyper.<name>`` arrays, each checked against
    its :class:`popplay.operators.hyper.Bounds` (ValueError, one line)."""
    hypers = {}
    for name, bound in bounds.items():
        values = np.asarray(arrays.get(f"hyper.{name}", np.full(0, np.nan)), dtype=np.float64)
        if values.shape != (count,) or not all(bound.admits(float(v)) for v in values):
            raise ValueError(f"hyper.{name}: {count} values of {bound.describe()} expected")
        hypers[name] = values
    return hypers

"""Selective replication with variation, and the lineage that records it.

Operators over batched arrays whose agent axis is the last axis of the scores and
the first axis after any leading batch axes of the arrays they copy:

* :func:`select_replacements` — which agents are copied over which (parent indices);
* :func:`replicate` — copy rows of arrays from parents to children, by index;
* :func:`vary_factors` / :func:`gaussian_noise` — the random variation of copies, drawn
  from counter-based streams keyed by (seed, generation, agent id), so the same run
  varies the same way on any backend or batch layout.

:class:`Lineage` gives every agent a stable id and records every operator that acts
on an agent (copy, mutation, sharing, reset) with its generation, parent and the
parameter changes; it stores as plain numeric arrays in a run file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from popplay import rng

TAG_VARIATION = 8

EVENTS = {"initial": 0, "copy": 1, "mutation": 2, "share": 3, "reset": 4, "quarantine": 5}
EVENT_NAMES = {code: name for name, code in EVENTS.items()}


def select_replacements(scores: np.ndarray, fraction: float, eligible: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Truncation selection: the best ``fraction`` of agents are copied over the worst.

    Args:
        scores: (..., agents); higher is better.
        fraction: in (0, 0.5]; ``max(1, round(fraction * agents))`` agents are replaced.
        eligible: optional (..., agents) mask of agents that may be parents (e.g. not
            quarantined); ineligible agents rank below every eligible one.

    Returns:
        ``(parents, children)`` index arrays, shaped (..., n): ``children[k]`` (the k-th
        worst) is replaced by ``parents[k]`` (the k-th best). Ties rank the lower index
        first, so the result is deterministic.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if not 0.0 < fraction <= 0.5:
        raise ValueError(f"fraction must lie in (0, 0.5] (got {fraction})")
    agents = scores.shape[-1]
    if agents < 2:
        raise ValueError("selection needs at least two agents")
    count = max(1, int(round(fraction * agents)))
    ranked = np.where(np.isfinite(scores), scores, -np.inf)
    if eligible is not None:
        ranked = np.where(np.asarray(eligible, dtype=bool), ranked, -np.inf)
    order = np.argsort(-ranked, axis=-1, kind="stable")  # best first, lower index first on ties
    return order[..., :count], order[..., ::-1][..., :count]


def replicate(array: np.ndarray, parents: np.ndarray, children: np.ndarray) -> np.ndarray:
    """A copy of ``array`` (..., agents, ...) with each child's row replaced by its parent's.

    ``parents``/``children`` are shaped like :func:`select_replacements` returns; the
    agent axis of ``array`` is axis ``parents.ndim - 1``.
    """
    axis = parents.ndim - 1
    out = np.array(array, copy=True)
    source = np.take_along_axis(out, _expand(parents, out.ndim), axis=axis)
    np.put_along_axis(out, _expand(children, out.ndim), source, axis=axis)
    return out


def _expand(index: np.ndarray, ndim: int) -> np.ndarray:
    return index.reshape(index.shape + (1,) * (ndim - index.ndim))


def _words(seed: int, generation: int, agent_ids: np.ndarray, slot: int, count: int) -> np.ndarray:
    """``count`` words per agent id, from the stream of (seed, generation, agent id)."""
    import torch

    from popplay.xp import th

    r = rng.make_rng(th)
    keys = torch.from_numpy(rng.stream_keys(seed, TAG_VARIATION, [generation], np.ravel(agent_ids))[0])
    counters = torch.arange(count, dtype=torch.int64) + slot * (1 << 32)
    return r.draw(keys[:, None], r.mix_counter(counters)[None, :]).numpy().reshape(np.shape(agent_ids) + (count,))


def vary_factors(seed: int, generation: int, agent_ids: np.ndarray, names: tuple[str, ...],
                 spread: float) -> dict[str, np.ndarray]:
    """Random multiplicative factors in [1/spread, spread], log-uniform, one per agent
    id and parameter name (``spread`` = 1 gives factors of exactly 1)."""
    if spread < 1.0:
        raise ValueError(f"spread must be at least 1 (got {spread})")
    words = _words(seed, generation, agent_ids, slot=1, count=len(names))
    u = (words.view(np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    factors = spread ** (2.0 * u - 1.0)
    return {name: factors[..., i] for i, name in enumerate(names)}


def gaussian_noise(seed: int, generation: int, agent_ids: np.ndarray, size: int, std: float) -> np.ndarray:
    """N(0, std²) noise of ``size`` values per agent id, shaped agent_ids.shape + (size,)."""
    import torch

    from popplay.xp import th

    r = rng.make_rng(th)
    keys = torch.from_numpy(rng.stream_keys(seed, TAG_VARIATION, [generation], np.ravel(agent_ids))[0])
    counters = torch.arange(size, dtype=torch.int64) + (2 << 32)
    words = r.draw(keys[:, None], r.mix_counter(counters)[None, :])
    noise = r.normal(keys[:, None], counters[None, :], words).numpy()
    return std * noise.reshape(np.shape(agent_ids) + (size,))


@dataclass
class Lineage:
    """Stable agent ids and the record of every operator applied to them.

    Each record: generation, event code (see :data:`EVENTS`), agent id, parent id (-1
    when none), slot (the agent's index in the population), and one value per tracked
    parameter (the new value after the event; NaN when unchanged).
    """

    ids: np.ndarray  # (..., agents) int64: the id of the agent now in each slot
    next_id: int
    parameters: tuple[str, ...] = ()
    records: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def start(cls, shape: tuple[int, ...], parameters: tuple[str, ...] = ()) -> "Lineage":
        ids = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        lineage = cls(ids=ids, next_id=int(ids.size), parameters=parameters)
        lineage._clear()
        for slot, agent in np.ndenumerate(ids):
            lineage.record(0, "initial", int(agent), -1, slot[-1])
        return lineage

    def _clear(self) -> None:
        self.records = {key: [] for key in ("generation", "event", "agent", "parent", "slot", *self.parameters)}

    def record(self, generation: int, event: str, agent: int, parent: int, slot: int,
               changes: dict[str, float] | None = None) -> None:
        self.records["generation"].append(generation)
        self.records["event"].append(EVENTS[event])
        self.records["agent"].append(agent)
        self.records["parent"].append(parent)
        self.records["slot"].append(slot)
        for name in self.parameters:
            self.records[name].append(float((changes or {}).get(name, np.nan)))

    def replace(self, generation: int, parents: np.ndarray, children: np.ndarray) -> np.ndarray:
        """Give every child slot a new id whose parent is the id in the parent slot;
        returns the new ids, shaped like ``children``."""
        new_ids = np.empty(children.shape, dtype=np.int64)
        for index in np.ndindex(children.shape):
            lead = index[:-1]
            parent_id = int(self.ids[lead + (parents[index],)])
            new_id = self.next_id
            self.next_id += 1
            self.ids[lead + (children[index],)] = new_id
            new_ids[index] = new_id
            self.record(generation, "copy", new_id, parent_id, int(children[index]))
        return new_ids

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {name: np.asarray(values, dtype=np.float64 if name in self.parameters else np.int64)
                  for name, values in self.records.items()}
        arrays["ids"] = self.ids
        arrays["next_id"] = np.asarray([self.next_id], dtype=np.int64)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], parameters: tuple[str, ...] = ()) -> "Lineage":
        lineage = cls(ids=np.asarray(arrays["ids"], dtype=np.int64).copy(),
                      next_id=int(np.asarray(arrays["next_id"])[0]), parameters=parameters)
        lineage._clear()
        for name in lineage.records:
            lineage.records[name] = np.asarray(arrays[name]).tolist()
        return lineage

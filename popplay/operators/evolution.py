"""Selective replication with variation, and the lineage that records it.

Operators over batched arrays. Scores and ids are shaped (..., agents); the arrays
they act on are shaped (..., agents, ...) with the same leading batch axes (e.g.
(trials, agents, states) for a tabular population, (agents, weights) for knights):

* :func:`select_replacements` — which agents are copied over which (parent indices);
* :func:`replicate` — copy rows of arrays from parents to children, by index;
* :func:`vary_factors` / :func:`gaussian_noise` — the random variation of copies, drawn
  from counter-based streams keyed by (seed, generation, agent id), so the same run
  varies the same way on any backend or batch layout;
* :func:`multiply_at` / :func:`add_at` — apply that variation to the children, by index.

NumPy arrays and torch tensors (any device) are both accepted by the by-index
operators; indices are NumPy arrays.

:class:`Lineage` records every operator that acts on an agent (initial, copy,
mutation, sharing, reset, quarantine) with its generation, the agent's stable id,
its parent's id and the parameter values after the event, as plain numeric arrays
that a run file stores and restores exactly. The population state keeps the ids
themselves (an int64 array shaped like the scores).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from popplay import rng, stats

TAG_VARIATION = 8
#: When a selected pair is carried out: at every selection, or only on evidence (:func:`significant`).
REPLICATE_WHEN = ("always", "significant")

EVENTS = {"initial": 0, "copy": 1, "mutation": 2, "share": 3, "reset": 4, "quarantine": 5}
EVENT_NAMES = {code: name for name, code in EVENTS.items()}
# Events that bring a new id into the population (the agent's "birth").
BIRTH_EVENTS = (EVENTS["initial"], EVENTS["copy"], EVENTS["reset"])

_SLOT_VARIATION_FACTORS = 1
_SLOT_WEIGHT_NOISE = 2
_SLOT_SWITCHES = 3
_SLOT_WIDTH = 4
_SLOT_GROWTH = 5
_SLOT_WIDTH2 = 6


def replacement_count(agents: int, fraction: float) -> int:
    """Agents replaced at a selection: ``round(fraction · agents)``, at least 1 and at
    most ``agents // 2`` (so parents and children never overlap)."""
    if not 0.0 < fraction <= 0.5:
        raise ValueError(f"fraction must lie in (0, 0.5] (got {fraction})")
    if agents < 2:
        raise ValueError("selection needs at least two agents")
    return min(agents // 2, max(1, int(round(fraction * agents))))


def select_replacements(scores: np.ndarray, fraction: float, eligible: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Truncation selection: the best ``fraction`` of agents are copied over the worst.

    Args:
        scores: (..., agents); higher is better. NaN ranks below every number.
        fraction: in (0, 0.5]; :func:`replacement_count` agents are replaced.
        eligible: optional (..., agents) mask of agents that may be parents (e.g. not
            diverged or quarantined). Ineligible agents rank below every eligible one,
            so they are the first to be replaced, and are never parents.

    Returns:
        ``(parents, children)`` index arrays, shaped (..., n): ``children[k]`` (the k-th
        worst) is replaced by ``parents[k]`` (the k-th best). Ties rank the lower index
        first, so the result is deterministic. When fewer than n agents of a row may be
        parents, the eligible ones are used again in rank order; a row without any
        eligible agent gets ``parents == children`` (nothing to copy).
    """
    scores = np.asarray(scores, dtype=np.float64)
    count = replacement_count(scores.shape[-1], fraction)
    usable = ~np.isnan(scores)
    if eligible is not None:
        usable &= np.broadcast_to(np.asarray(eligible, dtype=bool), scores.shape)
    # Two keys: usable agents first, then by score; lexsort is stable, so equal keys
    # keep the lower index first.
    ranked = np.where(usable, np.nan_to_num(scores, nan=0.0, posinf=np.finfo(float).max,
                                            neginf=-np.finfo(float).max), 0.0)
    order = np.lexsort((-ranked, ~usable), axis=-1)
    children = order[..., ::-1][..., :count]
    n_usable = usable.sum(axis=-1, keepdims=True)
    pick = np.arange(count) % np.maximum(n_usable, 1)
    parents = np.take_along_axis(order, pick, axis=-1)
    parents = np.where(n_usable > 0, parents, children)
    return parents, children


def significant(parents: np.ndarray, children: np.ndarray, ratings: np.ndarray, errors: np.ndarray,
                confidence: float = 0.95) -> np.ndarray:
    """Which of :func:`select_replacements`' pairs to carry out when replacing needs
    evidence: ``parents[k]`` replaces ``children[k]`` only if the parent's rating
    interval (rating ± z · standard error, two-sided at ``confidence``) lies wholly
    above the child's, so no agent is replaced by one it may be as good as.

    Returns:
        A boolean mask over the pairs (shaped like ``parents``).
    """
    z = stats.z_value(confidence)
    ratings = np.asarray(ratings, dtype=np.float64)
    errors = np.asarray(errors, dtype=np.float64)
    parent_low = np.take_along_axis(ratings, parents, axis=-1) - z * np.take_along_axis(errors, parents, axis=-1)
    child_high = np.take_along_axis(ratings, children, axis=-1) + z * np.take_along_axis(errors, children, axis=-1)
    return parent_low > child_high  # NaN ratings (ineligible agents) compare False: never a parent


def window_means(recent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each agent's mean score over its window ``recent`` (..., agents, window; NaN
    where no score came yet) and that mean's standard error (sample standard deviation
    / sqrt(n)); NaN mean without any score, infinite error with fewer than two, so such
    an agent is never judged better or worse than another by :func:`significant`."""
    recent = np.asarray(recent, dtype=np.float64)
    seen = ~np.isnan(recent)
    count = seen.sum(axis=-1)
    values = np.where(seen, recent, 0.0)
    mean = np.where(count > 0, values.sum(axis=-1) / np.maximum(count, 1), np.nan)
    squares = np.where(seen, (recent - mean[..., None]) ** 2, 0.0).sum(axis=-1)
    error = np.where(count > 1, np.sqrt(squares / np.maximum(count - 1, 1) / np.maximum(count, 1)), np.inf)
    return mean, error


def _lead_index(lead: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Index arrays for the leading axes, shaped to broadcast against (..., n)."""
    depth = len(lead) + 1
    return tuple(np.arange(size).reshape((1,) * i + (size,) + (1,) * (depth - i - 1))
                 for i, size in enumerate(lead))


def _on(array: Any, index: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
    """``index`` as the array's own kind (torch tensors need device tensors)."""
    if type(array).__module__.startswith("torch"):
        import torch  # defers torch

        # contiguous: select_replacements hands out reversed views, which torch refuses
        return tuple(torch.as_tensor(np.ascontiguousarray(i, dtype=np.int64), device=array.device) for i in index)
    return index


def _check_lead(array: Any, index: np.ndarray) -> None:
    lead = tuple(index.shape[:-1])
    if tuple(array.shape[:len(lead)]) != lead or array.ndim <= len(lead):
        raise ValueError(f"array of shape {tuple(array.shape)} does not have the leading axes {lead} + (agents, ...)")


def replicate(array: Any, parents: np.ndarray, children: np.ndarray, out: Any = None) -> Any:
    """``array`` (..., agents, ...) with each child's row replaced by its parent's.

    ``parents``/``children`` are shaped like :func:`select_replacements` returns; the
    agent axis of ``array`` is axis ``parents.ndim - 1``. Returns a copy unless ``out``
    is given (``out=array`` copies in place: every parent row is read before any child
    row is written).
    """
    parents, children = np.asarray(parents, dtype=np.int64), np.asarray(children, dtype=np.int64)
    if parents.shape != children.shape:
        raise ValueError("parents and children must have the same shape")
    _check_lead(array, parents)
    lead = _lead_index(parents.shape[:-1])
    source = array[_on(array, lead + (parents,))]
    if out is None:
        out = array.clone() if hasattr(array, "clone") else np.array(array, copy=True)
    out[_on(out, lead + (children,))] = source
    return out


def multiply_at(array: Any, children: np.ndarray, factors: Any, *, low: float | None = None,
                high: float | None = None, out: Any = None) -> Any:
    """``array`` (..., agents, ...) with the children's entries multiplied by ``factors``
    (shaped like ``children``, or broadcastable to the selected rows) and clipped to
    [low, high]; a copy unless ``out`` is given."""
    children = np.asarray(children, dtype=np.int64)
    _check_lead(array, children)
    index = _on(array, _lead_index(children.shape[:-1]) + (children,))
    values = array[index] * _like(array, factors)
    if low is not None or high is not None:
        values = values.clip(low, high) if hasattr(values, "clip") else np.clip(values, low, high)
    if out is None:
        out = array.clone() if hasattr(array, "clone") else np.array(array, copy=True)
    out[index] = values
    return out


def add_at(array: Any, children: np.ndarray, values: Any, out: Any = None) -> Any:
    """``array`` (..., agents, ...) with ``values`` (shaped children.shape + row shape)
    added to the children's rows; a copy unless ``out`` is given."""
    children = np.asarray(children, dtype=np.int64)
    _check_lead(array, children)
    index = _on(array, _lead_index(children.shape[:-1]) + (children,))
    if out is None:
        out = array.clone() if hasattr(array, "clone") else np.array(array, copy=True)
    out[index] = array[index] + _like(array, values)
    return out


def _like(array: Any, values: Any) -> Any:
    if type(array).__module__.startswith("torch"):
        import torch  # defers torch

        if isinstance(values, torch.Tensor):  # e.g. already on a GPU: np.asarray would fail
            return values.to(dtype=array.dtype, device=array.device)
        return torch.as_tensor(np.asarray(values), dtype=array.dtype, device=array.device)
    return np.asarray(values)


def _words(seed: int, generation: int, agent_ids: np.ndarray, slot: int, count: int) -> tuple[Any, Any, Any]:
    """Keys, counters and ``count`` words per agent id, from the stream of
    (seed, generation, agent id); word ``i`` of slot ``s`` sits at counter ``s·2³² + i``."""
    r = rng._numpy_rng()  # NumPy, not torch: the numba paths must not pay for importing it
    keys = np.ascontiguousarray(rng.stream_keys(seed, TAG_VARIATION, [generation], np.ravel(agent_ids))[0])
    counters = np.arange(count, dtype=np.int64) + slot * (1 << 32)
    words = r.draw(keys[:, None], r.mix_counter(counters)[None, :])
    return keys, counters, words


def _uniform(words: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) from 64-bit words (their top 53 bits)."""
    return (words.view(np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def vary_factors(seed: int, generation: int, agent_ids: np.ndarray, names: tuple[str, ...],
                 spread: float) -> dict[str, np.ndarray]:
    """Random multiplicative factors in [1/spread, spread], log-uniform, one per agent
    id and parameter name (``spread`` = 1 gives factors of exactly 1). Shaped like
    ``agent_ids``."""
    if not (spread >= 1.0 and np.isfinite(spread)):
        raise ValueError(f"spread must be at least 1 (got {spread})")
    agent_ids = np.asarray(agent_ids, dtype=np.int64)
    if spread == 1.0 or agent_ids.size == 0:
        return {name: np.ones(agent_ids.shape) for name in names}
    _, _, words = _words(seed, generation, agent_ids, _SLOT_VARIATION_FACTORS, len(names))
    factors = spread ** (2.0 * _uniform(words) - 1.0)
    return {name: factors[:, i].reshape(agent_ids.shape) for i, name in enumerate(names)}


def switches(seed: int, generation: int, agent_ids: np.ndarray, probability: float) -> np.ndarray:
    """Which agent ids switch a discrete choice (e.g. a chooser's depth), each with
    ``probability``, from its own stream; shaped like ``agent_ids``."""
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"probability must lie in [0, 1] (got {probability})")
    agent_ids = np.asarray(agent_ids, dtype=np.int64)
    if probability == 0.0 or agent_ids.size == 0:
        return np.zeros(agent_ids.shape, dtype=bool)
    _, _, words = _words(seed, generation, agent_ids, _SLOT_SWITCHES, 1)
    return (_uniform(words[:, 0]) < probability).reshape(agent_ids.shape)


def width_changes(seed: int, generation: int, agent_ids: np.ndarray, probability: float,
                  widths: np.ndarray, most: int, *, layer: int = 1) -> np.ndarray:
    """New widths: each agent id's width halved or doubled (even odds) with
    ``probability``, within [1, ``most``], from its own stream (one per hidden
    ``layer``, 1 or 2, so the two layers' changes are independent); shaped like
    ``agent_ids``."""
    if layer not in (1, 2):
        raise ValueError(f"layer must be 1 or 2 (got {layer})")
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"probability must lie in [0, 1] (got {probability})")
    agent_ids = np.asarray(agent_ids, dtype=np.int64)
    widths = np.asarray(widths, dtype=np.int64).reshape(agent_ids.shape)
    if probability == 0.0 or agent_ids.size == 0:
        return widths.copy()
    _, _, words = _words(seed, generation, agent_ids, _SLOT_WIDTH if layer == 1 else _SLOT_WIDTH2, 2)
    change = _uniform(words[:, 0]) < probability
    grow = _uniform(words[:, 1]) < 0.5
    changed = np.clip(np.where(grow, 2 * widths.ravel(), widths.ravel() // 2), 1, most)
    return np.where(change, changed, widths.ravel()).reshape(agent_ids.shape)


def uniform_values(seed: int, generation: int, agent_ids: np.ndarray, size: int, scale: float) -> np.ndarray:
    """Uniforms on [−scale, scale], ``size`` per agent id (e.g. the weights of units a
    copy grows), shaped agent_ids.shape + (size,)."""
    agent_ids = np.asarray(agent_ids, dtype=np.int64)
    if agent_ids.size == 0:
        return np.zeros(agent_ids.shape + (size,))
    _, _, words = _words(seed, generation, agent_ids, _SLOT_GROWTH, size)
    return (scale * (2.0 * _uniform(words) - 1.0)).reshape(agent_ids.shape + (size,))


def gaussian_noise(seed: int, generation: int, agent_ids: np.ndarray, size: int, std: float) -> np.ndarray:
    """N(0, std²) noise of ``size`` values per agent id, shaped agent_ids.shape + (size,)."""
    if not (std >= 0.0 and np.isfinite(std)):
        raise ValueError(f"std must be non-negative (got {std})")
    agent_ids = np.asarray(agent_ids, dtype=np.int64)
    if std == 0.0 or agent_ids.size == 0:
        return np.zeros(agent_ids.shape + (size,))
    r = rng._numpy_rng()
    keys, counters, words = _words(seed, generation, agent_ids, _SLOT_WEIGHT_NOISE, size)
    noise = r.normal(keys[:, None], counters[None, :], words)
    return std * noise.reshape(agent_ids.shape + (size,))


# ---------------------------------------------------------------------------
# Lineage


# The integer columns of every lineage record (parameter columns follow).
RECORD_COLUMNS = ("generation", "event", "agent", "parent", "replaced", "group", "slot")


class FamilyNode(NamedTuple):
    """One agent in a family tree (see :meth:`Lineage.family`)."""

    agent: int
    parent: int  # -1 for a founder (initial or reset agent)
    born: int  # generation of the birth event
    event: str  # "initial", "copy" or "reset"
    group: int  # flat index of the leading batch axes (trial), 0 without any
    slot: int  # agent index it was born into
    values: dict[str, float]  # parameter values after its last recorded event (NaN: unknown)
    alive: bool  # in the current population
    events: int  # records that name this agent


class Lineage:
    """An append-only log of the operators applied to a population's agents.

    Each record: ``generation``, ``event`` (code in :data:`EVENTS`), ``agent`` (the id
    it concerns), ``parent`` (id of the agent it was copied from, −1 when none),
    ``replaced`` (id of the agent it overwrote, −1 when none), ``group`` (flat index of
    the leading batch axes, e.g. the trial; 0 without any), ``slot`` (agent index; −1
    with ``agent`` −1 for an event of a whole group, such as a share of all its agents), and
    one float per tracked parameter (its value after the event; NaN: not recorded).
    Ids are handed out in increasing order from ``next_id``; the population keeps the
    id of the agent in each slot.

    Appends are vectorised and amortised (buffers grow by doubling); the log is
    mutable so that a phase boundary hook (e.g. ``check_finite``) can record resets.
    """

    def __init__(self, parameters: tuple[str, ...] = (), next_id: int = 0) -> None:
        self.parameters = tuple(parameters)
        self.next_id = int(next_id)
        self._size = 0
        self._ints = np.zeros((len(RECORD_COLUMNS), 16), dtype=np.int64)
        self._floats = np.zeros((len(self.parameters), 16), dtype=np.float64)

    # -- building ---------------------------------------------------------------

    @classmethod
    def start(cls, ids: np.ndarray, parameters: tuple[str, ...] = (),
              values: dict[str, Any] | None = None) -> "Lineage":
        """A log whose founders are ``ids`` (..., agents), each recorded as "initial"
        at generation 0 with its parameter ``values`` (arrays shaped like ``ids``)."""
        ids = np.asarray(ids, dtype=np.int64)
        lineage = cls(parameters, next_id=int(ids.max()) + 1 if ids.size else 0)
        groups, slots = _groups_and_slots(ids.shape)
        lineage.record(0, "initial", ids, groups=groups, slots=slots, values=values)
        return lineage

    def __len__(self) -> int:
        return self._size

    def new_ids(self, count: int) -> np.ndarray:
        ids = np.arange(self.next_id, self.next_id + int(count), dtype=np.int64)
        self.next_id += int(count)
        return ids

    def record(self, generation: int, event: str, agents: Any, *, parents: Any = -1, replaced: Any = -1,
               groups: Any = 0, slots: Any = -1, values: dict[str, Any] | None = None) -> None:
        """Append one record per entry of ``agents``; the other arguments broadcast
        against it; ``values`` maps parameter names to values (missing names: NaN)."""
        agents = np.asarray(agents, dtype=np.int64)
        shape = agents.shape
        n = agents.size
        if n == 0:
            return
        self._reserve(n)
        columns = {"generation": generation, "event": EVENTS[event], "agent": agents, "parent": parents,
                   "replaced": replaced, "group": groups, "slot": slots}
        lo, hi = self._size, self._size + n
        for row, name in enumerate(RECORD_COLUMNS):
            self._ints[row, lo:hi] = np.broadcast_to(np.asarray(columns[name], dtype=np.int64), shape).reshape(-1)
        values = values or {}
        unknown = set(values) - set(self.parameters)
        if unknown:
            raise ValueError(f"untracked parameters {sorted(unknown)} (tracked: {list(self.parameters)})")
        for row, name in enumerate(self.parameters):
            value = values.get(name, np.nan)
            self._floats[row, lo:hi] = np.broadcast_to(np.asarray(value, dtype=np.float64), shape).reshape(-1)
        self._size = hi

    def _reserve(self, n: int) -> None:
        need = self._size + n
        if need <= self._ints.shape[1]:
            return
        capacity = max(need, 2 * self._ints.shape[1])
        ints = np.zeros((self._ints.shape[0], capacity), dtype=np.int64)
        floats = np.zeros((self._floats.shape[0], capacity), dtype=np.float64)
        ints[:, :self._size] = self._ints[:, :self._size]
        floats[:, :self._size] = self._floats[:, :self._size]
        self._ints, self._floats = ints, floats

    def replace(self, generation: int, ids: np.ndarray, parents: np.ndarray, children: np.ndarray,
                values: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Record the copies of a selection: every child slot gets a new id whose parent
        is the id in its parent slot (rows with ``parents == children`` copy nothing).

        Args:
            ids: (..., agents) the ids in each slot before the copies.
            parents, children: (..., n) as :func:`select_replacements` returns.
            values: per parameter, the values copied, shaped like ``children``.

        Returns:
            ``(new_ids, child_ids)``: the ids after the copies (a new array) and the
            id now in each child slot, shaped like ``children``.
        """
        ids = np.asarray(ids, dtype=np.int64)
        parents, children = np.asarray(parents, dtype=np.int64), np.asarray(children, dtype=np.int64)
        lead = _lead_index(children.shape[:-1])
        parent_ids = ids[lead + (parents,)]
        replaced = ids[lead + (children,)]
        copies = parents != children
        child_ids = replaced.copy()
        child_ids[copies] = self.new_ids(int(copies.sum()))  # row-major: deterministic
        new_ids = ids.copy()
        new_ids[lead + (children,)] = child_ids
        groups = np.broadcast_to(_flat_group(children.shape[:-1])[..., None], children.shape)
        chosen = {name: np.broadcast_to(np.asarray(v, dtype=np.float64), children.shape)[copies]
                  for name, v in (values or {}).items()}
        self.record(generation, "copy", child_ids[copies], parents=parent_ids[copies], replaced=replaced[copies],
                    groups=groups[copies], slots=children[copies], values=chosen)
        return new_ids, child_ids

    # -- reading ----------------------------------------------------------------

    def column(self, name: str) -> np.ndarray:
        """A copy of one column of the log (filled part only)."""
        if name in RECORD_COLUMNS:
            return self._ints[RECORD_COLUMNS.index(name), :self._size].copy()
        if name in self.parameters:
            return self._floats[self.parameters.index(name), :self._size].copy()
        raise KeyError(name)

    @property
    def records(self) -> dict[str, np.ndarray]:
        return {name: self.column(name) for name in (*RECORD_COLUMNS, *self.parameters)}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain numeric arrays for a run file (one per column, plus ``next_id``)."""
        arrays = self.records
        arrays["next_id"] = np.asarray([self.next_id], dtype=np.int64)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], parameters: tuple[str, ...] = ()) -> "Lineage":
        """The inverse of :meth:`to_arrays`; raises ValueError on missing or ragged columns."""
        missing = [name for name in (*RECORD_COLUMNS, *parameters, "next_id") if name not in arrays]
        if missing:
            raise ValueError(f"lineage has no {missing[0]}")
        columns = [np.asarray(arrays[name]).reshape(-1) for name in (*RECORD_COLUMNS, *parameters)]
        if len({len(c) for c in columns}) > 1:
            raise ValueError("lineage columns have different lengths")
        next_id = np.asarray(arrays["next_id"]).reshape(-1)
        if next_id.shape != (1,):
            raise ValueError("lineage next_id must hold one value")
        lineage = cls(parameters, next_id=int(next_id[0]))
        size = len(columns[0])
        lineage._reserve(size)
        for row in range(len(RECORD_COLUMNS)):
            lineage._ints[row, :size] = columns[row].astype(np.int64)
        for row in range(len(parameters)):
            lineage._floats[row, :size] = columns[len(RECORD_COLUMNS) + row].astype(np.float64)
        lineage._size = size
        agents = lineage.column("agent")
        if size and (agents.min() < -1 or agents.max() >= lineage.next_id):
            raise ValueError("lineage records name agent ids outside [-1, next_id)")
        return lineage

    def family(self, living: np.ndarray, *, everyone: bool = False) -> list[FamilyNode]:
        """The agents of the family tree of the ``living`` ids: they and all their
        ancestors (every agent ever recorded with ``everyone``), ordered by id."""
        records = self.records
        if (records["agent"] < 0).any():  # group-wide records (e.g. a share) name no single agent
            keep = records["agent"] >= 0
            records = {name: values[keep] for name, values in records.items()}
        births = np.isin(records["event"], BIRTH_EVENTS)
        size = max(self.next_id, 1)
        parent_of = np.full(size, -1, dtype=np.int64)
        born = np.zeros(size, dtype=np.int64)
        event_of = np.full(size, -1, dtype=np.int64)
        group_of = np.zeros(size, dtype=np.int64)
        slot_of = np.full(size, -1, dtype=np.int64)
        agents = records["agent"][births]
        parent_of[agents] = records["parent"][births]
        born[agents] = records["generation"][births]
        event_of[agents] = records["event"][births]
        group_of[agents] = records["group"][births]
        slot_of[agents] = records["slot"][births]
        # parameter values after each agent's last record (records are in time order)
        last = np.full(size, -1, dtype=np.int64)
        last[records["agent"]] = np.arange(len(records["agent"]))
        counts = np.bincount(records["agent"], minlength=size)
        living = np.asarray(living, dtype=np.int64).reshape(-1)
        alive = np.zeros(size, dtype=bool)
        alive[living] = True
        if everyone:
            member = counts > 0
        else:
            member = alive.copy()
            frontier = living
            while frontier.size:
                up = parent_of[frontier]
                up = np.unique(up[up >= 0])
                frontier = up[~member[up]]
                member[frontier] = True
        nodes = []
        for agent in np.flatnonzero(member).tolist():
            row = last[agent]
            values = {name: float(records[name][row]) if row >= 0 else float("nan") for name in self.parameters}
            nodes.append(FamilyNode(agent, int(parent_of[agent]), int(born[agent]),
                                    EVENT_NAMES.get(int(event_of[agent]), "unknown"), int(group_of[agent]),
                                    int(slot_of[agent]), values, bool(alive[agent]), int(counts[agent])))
        return nodes


def _flat_group(lead: tuple[int, ...]) -> np.ndarray:
    return np.arange(int(np.prod(lead, dtype=np.int64)), dtype=np.int64).reshape(lead)


def _groups_and_slots(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per entry of an (..., agents) array: the flat index of its leading axes and its agent index."""
    lead, agents = shape[:-1], shape[-1]
    groups = np.broadcast_to(_flat_group(lead)[..., None], shape)
    slots = np.broadcast_to(np.arange(agents, dtype=np.int64), shape)
    return groups, slots


def initial_ids(shape: tuple[int, ...]) -> np.ndarray:
    """Ids 0, 1, … for a new population shaped (..., agents), row-major."""
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)

"""Per-member hyper-parameters: ``--hp`` specs, their sampling, and PBT's explore step.

A spec names one hyper-parameter and how members draw it::

    lr=loguniform:1e-4:3e-3      log-uniform on [low, high]
    gamma=uniform:0.98:0.999     uniform on [low, high]
    gamma=choice:0.98,0.99,0.995 one of the listed values, uniformly
    target_every=choice:100,250,500

Several specs are separated by ``;`` (the command line's repeated ``--hp`` is joined
so). Every draw is a counter-based word keyed by (seed, member index, spec index), so
member ``k`` gets the same values in a population of any size or sharding.

:func:`explore` is PBT's explore step (Jaderberg et al. 2017) on copied members:
each hyper-parameter with a spec is resampled with probability ``resample``, else
multiplied by 0.8 or 1.2 (a numeric range; the result stays inside it) or moved to a
neighbouring value (a choice list). Hyper-parameters without a spec stay fixed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from popplay import rng

TAG_HYPER = 9
PERTURB_FACTORS = (0.8, 1.2)
KINDS = ("uniform", "loguniform", "choice")


@dataclass(frozen=True)
class Bounds:
    """What values a hyper-parameter may take at all (independent of any spec)."""

    low: float
    high: float = math.inf
    integer: bool = False
    low_open: bool = False  # low itself is not allowed (a step size of 0)

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return bool(math.isfinite(value) and above and value <= self.high
                    and (not self.integer or value == int(value)))

    def describe(self) -> str:
        low = f"{'>' if self.low_open else '>='} {self.low:g}"
        high = f" and <= {self.high:g}" if math.isfinite(self.high) else ""
        return ("a whole number " if self.integer else "") + low + high


@dataclass(frozen=True)
class HyperSpec:
    name: str
    kind: str  # one of KINDS
    values: tuple[float, ...]  # (low, high) for a range, the choices for "choice"


def parse(text: str, allowed: Mapping[str, Bounds]) -> tuple[HyperSpec, ...]:
    """The specs in ``text`` (``;``-separated; empty: none). ValueError with one line
    naming the bad spec, for an unknown name, kind, number or an out-of-bounds value."""
    specs: list[HyperSpec] = []
    for raw in (part.strip() for part in str(text).split(";")):
        if not raw:
            continue
        name, eq, rule = raw.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or not name:
            raise ValueError(f"hp {raw!r}: expected NAME=KIND:ARGS, such as lr=loguniform:1e-4:3e-3")
        if name not in allowed:
            raise ValueError(f"hp {raw!r}: {name} is not a per-member hyper-parameter here "
                             f"(one of {', '.join(sorted(allowed))})")
        if any(s.name == name for s in specs):
            raise ValueError(f"hp {raw!r}: {name} is given twice")
        kind, _, args = rule.strip().partition(":")
        if kind not in KINDS:
            raise ValueError(f"hp {raw!r}: the kind must be one of {', '.join(KINDS)} (got {kind!r})")
        try:
            numbers = tuple(float(v) for v in (args.split(",") if kind == "choice" else args.split(":")))
        except ValueError:
            raise ValueError(f"hp {raw!r}: expected numbers after {kind}:") from None
        bounds = allowed[name]
        if kind == "choice":
            if not numbers or len(set(numbers)) != len(numbers):
                raise ValueError(f"hp {raw!r}: choice needs distinct values, such as choice:0.98,0.99")
        else:
            if len(numbers) != 2 or not numbers[0] < numbers[1]:
                raise ValueError(f"hp {raw!r}: {kind} needs LOW:HIGH with LOW < HIGH")
            if kind == "loguniform" and numbers[0] <= 0:
                raise ValueError(f"hp {raw!r}: loguniform needs a positive LOW")
            if bounds.integer:
                raise ValueError(f"hp {raw!r}: {name} is a whole number; give it as choice:A,B,...")
        bad = [v for v in numbers if not bounds.admits(v)]
        if bad:
            raise ValueError(f"hp {raw!r}: {name} must be {bounds.describe()} (got {bad[0]:g})")
        specs.append(HyperSpec(name, kind, tuple(sorted(numbers)) if kind == "choice" else numbers))
    return tuple(specs)


def _uniforms(seed: int, members: np.ndarray, slot: int, count: int, counter: int = 0) -> np.ndarray:
    """(members, count) uniforms on [0, 1) from the stream of (seed, member, slot)."""
    r = rng._numpy_rng()
    keys = rng.stream_keys(seed, TAG_HYPER, [slot], np.asarray(members, dtype=np.int64).reshape(-1))[0]
    counters = r.mix_counter(np.arange(counter, counter + count, dtype=np.int64))
    return r.uniform53(r.draw(keys[:, None], counters[None, :]))


def _draw(spec: HyperSpec, u: np.ndarray) -> np.ndarray:
    if spec.kind == "choice":
        return np.asarray(spec.values)[np.minimum((u * len(spec.values)).astype(np.int64), len(spec.values) - 1)]
    low, high = spec.values
    if spec.kind == "loguniform":
        return np.exp(np.log(low) + u * (np.log(high) - np.log(low)))
    return low + u * (high - low)


def sample(specs: tuple[HyperSpec, ...], seed: int, members: np.ndarray,
           defaults: Mapping[str, float]) -> dict[str, np.ndarray]:
    """Every hyper-parameter in ``defaults`` as a (members,) float64 array: drawn per
    member from its spec, or the default value for all."""
    members = np.asarray(members, dtype=np.int64).reshape(-1)
    out = {name: np.full(members.shape, float(value)) for name, value in defaults.items()}
    for index, spec in enumerate(specs):
        out[spec.name] = _draw(spec, _uniforms(seed, members, 1 + index, 1)[:, 0])
    return out


def explore(values: dict[str, np.ndarray], children: np.ndarray, specs: tuple[HyperSpec, ...], seed: int,
            generation: int, child_ids: np.ndarray, resample: float) -> dict[str, np.ndarray]:
    """PBT's explore on the members at ``children`` (slots; their values already copied
    from their parents): new arrays, the other members unchanged. Draws are keyed by
    (seed, child id, spec) at ``generation``, so they repeat exactly on resume."""
    if not 0.0 <= resample <= 1.0:
        raise ValueError(f"resample must lie in [0, 1] (got {resample})")
    out = {name: array.copy() for name, array in values.items()}
    children = np.asarray(children, dtype=np.int64).reshape(-1)
    if children.size == 0:
        return out
    # Counter: 3 words per spec at each generation (resample?, up or down, the redraw).
    for index, spec in enumerate(specs):
        u = _uniforms(seed, np.asarray(child_ids).reshape(-1), 1 + len(specs) + index, 3, counter=3 * generation)
        current = out[spec.name][children]
        redraw = _draw(spec, u[:, 2])
        up = u[:, 1] < 0.5
        if spec.kind == "choice":
            choices = np.asarray(spec.values)
            at = np.abs(choices[None, :] - current[:, None]).argmin(axis=1)
            moved = choices[np.clip(at + np.where(up, 1, -1), 0, len(choices) - 1)]
        else:
            moved = np.clip(current * np.where(up, PERTURB_FACTORS[1], PERTURB_FACTORS[0]), *spec.values)
        out[spec.name][children] = np.where(u[:, 0] < resample, redraw, moved)
    return out

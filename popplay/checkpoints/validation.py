"""Checks of what a run file holds, by the same rules as the command line.

A run file is untrusted input: anyone can edit it and recompute its (unkeyed)
checksum. :func:`params_from_config` rebuilds a domain's parameters strictly (types,
ranges, the domain's own ``validate()``, and the memory the run would need) and
:func:`check_run` checks counters, curves and the population bookkeeping that the
commands rely on (agent ids, lineage, evaluation records, per-agent parameters).
Every problem is a :class:`ValueError` with a one-line reason. :func:`load_run` reads
a run file by these rules (:data:`RUN_CHECK`); every command loads run files through it.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Collection

import numpy as np

from popplay.checkpoints import runfile
from popplay.core import registry
from popplay.core.limits import MemoryLimitError, check_run_fits

INT64_MAX = 2**63 - 1
# Settings a run file's config must hold besides the domain's parameters.
RUN_OPTIONS = ("backend", "device")
BACKENDS = ("numba", "torch")


def _kind(default: Any) -> type:
    return bool if isinstance(default, bool) else type(default)


def check_value(name: str, value: Any, kind: type) -> None:
    """``value`` must be of ``kind`` (int: a whole number in int64, not a bool; float:
    a finite number; bool; str); ValueError otherwise."""
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and -INT64_MAX - 1 <= value <= INT64_MAX
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif kind is str:
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        expected = {int: "a whole number within 64 bits", float: "a finite number", bool: "true or false",
                    str: "text"}.get(kind, kind.__name__)
        raise ValueError(f"{name} must be {expected} (got {value!r})")


def params_from_config(domain: str, config: Any, *, run_options: bool = True, check_memory: bool = True,
                       known: Collection[str] | None = None) -> Any:
    """A domain's parameters from a run file's config, checked like the CLI's options;
    with ``run_options``, also the backend, device and time budget a resume reuses.
    ``known``: the settings the file's writer had (its ``config_settings``): a missing
    one of those is damage, refused, not a default; a setting the writer did not have
    was added since and takes its default, as every missing setting does in files
    written before that list existed (``known`` None)."""
    if not registry.known(domain):
        raise ValueError(f"unknown domain {domain!r}")
    if not isinstance(config, dict):
        raise ValueError(f"the config is {type(config).__name__}, not an object")
    params_type = registry.get(domain).params_type()
    values = {}
    for field in dataclasses.fields(params_type):
        if field.name not in config:
            if known is not None and field.name in known:
                raise ValueError(f"no {field.name} in the config, whose writer had that setting")
            continue  # written before the field existed: its default
        default = field.default if field.default is not dataclasses.MISSING else None
        value = config[field.name]
        if default is not None:
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            check_value(field.name, value, _kind(default))
        values[field.name] = value
    params = params_type(**values)
    params.validate()
    for name in RUN_OPTIONS if run_options else ():
        if not isinstance(config.get(name), str):
            raise ValueError(f"no {name}")
    if run_options and config["backend"] not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (got {config['backend']!r})")
    budget = config.get("time_budget")
    if budget is not None:
        check_value("time_budget", budget, float)
        if budget <= 0:
            raise ValueError(f"time_budget must be positive (got {budget!r})")
    if check_memory:
        try:
            check_run_fits(domain, params, "the run it describes")
        except MemoryLimitError as error:
            raise ValueError(str(error)) from None
    return params


_COUNTERS = {"step", "shares", "episode", "turns"}


def check_run(run: Any) -> None:
    """Counters, curves and population bookkeeping of a loaded
    :class:`popplay.checkpoints.runfile.RunFile`; ValueError naming the first problem."""
    check_counters(run.state_counters)
    _check_curves(run.curves)
    state = run.state
    ids = state.get("agent_id")
    next_id = None
    if "lineage_next_id" in state:
        raw = np.asarray(state["lineage_next_id"]).reshape(-1)
        if raw.shape != (1,) or raw.dtype.kind not in "iu" or not 0 <= int(raw[0]) <= INT64_MAX // 2:
            raise ValueError("lineage next_id must be one non-negative whole number")
        next_id = int(raw[0])
    if ids is not None:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise ValueError("agent ids are not whole numbers")
        if ids.size and (ids.min() < 0 or (next_id is not None and ids.max() >= next_id)):
            raise ValueError("agent ids lie outside [0, next_id)")
        if np.unique(ids.reshape(-1)).size != ids.size:
            raise ValueError("duplicate agent ids")
    if next_id is not None:
        for column in ("agent", "parent", "replaced"):
            values = state.get(f"lineage_{column}")
            if values is not None and np.size(values):
                values = np.asarray(values)
                if values.dtype.kind not in "iu" or values.min() < -1 or values.max() >= max(next_id, 1):
                    raise ValueError(f"lineage {column} ids lie outside [-1, next_id)")
    for prefix in ("", "snapshot_"):
        record = state.get(f"{prefix}eval_record")
        if record is not None and np.size(record) and np.asarray(record).min() < 0:
            raise ValueError("negative evaluation record")
        for name, low, high in (("alpha", 0.0, math.inf), ("lam", 0.0, 1.0), ("epsilon", 0.0, 1.0)):
            values = state.get(f"{prefix}{name}")
            if values is None or not np.size(values):
                continue
            values = np.asarray(values, dtype=np.float64)
            if not (np.isfinite(values).all() and values.min() >= low and values.max() <= high):
                raise ValueError(f"per-agent {name} outside [{low}, {high}]")


def check_counters(counters: dict[str, Any]) -> None:
    """The /state attributes: step, shares, episode and turns are non-negative whole
    numbers; any other number is finite."""
    for name, value in counters.items():
        if name in _COUNTERS:
            check_value(f"counter {name}", value, int)
            if value < 0:
                raise ValueError(f"counter {name} is negative ({value})")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"counter {name} is not finite")
    shares, step = counters.get("shares"), counters.get("step")
    if isinstance(shares, int) and isinstance(step, int) and shares > step:
        raise ValueError(f"counter shares ({shares}) exceeds step ({step}): every share ends a phase of at "
                         "least one step")


def _check_curves(curves: dict[str, Any]) -> None:
    length = None
    for name, values in curves.items():
        values = np.asarray(values)
        if values.ndim != 1:
            raise ValueError(f"curve {name} is not one-dimensional")
        if length is not None and len(values) != length:
            raise ValueError(f"curve {name} has {len(values)} points, not {length}")
        length = len(values)
    steps = curves.get("agent_steps")
    if steps is not None and np.size(steps):
        steps = np.asarray(steps)
        if steps.dtype.kind not in "iu" or steps.min() < 0:
            raise ValueError("curve agent_steps must be non-negative whole numbers")


def check_before_training(domain: str, params: Any, options: Any, *, resume: bool = False) -> None:
    """Everything a run's saves will need, checked before any learning (ValueError,
    one line): finite budgets, settings that fit a run file's attributes, memory for
    the run, and an output that can be written (see
    :func:`popplay.checkpoints.runfile.check_writable`)."""
    budget = options.time_budget
    if budget is not None and not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
        raise ValueError(f"--time-budget must be a positive number of seconds (got {budget})")
    every = options.checkpoint_every
    if every is not None and not (math.isfinite(every.amount) and 0 < every.amount <= 2**53):
        raise ValueError(f"--checkpoint-every must be a finite positive amount (got {every.amount})")
    try:
        runfile.check_storable({**params.to_dict(), "backend": str(options.backend), "device": str(options.device),
                                "time_budget": budget})
        for name, value in params.to_dict().items():
            if isinstance(value, int) and not isinstance(value, bool):
                check_value(f"--{name.replace('_', '-')}", value, int)
        check_run_fits(domain, params, f"a {domain} run with these settings")
        if options.out is not None:  # no out: learning in memory (the Python API), nothing to write
            runfile.check_writable(Path(options.out), overwrite=options.overwrite, resume=resume)
    except runfile.RunFileError as error:
        raise ValueError(str(error)) from None


class _RegisteredRules:
    """:class:`popplay.checkpoints.runfile.RunCheck` by the registered domains' rules."""

    def settings(self, domain: str, config: dict[str, Any], counters: dict[str, Any], *,
                 known: Collection[str] | None = None) -> None:
        if registry.known(domain):
            params_from_config(domain, config, run_options=False, known=known)
        check_counters(counters)

    def contents(self, run: Any) -> None:
        check_run(run)


#: How every command judges a run file's contents.
RUN_CHECK = _RegisteredRules()


def load_run(path: Path, *, expected_domain: str | None = None) -> runfile.RunFile:
    """Read a run file and check it by :data:`RUN_CHECK`
    (:class:`~popplay.checkpoints.runfile.RunFileError`, one line, otherwise)."""
    return runfile.read_run(Path(path), check=RUN_CHECK, expected_domain=expected_domain)


def summarize(path: Path) -> dict[str, Any]:
    """What ``popplay inspect`` shows of a run file, checked by :data:`RUN_CHECK`."""
    return runfile.summarize_run(Path(path), check=RUN_CHECK)

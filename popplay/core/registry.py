"""The domains popplay knows. Each one is a plug-in: a module that describes itself
with a :class:`DomainSpec` and calls :func:`register` when it is imported.

The plug-ins popplay ships are listed in :data:`PLUGINS`, one line each: the domain's
name and the module that registers it (so that listing the domains imports none of
them). Other packages add theirs through the ``popplay.plugins`` entry-point group
(``name = "module"``). Nothing outside a plug-in switches on a domain's name: what
differs between domains is a field of its spec.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from importlib import import_module, util
from importlib.metadata import entry_points
from typing import Any, Callable

from popplay.core.backend import DEVICES, Backend, cuda_available, resolve_backend
from popplay.core.errors import UsageError

#: The domains popplay ships and the module that registers each, in the order
#: commands list them.
PLUGINS: dict[str, str] = {
    "bandit": "popplay.games.bandit",
    "cartpole": "popplay.games.cartpole",
    "knights": "popplay.games.knights",
    "dqn": "popplay.deep.topologies.dqn_params",
    "reinforce": "popplay.deep.topologies.reinforce_params",
    "a2c": "popplay.deep.topologies.exarl_params",
    "td3": "popplay.deep.topologies.exarl_params",
    "ddpg": "popplay.deep.topologies.exarl_params",
    "ppo": "popplay.deep.agents.ppo_params",
    "gorila": "popplay.deep.topologies.gorila_params",
}
ENTRY_POINT_GROUP = "popplay.plugins"

POPULATION = "population"
DEEP = "deep"


def _resolve(target: Any) -> Any:
    """A class or function, or the one a ``"module:name"`` string names."""
    if isinstance(target, str):
        module, _, name = target.partition(":")
        return getattr(import_module(module), name)
    return target


@dataclass(frozen=True)
class DomainSpec:
    """What the pipeline needs to know of a domain, and nothing it must ask by name.

    ``params`` and ``experiment`` may be given as ``"module:Name"`` strings, so that a
    light plug-in module need not import its engines; they are loaded on first use.
    """

    name: str
    #: The frozen parameter dataclass (``validate()``, ``to_dict()``; every field a
    #: hyper-parameter with its help in ``metadata``).
    params: Any
    #: The experiment class, built as ``experiment(params, backend)``.
    experiment: Any
    #: ``population`` (Bell's domains: trials x agents, backends numba/torch) or
    #: ``deep`` (one learner, its actors and their topology; torch).
    kind: str = POPULATION
    #: One line for command lists (``popplay train --help``).
    summary: str = ""
    #: Ranks may split the population over processes (``--nproc``).
    sharded: bool = False
    #: Ranks may split the trials instead of the agents (when they divide the trials).
    splits_trials: bool = False
    #: ``memory(params, world, local) -> bytes`` one machine needs, ``local`` of the
    #: job's ``world`` ranks running on it (None: no estimate).
    memory: Any = None
    #: Devices a deep run's learner may use.
    devices: tuple[str, ...] = ("cpu",)
    #: Axis labels of curves in plots, by metric name (the metric's name otherwise);
    #: ``{field}`` is filled from the run's config.
    plot_units: dict[str, str] = field(default_factory=dict)
    #: What the curves' x-axis (``/curves/agent_steps``) counts, as plots label it.
    steps_label: str = "agent-time steps per trial"
    #: ``(state counter, params field)``: what a resumed run has already learned, which
    #: its new budget (that field) may not fall below.
    budget_counter: tuple[str, str] = ()
    #: ``runner(params, request) -> result`` for a domain whose job is not phases of one
    #: experiment under the pipeline (Gorila: ranks that may be lost while the run goes
    #: on, shards with their own checkpoints); may be a ``"module:name"`` string. Its
    #: command is generated like every other; the runner takes over after the options.
    runner: Any = None
    #: The order in which lineage exports list the per-agent parameters that
    #: replication mutates (others follow alphabetically).
    lineage_parameters: tuple[str, ...] = ()

    def params_type(self) -> type:
        return _resolve(self.params)

    def experiment_type(self) -> type:
        return _resolve(self.experiment)

    def runner_type(self) -> Callable[..., Any] | None:
        return None if self.runner is None else _resolve(self.runner)

    def build(self, params: Any, backend: Any) -> Any:
        """The experiment of ``params`` on ``backend``."""
        return self.experiment_type()(params, backend)

    def backend(self, backend: str = "auto", device: str = "auto", compile: bool | None = None) -> Backend:
        """Where a run of this domain computes. Populations: :func:`resolve_backend`.
        Deep agents run on torch, on the CPU unless ``--device cuda`` is asked for
        (``auto`` is the CPU: at these network sizes acting step by step across the bus
        costs more than a GPU saves) and the spec lists ``cuda``."""
        if self.kind == POPULATION:
            return resolve_backend(backend, device, compile=compile)
        if device not in DEVICES:
            raise UsageError(f"--device must be one of {', '.join(DEVICES)} (got {device!r})")
        if device != "cuda":
            return Backend("torch", "cpu")
        if "cuda" not in self.devices:
            # A refusal may load every plug-in to say where a GPU does help.
            on_gpu = [name for name in names() if "cuda" in get(name).devices]
            raise UsageError(f"--device cuda: {self.name} runs on the CPU in this version"
                             + (f" (on a GPU: {', '.join(on_gpu)})" if on_gpu else ""))
        if not cuda_available():
            raise UsageError("--device cuda: no CUDA GPU is available on this machine")
        return Backend("torch", "cuda")

    def memory_bytes(self, params: Any, world: int = 1, local: int = 1) -> int:
        """Bytes one machine needs for a run of ``params`` (0 without an estimate)."""
        estimate: Callable[..., int] | None = _resolve(self.memory)
        return 0 if estimate is None else int(estimate(params, world, local))


_SPECS: dict[str, DomainSpec] = {}


def register(spec: DomainSpec) -> DomainSpec:
    """Make ``spec`` known (plug-in modules call this when they are imported)."""
    known = _SPECS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"two plug-ins register the domain {spec.name!r}")
    _SPECS[spec.name] = spec
    return spec


def index() -> dict[str, str]:
    """Every domain's name and the module that registers it, without importing any."""
    modules = dict(PLUGINS)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        modules.setdefault(entry.name, entry.value.partition(":")[0])
    return modules


def names() -> list[str]:
    """Every domain, in the order of :data:`PLUGINS` (then other packages' plug-ins)."""
    return list(index())


def known(name: str) -> bool:
    return name in index()


def get(name: str) -> DomainSpec:
    """The spec of domain ``name`` (its module imported on first use);
    :class:`UsageError` naming the known ones otherwise."""
    if name not in _SPECS:
        modules = index()
        if name not in modules:
            raise UsageError(f"unknown domain {name!r} (known: {', '.join(modules)})")
        import_module(modules[name])
        if name not in _SPECS:
            raise UsageError(f"{modules[name]} does not register the domain {name!r}")
    return _SPECS[name]


def summary(name: str) -> str:
    """The first line of the help of domain ``name``'s module, read without importing
    it (command lists name every domain without loading its engines)."""
    found = util.find_spec(index()[name])
    if found is None or found.origin is None:
        return ""
    with open(found.origin, encoding="utf-8") as handle:
        doc = ast.get_docstring(ast.parse(handle.read())) or ""
    return " ".join(doc.split("\n\n")[0].split())

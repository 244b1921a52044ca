"""The domains popplay knows: their parameter dataclass and experiment class."""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from popplay.populations.base import Backend


@dataclass(frozen=True)
class DomainSpec:
    name: str
    params_path: str  # "module:Class" of the frozen parameter dataclass
    experiment_path: str  # "module:Class" of the experiment

    def params_type(self) -> type:
        return _load(self.params_path)

    def experiment_type(self) -> type:
        return _load(self.experiment_path)


DOMAINS: dict[str, DomainSpec] = {
    "bandit": DomainSpec("bandit", "popplay.games.bandit:BanditParams",
                         "popplay.populations.bandit:BanditExperiment"),
    "cartpole": DomainSpec("cartpole", "popplay.games.cartpole:CartPolePopulationParams",
                           "popplay.populations.cartpole:CartPoleExperiment"),
    "knights": DomainSpec("knights", "popplay.games.knights:KnightsParams",
                          "popplay.populations.knights:KnightsExperiment"),
}


def build(domain: str, params: Any, backend: Backend) -> Any:
    return DOMAINS[domain].experiment_type()(params, backend)


def params_from_config(domain: str, config: dict[str, Any]) -> Any:
    """Rebuild a domain's parameters from a run file's config (unknown keys ignored),
    checked as strictly as the command line's options (types, ranges, the memory the
    run needs); ValueError with a one-line reason otherwise."""
    from popplay.validation import params_from_config as checked

    return checked(domain, config, run_options=False)


def _load(path: str) -> type:
    module, name = path.split(":")
    return getattr(import_module(module), name)

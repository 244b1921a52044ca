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
    # Whether ranks may split the trials instead of the agents (the experiment picks
    # the trial layout whenever the ranks divide the trials).
    splits_trials: bool = False

    def params_type(self) -> type:
        return _load(self.params_path)

    def experiment_type(self) -> type:
        return _load(self.experiment_path)


DOMAINS: dict[str, DomainSpec] = {
    "bandit": DomainSpec("bandit", "popplay.games.bandit:BanditParams",
                         "popplay.populations.bandit:BanditExperiment", splits_trials=True),
    "cartpole": DomainSpec("cartpole", "popplay.games.cartpole:CartPolePopulationParams",
                           "popplay.populations.cartpole:CartPoleExperiment", splits_trials=True),
    "knights": DomainSpec("knights", "popplay.games.knights:KnightsParams",
                          "popplay.populations.knights:KnightsExperiment"),
    # Deep agents (popplay.topologies): not populations, but the same runner and run files.
    "dqn": DomainSpec("dqn", "popplay.topologies.dqn:DQNParams", "popplay.topologies.dqn:DQNExperiment"),
    "reinforce": DomainSpec("reinforce", "popplay.topologies.reinforce:ReinforceParams",
                            "popplay.topologies.reinforce:ReinforceExperiment"),
    "gorila": DomainSpec("gorila", "popplay.topologies.gorila:GorilaConfig",
                         "popplay.topologies.gorila:GorilaExperiment"),
    # EXARL's agents (issue 16)
    "a2c": DomainSpec("a2c", "popplay.topologies.exarl:A2CParams", "popplay.topologies.exarl:A2CExperiment"),
    "td3": DomainSpec("td3", "popplay.topologies.exarl:TD3Params", "popplay.topologies.exarl:TD3Experiment"),
    "ddpg": DomainSpec("ddpg", "popplay.topologies.exarl:DDPGParams", "popplay.topologies.exarl:DDPGExperiment"),
}
DEEP_DOMAINS = ("dqn", "reinforce", "gorila", "a2c", "td3", "ddpg")


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

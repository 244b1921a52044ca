"""The parameters of ``popplay train gorila`` (every option and a run file's config
come from :class:`GorilaConfig`'s fields) and its registration. It imports no torch:
the command line builds, checks and refuses before torch loads; the launcher is
:mod:`popplay.deep.topologies.gorila`, the job :mod:`popplay.deep.topologies.gorila_job`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from popplay.core import registry
from popplay.core.options import option, parse_widths
from popplay.core.registry import DEEP, DomainSpec, register
from popplay.deep.agents.config import check_network
from popplay.deep.topologies.deep_params import EnvChecked
from popplay.deep.topologies.exarl_params import TD3Switches, exploration_noise_option

#: Fields of this config that only some agents have: set for another agent, they are refused.
AGENT_KNOBS = ("epsilon_start", "epsilon_end", "epsilon_updates", "max_grad_norm", "exploration_noise",
               *(f.name for f in fields(TD3Switches)))


@dataclass(frozen=True)
class _GorilaFields(EnvChecked):
    """Gorila's layout and the knobs every agent shares (:class:`GorilaConfig`)."""

    agent: str = option("dqn", "The off-policy agent the learners compute gradients of: dqn (discrete actions), "
                               "ddpg or td3 (continuous actions). Its online networks are the shards' parameter "
                               "vector; its target networks a copy refreshed every --target-every server updates.")
    env: str = option("CartPole-v1", "A gymnasium id (CartPole-v1, LunarLander-v3 with the box2d extra, "
                                     "popplay/CartPole-v1, ...).")
    actors: int = option(2, "Actor processes (own environment, own copy of the acting network).", min=1, on_resume=True)
    learners: int = option(1, "Learner processes (see --replay).", min=1, on_resume=True)
    shards: int = option(1, "Parameter-server shards (AdaGrad on a slice each).", min=1, on_resume=True)
    # over all actors (each plays its share, whole episodes); 0: none
    env_steps: int = option(0, "Budget: environment steps over all actors (0: none).", min=0, budget=True)
    # over all actors (each plays its share); 0: none; both: whichever first
    episodes: int = option(0, "Budget: episodes over all actors (0: none).", min=0, budget=True)
    seed: int = option(0, "Seed of every random stream.")
    hidden: tuple[int, ...] = option((64, 64), "Hidden layer widths of every network of the agent, comma separated.")
    lr: float = option(0.01, "AdaGrad learning rate (on the shards).")
    adagrad_eps: float = 1e-8
    initial_accumulator: float = 0.1
    gamma: float = option(0.99, "Discount γ.", min=0.0, max=1.0)
    batch_size: int = option(64, "Minibatch of each learner update.", min=1)
    replay_capacity: int = option(50_000, "Replay capacity of each learner (its part, with global replay).", min=1)
    learning_starts: int = option(500, "Transitions in replay before learning (global: over all parts).", min=0)
    update_ratio: float = option(0.25, "Learner updates per transition received.")
    max_grad_norm: float = 10.0
    target_every: int = option(200, "G: server updates between target refreshes.", min=1)
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_updates: int = option(4_000, "dqn: server updates over which ε falls to 0.05.", min=1)
    exploration_noise: float = exploration_noise_option()
    actor_sync: int = option(100, "N: actor steps between parameter refreshes.", min=1)
    learner_sync: int = option(4, "Learner updates between parameter refreshes.", min=1)
    chunk: int = 50  # transitions per actor → learner message
    max_staleness: int = option(20, "Drop a gradient computed from parameters more than this many shard updates "
                                    "old.", min=0)
    outlier_k: float = option(6.0, "Drop gradients whose norm is over mean + k·std of the last --outlier-window "
                                   "norms.")
    outlier_window: int = option(100, "Norms in the outlier guard's window.", min=2)
    outlier_min_samples: int = 20
    checkpoint_every: int = 200  # applied gradients between a shard's checkpoints
    timeout: float = option(30.0, "Seconds any wait for another rank may take before the job ends with an error.",
                            on_resume=True)
    eval_episodes: int = option(100, "Greedy episodes played at the end for `quality`.", min=1)
    resume: str = ""  # a checkpoint.npz to start the parameters from (any layout)
    # "local": actor a feeds learner a mod L, which samples only that memory; "global":
    # the same placement, but every learner samples each minibatch from all the parts
    # (one memory distributed over the learners).
    replay: str = option(
        "local", "local: actor a feeds learner a mod L, which samples only that memory (Gorila's bundles); "
                 "global: one memory distributed over the learners (each holds its actors' part) and every "
                 "minibatch drawn from all of it.", choices=("local", "global"), name="--replay", on_resume=True)

    def __post_init__(self) -> None:
        if isinstance(self.hidden, str):  # the command line's widths, e.g. "64,64"
            object.__setattr__(self, "hidden", parse_widths(self.hidden))
        else:
            object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        # The outlier guard judges once it has seen this many norms: never more than its window holds.
        object.__setattr__(self, "outlier_min_samples", min(self.outlier_min_samples, self.outlier_window))

    @property
    def world_size(self) -> int:
        return self.shards + self.learners + self.actors

    def validate(self) -> None:
        for name in ("actors", "learners", "shards", "batch_size", "replay_capacity", "target_every",
                     "epsilon_updates", "actor_sync", "learner_sync", "chunk", "checkpoint_every",
                     "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.actors < self.learners:
            raise ValueError(f"every learner needs an actor: --actors {self.actors} < --learners {self.learners}")
        if self.env_steps < 0 or self.episodes < 0:
            raise ValueError("env_steps and episodes must be non-negative")
        if 0 < self.env_steps < self.actors or 0 < self.episodes < self.actors:
            raise ValueError(f"the budget must give every one of the {self.actors} actors a share")
        if not (self.lr > 0 and self.timeout > 0 and self.update_ratio > 0 and self.outlier_k > 0):
            raise ValueError("lr, timeout, update_ratio and outlier_k must be positive")
        if self.replay not in ("local", "global"):
            raise ValueError(f"replay must be local or global (got {self.replay!r})")
        if self.max_staleness < 0 or self.learning_starts < 0:
            raise ValueError("max_staleness and learning_starts must be non-negative")
        check_network(self)
        self._check_agent()

    def _check_agent(self) -> None:
        if not _runs_on_a_server(self.agent):
            raise ValueError(f"agent must be one of {', '.join(server_agents())} (got {self.agent!r})")
        theirs = {f.name for f in fields(registry.get(self.agent).params_type())}
        for f in fields(self):
            if f.name in AGENT_KNOBS and f.name not in theirs and getattr(self, f.name) != f.default:
                raise ValueError(f"{f.name} is not a parameter of --agent {self.agent}")

    def agent_params(self) -> Any:
        """The parameters of ``--agent`` as its own command takes them, with every field
        it shares with this config (hidden, gamma, seed, exploration, ...) from here."""
        params_type = registry.get(self.agent).params_type()
        ours = {f.name for f in fields(self)}
        return params_type(**{f.name: getattr(self, f.name) for f in fields(params_type) if f.name in ours})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GorilaConfig":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        if "hidden" in values:
            values["hidden"] = tuple(int(h) for h in values["hidden"])
        return cls(**values)


def server_agents() -> list[str]:
    """The registered agents a parameter server can run (their parameters say how)."""
    return [name for name in registry.names() if _runs_on_a_server(name)]


def _runs_on_a_server(name: str) -> bool:
    if not registry.known(name):
        return False
    spec = registry.get(name)
    return spec.kind == DEEP and hasattr(spec.params_type(), "server_agent")


@dataclass(frozen=True)
class GorilaConfig(TD3Switches, _GorilaFields):
    """Train an off-policy agent (DQN, DDPG, TD3) the Gorila way: actors and learners as
    processes around a sharded AdaGrad parameter server; stale and outlier gradients
    are dropped; a lost actor or learner does not stop the run, a lost shard stops it
    with its checkpoint. Under torchrun (world size = shards + learners + actors) every
    worker is one rank, and a lost rank ends the attempt (--max-restarts continues from
    the last checkpoint)."""


SPEC = register(DomainSpec(name="gorila", params=GorilaConfig, kind=DEEP,
                           experiment="popplay.deep.topologies.gorila:GorilaExperiment",
                           steps_label="environment steps", runner="popplay.deep.topologies.gorila_job:run",
                           summary="Gorila's actors, learners and sharded parameter server (Nair et al. 2015)."))

"""The population options of a deep agent's parameters (``--agents``, ``--hp``, PBT,
sharing), written once for every agent that has a population learner. No torch or
gymnasium here: parameter modules stay light (the runner is
:mod:`popplay.deep.topologies.population`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from popplay.core.options import option
from popplay.operators import hyper
from popplay.operators.evolution import REPLICATE_WHEN

#: What PBT ranks a deep population by.
RANK_BY = ("return", "greedy", "tournament")


@dataclass(frozen=True)
class PopulationLayout:
    """The population options of a deep agent's parameters (a mix-in)."""

    agents: int = option(1, "Members of a population learning at once, batched over a member axis in one process, "
                            "or split over --nproc N local ranks (N dividing the members); 1: one agent.", min=1)
    hp: str = option("", "Per-member hyper-parameter, drawn from the seed: NAME=loguniform:LOW:HIGH, "
                         "NAME=uniform:LOW:HIGH or NAME=choice:A,B,... (repeat --hp, or separate with ';').",
                     repeat=True, metavar="NAME=KIND:ARGS")
    phase_steps: int = option(500, "Populations: steps of each member's environments in a phase (a console line, "
                                   "a curve point, the operators' check).", min=1)
    replicate_every: int = option(0, "PBT every this many env-steps per member: the worst --replicate-fraction "
                                     "become copies of the best, then explore their --hp values (0: never).", min=0)
    replicate_fraction: float = option(0.25, "Fraction of members replaced at each PBT step.", min=0.0, max=0.5)
    window: int = option(10, "Episodes per member whose mean return ranks the members.", min=1)
    rank_by: str = option("return", "What PBT ranks members by: return (their mean over the last --window "
                                    "training episodes), greedy (their mean over --rank-episodes greedy episodes "
                                    "played for the ranking, not counted in --env-steps) or tournament (Elo ratings "
                                    "from a round robin of greedy games between the members, in a two-player "
                                    "environment such as popplay/Knights-v0).", choices=RANK_BY)
    rank_episodes: int = option(5, "With --rank-by greedy: greedy episodes each member plays at each PBT step.",
                                min=1)
    tournament_games: int = option(2, "With --rank-by tournament: games per pair of members (half with each "
                                      "moving first).", min=2)
    replicate_when: str = option("always", "always: at every PBT step the worst --replicate-fraction become copies "
                                           "of the best; significant: only where the parent's mean return over its "
                                           "--window lies above the child's with --replicate-confidence (their "
                                           "intervals, mean ± z standard errors, do not overlap; PBT's t-test "
                                           "exploit).", choices=REPLICATE_WHEN)
    replicate_confidence: float = option(0.95, "With --replicate-when significant: the intervals' confidence, "
                                               "in (0, 1).")
    replicate_after: int = option(0, "No PBT step before this many env-steps per member (early returns, under "
                                     "high exploration, measure luck more than skill).", min=0)
    resample: float = option(0.25, "PBT explore: chance to redraw a value from its --hp spec instead of x0.8 / "
                                   "x1.2 (or a neighbouring choice).", min=0.0, max=1.0)
    copy_replay: bool = option(False, "PBT copies also take their parent's replay memory (default: they keep "
                                      "their own).")
    share_every: int = option(0, "Experience-weighted sharing every this many env-steps per member: each group's "
                                 "parameters become their mean weighted by env-steps since the last share (0: never).",
                              min=0)
    share_group: int = option(0, "Members per sharing group, consecutive slots (0: all of them).", min=0)
    differentiation: float = option(0.0, "After a share, add Uniform(-b, b) to every parameter of every member "
                                         "(Bell's differentiation, eq. 9); b is this value at the first share.",
                                    min=0.0)
    bias_decay: float = option(1.0, "b is divided by this at every share (Bell's eq. 10).", min=1.0)

    def hyper_specs(self, allowed: dict[str, hyper.Bounds]) -> tuple[hyper.HyperSpec, ...]:
        return hyper.parse(self.hp, allowed)

    @property
    def shards_members(self) -> bool:
        """A population: ``--nproc`` ranks each run a block of its members (every rank
        runs the phases), instead of a topology's ranks serving its learner."""
        return self.agents > 1

    def check_ranks(self, world: int) -> None:
        """What a population cannot do over ``world`` ranks (ValueError, one line),
        checked before any rank starts."""
        if world > 1 and getattr(self, "episodes", 0):
            raise ValueError(f"--episodes {self.episodes}: a population over several ranks takes an --env-steps "
                             "or --time-budget budget (every rank must agree on it at every step); give --episodes 0")

    def schedule_warnings(self) -> list[str]:
        """An env-step budget the population's steps overshoot, and operators it never
        reaches (silently either is not what was asked)."""
        if self.agents < 2 or not getattr(self, "env_steps", 0):
            return []
        per_member = -(-self.env_steps // self.agents)  # type: ignore[attr-defined]  (over its copies)
        step = self.agents * int(getattr(self, "copies", 1))  # env-steps of one step of every member's copies
        rounded = [] if self.env_steps % step == 0 else [  # type: ignore[attr-defined]
            f"--env-steps {self.env_steps:,} is not a multiple of the {step:,} env-steps of one population step "
            f"(--agents {self.agents:,}{'' if step == self.agents else ' x their copies'}): training "
            f"{-(-self.env_steps // step) * step:,} env-steps"]  # type: ignore[attr-defined]
        return rounded + [
            f"--{name.replace('_', '-')} {every:,} is more than the {per_member:,} env-steps each member takes: "
            f"no {what} will happen"
            for name, every, what in (("replicate_every", self.replicate_every, "replication"),
                                      ("share_every", self.share_every, "sharing")) if every > per_member]

    #: Whether this agent's members keep a replay memory (what --copy-replay copies).
    members_keep_replay: ClassVar[bool] = True

    def idle_options(self) -> str | None:
        """The first option set that would do nothing with the others (its default
        changed where no operator reads it), or None. ``train`` refuses it for a new run
        rather than ignore it; a stored run's settings are not re-judged by it, so files
        written before this check still evaluate and resume."""
        defaults = {field.name: field.default for field in fields(PopulationLayout)}
        changed = [name for name, default in defaults.items() if getattr(self, name) != default]
        if self.agents == 1:
            return next((f"{name} acts on a population: give --agents 2 or more" for name in changed
                         if name not in ("agents", "phase_steps")), None)
        problems = [f"{name} acts on PBT's steps: give --replicate-every too" for name in changed
                    if name in ("replicate_when", "replicate_after", "copy_replay") and not self.replicate_every]
        problems += [f"{name} acts on sharing: give --share-every too" for name in changed
                     if name in ("share_group", "differentiation", "bias_decay") and not self.share_every]
        if self.copy_replay and not self.members_keep_replay:
            problems.append("copy_replay: these members keep no replay memory (they learn from their own rollouts)")
        return problems[0] if problems else None

    def _check_population(self, allowed: dict[str, hyper.Bounds], topology: str, layout: str = "--topology") -> None:
        """Population options that only make sense together (ValueError, one line)."""
        if self.agents < 1:
            raise ValueError(f"agents must be at least 1 (got {self.agents})")
        self.hyper_specs(allowed)
        if self.agents == 1:
            for name, value in (("hp", self.hp), ("replicate_every", self.replicate_every),
                                ("share_every", self.share_every), ("rank_by", self.rank_by != "return")):
                if value:
                    raise ValueError(f"{name} acts on a population: give --agents 2 or more")
            return
        if topology != "sequential":
            raise ValueError(f"agents: a population is a layout of its own (its members in one process, or over "
                             f"--nproc ranks); give {layout} sequential (got {topology!r})")
        if self.replicate_every and not 0 < self.replicate_fraction <= 0.5:
            raise ValueError(f"replicate_fraction must lie in (0, 0.5] (got {self.replicate_fraction})")
        if self.rank_by not in RANK_BY:
            raise ValueError(f"rank_by must be one of {', '.join(RANK_BY)} (got {self.rank_by!r})")
        if self.rank_by != "return" and not self.replicate_every:
            raise ValueError(f"rank_by {self.rank_by} ranks the members for PBT: give --replicate-every too")
        if self.rank_episodes < 1:
            raise ValueError(f"rank_episodes must be at least 1 (got {self.rank_episodes})")
        if self.tournament_games < 2:
            raise ValueError(f"tournament_games must be at least 2 (got {self.tournament_games})")
        if self.replicate_when not in REPLICATE_WHEN:
            raise ValueError(f"replicate_when must be one of {', '.join(REPLICATE_WHEN)} (got {self.replicate_when!r})")
        if not 0.0 < self.replicate_confidence < 1.0:
            raise ValueError(f"replicate_confidence must lie in (0, 1) (got {self.replicate_confidence})")
        if self.replicate_after < 0:
            raise ValueError(f"replicate_after must be non-negative (got {self.replicate_after})")
        if self.share_group and (self.share_group < 2 or self.agents % self.share_group):
            raise ValueError(f"share_group must be 0 or a divisor of --agents of at least 2 (got {self.share_group})")
        for name in ("phase_steps", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if not (self.differentiation >= 0 and math.isfinite(self.differentiation)):
            raise ValueError(f"differentiation must be non-negative (got {self.differentiation})")
        if not (self.bias_decay >= 1 and math.isfinite(self.bias_decay)):
            raise ValueError(f"bias_decay must be at least 1 (got {self.bias_decay})")


#: What one member's environment holds, roughly (CartPole about 5 KB measured; box2d's more).
ENV_BYTES = 16 * 1024
#: Observation width assumed before the environment is made (CartPole 4, LunarLander 8).
OBS_DIM_ESTIMATE = 8


def mlp_parameters(in_dim: int, out_dim: int, hidden: tuple[int, ...]) -> int:
    """The parameter count of a fully connected network ``in_dim -> hidden... -> out_dim``."""
    widths = [in_dim, *hidden, out_dim]
    return sum((a + 1) * b for a, b in zip(widths, widths[1:]))


def population_bytes(agents: int, parameters: int, tables: int, rows: int, row_bytes: int, envs: int) -> int:
    """A population's memory: ``tables`` float32 (P, ``parameters``) matrices (networks,
    Adam's moments, gradients), ``rows`` stored rows of ``row_bytes`` per member (replay
    or rollout), and ``envs`` environments per member; one agent is a population of one."""
    return max(1, agents) * (tables * 4 * parameters + rows * row_bytes + envs * ENV_BYTES)


def rollout_population_bytes(agents: int, hidden: tuple[int, ...], copies: int, n_steps: int) -> int:
    """A population of actor-critic members learning from rollouts (PPO's, A2C's):
    policy and value networks, their gradient, Adam's two moments and its scratch, and a
    rollout row of each copy."""
    obs = OBS_DIM_ESTIMATE
    parameters = mlp_parameters(obs, 4, hidden) + mlp_parameters(obs, 1, hidden)
    return population_bytes(agents, parameters, 5, copies * n_steps, 4 * (obs + 6), copies)


def agent_memory_bytes(params: Any, world: int = 1, local: int = 1) -> int:
    """One deep agent's memory, before anything is allocated, so a crafted or mistyped
    width (``--hidden 100000,100000``) is refused in one line instead of failing inside
    torch: its networks as eight float32 tables of an MLP of ``params.hidden`` (actor,
    critics, their targets, gradients and Adam's moments, generously) and its replay
    memory (``replay_capacity`` rows of two observations, an action, a reward and a flag)."""
    parameters = mlp_parameters(OBS_DIM_ESTIMATE, OBS_DIM_ESTIMATE, tuple(getattr(params, "hidden", ())))
    rows = int(getattr(params, "replay_capacity", 0) or 0)
    return population_bytes(1, parameters, 8, rows, 4 * (2 * OBS_DIM_ESTIMATE + 3) + 8, 1)

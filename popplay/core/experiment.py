"""The experiment protocol: what a domain offers the training pipeline, and what the
pipeline hands back (learning curves, progress for the console).

A domain's experiment (one class per population domain, one per deep agent) knows
its domain; the pipeline (:mod:`popplay.training`) knows nothing of domains.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Protocol


class Experiment(Protocol):
    """What a population experiment offers the runner (one class per domain).

    ``params`` is the domain's frozen parameter dataclass (with ``validate()`` and
    ``to_dict()``); states are NamedTuples of arrays with the population axes leading.
    """

    domain: str
    params: Any

    def initial_state(self) -> Any:
        """The state before any learning."""

    def warmup(self) -> None:
        """Compile or load JIT kernels (excluded from learning time)."""

    def finished(self, state: Any, *, time_mode: bool) -> bool:
        """True once the step/episode budget is spent (never in time mode)."""

    def phase(self, state: Any, *, time_left: float | None) -> Any:
        """One timed unit of work: learning plus the population operators after it."""

    def measure(self, state: Any) -> dict[str, float]:
        """Untimed quality metrics at a phase boundary; must include ``quality``."""

    def agent_steps(self, state: Any) -> int:
        """The x-axis of the learning curve (agent-time steps per trial)."""

    def total_agent_steps(self, state: Any) -> int:
        """Every agent-step of every trial so far (throughput numerator)."""

    def budget_agent_steps(self) -> int:
        """``agent_steps`` at the end of the step budget (for progress and ETA)."""

    def state_arrays(self, state: Any) -> dict[str, Any]:
        """The arrays of ``state`` to store under /state (NumPy)."""

    def state_counters(self, state: Any) -> dict[str, Any]:
        """The scalar counters of ``state`` (stored as /state attributes)."""

    def restore(self, arrays: dict[str, Any], counters: dict[str, Any]) -> Any:
        """Rebuild a state from ``state_arrays``/``state_counters``; check shapes."""

    def static_arrays(self) -> dict[str, Any]:
        """Fixed arrays to store, keyed by "group/name" (environment, attributes)."""

    def results(self, state: Any) -> dict[str, Any]:
        """Per-trial (or per-agent) results to store under /results."""

    def progress(self, state: Any) -> int:
        """Progress in the unit of ``--checkpoint-every`` counts and of the budget
        (agent-time steps per trial; episodes for knights)."""

    def check_finite(self, state: Any, *, phase: int) -> list[str]:
        """Reset or quarantine agents whose values became non-finite (in place);
        return one message per event. Called after every phase, before checkpoints."""


@dataclass
class Curve:
    """Learning curves: one entry per measurement point."""

    agent_steps: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def append(self, agent_steps: int, seconds: float, metrics: dict[str, float]) -> None:
        self.agent_steps.append(agent_steps)
        self.seconds.append(seconds)
        for name, value in metrics.items():
            self.metrics.setdefault(name, [float("nan")] * (len(self.agent_steps) - 1)).append(value)
        for name, values in self.metrics.items():
            if len(values) < len(self.agent_steps):
                values.append(float("nan"))

    def __len__(self) -> int:
        return len(self.agent_steps)


#: The unit of progress of the domains whose budget is agent-time steps per trial.
PER_TRIAL = "agent-steps per trial"


@dataclass
class Progress:
    """A snapshot for the console: everything :func:`popplay.console.render` shows.

    ``agent_steps`` is the learning curve's x-axis (agent-time steps per trial);
    ``total_agent_steps`` counts every agent-step of every trial (the numerator of
    ``agent_steps_per_second``). The budget is counted in ``unit``: agent-time steps
    per trial, or episodes (knights, whose agent-step total is not known in advance).
    """

    domain: str
    phase: int
    agent_steps: int
    budget_agent_steps: int | None
    learning_seconds: float
    time_budget: float | None
    agent_steps_per_second: float
    metrics: dict[str, float]
    done: bool = False
    total_agent_steps: int | None = None
    unit: str = PER_TRIAL
    done_units: int | None = None
    budget_units: int | None = None
    #: What a step is, as rates and totals are labelled (env-steps for deep agents).
    step_name: str = "agent-steps"
    #: Wall-clock seconds per learning second so far in this process (measurements,
    #: checkpoints and logs cost time too), which turns learning time left into an ETA.
    wall_per_learning: float = 1.0

    @property
    def fraction(self) -> float:
        if self.time_budget:
            return min(1.0, self.learning_seconds / self.time_budget)
        if self.budget_units and self.done_units is not None:
            return min(1.0, self.done_units / self.budget_units)
        if self.budget_agent_steps:
            return min(1.0, self.agent_steps / self.budget_agent_steps)
        return 0.0

    @property
    def eta_seconds(self) -> float | None:
        """Wall-clock time still to go: the learning time left, stretched by what
        measuring and saving have cost per learning second so far."""
        if self.done:
            return 0.0
        if self.time_budget:
            learning_left = max(0.0, self.time_budget - self.learning_seconds)
        elif self.fraction <= 0.0:
            return None
        else:
            learning_left = self.learning_seconds * (1.0 - self.fraction) / self.fraction
        return learning_left * max(1.0, self.wall_per_learning)


class RankSync(Protocol):
    """How the ranks of a sharded job keep in step (:func:`popplay.training.ranks.rank_sync`)."""

    def start(self) -> None:
        """Wait until every rank has warmed up, so that all start learning together."""

    def agree(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any (a decision all must share)."""

    def seconds(self, learning_seconds: float) -> float:
        """The learning time every rank counts (the slowest rank's), so that a time
        budget ends all of them after the same phase."""


class Reporter(Protocol):
    def update(self, progress: Progress) -> None: ...

    # Optional: ``status(message)`` for one-off lines (compiling, saving), shown apart
    # from the progress display.



class RunRequest(NamedTuple):
    """What the generated ``train`` command hands a domain's own runner
    (``DomainSpec.runner``): where the run goes, what it continues, how it reports."""

    out: Path
    resume: Any  # the stored run to continue (checkpoints.validation.StoredRun), or None
    overwrite: bool
    json_output: bool
    should_stop: Callable[[], bool]  # polled: true once Ctrl-C asked the run to stop and save
    quiet: bool = False  # no status or progress lines on stderr
    time_budget: float | None = None  # total learning seconds of the run (a resumed run's included)
    log_dir: Any = None  # pathlib.Path: scalar logs (popplay.checkpoints.scalars), or None


class RunResult(NamedTuple):
    """What a domain's runner gives back to the command that prints it."""

    summary: dict[str, Any]  # the --json object
    text: str  # the summary for people
    notes: list[str]  # lines for stderr
    exit_code: int
    metrics: tuple[str, ...] = ("quality",)  # what --seeds averages (mean and standard error)

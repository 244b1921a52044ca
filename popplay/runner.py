"""The one place that wires an experiment's phases to timing, metrics and output.

An experiment (see :class:`Experiment`) knows its domain; the runner knows nothing
of domains. It alternates timed learning phases (each ending with the domain's
population operators) and untimed measurements, records the learning curves
against agent-time steps and against learning time, feeds the console, and stops on
the step budget, the time budget or a stop request.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


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
        """Learning time still to go (measurement time not included)."""
        if self.done:
            return 0.0
        if self.time_budget:
            return max(0.0, self.time_budget - self.learning_seconds)
        if self.fraction <= 0.0:
            return None
        return self.learning_seconds * (1.0 - self.fraction) / self.fraction


class RankSync(Protocol):
    """How the ranks of a sharded job keep in step (:func:`popplay.distributed.train.rank_sync`)."""

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


def _status(reporter: Any, message: str) -> None:
    if reporter is not None and hasattr(reporter, "status"):
        reporter.status(message)


class CompileClock:
    """Seconds numba spends compiling while active, so that learning time leaves them
    out (a cold cache compiles kernels during the first phases too, not only in the
    warm-up), and the first compilation announced once: on a fresh machine the
    kernels take seconds to compile and the console must not look frozen."""

    def __init__(self, announce: Callable[[], None] | None = None, *, numba: bool = False) -> None:
        self.seconds = 0.0
        self._numba = numba  # listen even if numba is not imported yet (its kernels load lazily)
        self._announce = announce
        self._depth = 0
        self._started = 0.0
        self._listener: Any = None

    def __enter__(self) -> "CompileClock":
        import sys

        if "numba" not in sys.modules and not self._numba:  # torch backend: nothing to compile
            return self
        from numba.core import event

        clock = self

        class _Listener(event.Listener):
            def on_start(self, ev: Any) -> None:
                if clock._depth == 0:
                    if clock._announce is not None:
                        announce, clock._announce = clock._announce, None
                        announce()
                    clock._started = time.perf_counter()
                clock._depth += 1

            def on_end(self, ev: Any) -> None:
                clock._depth -= 1
                if clock._depth == 0:
                    clock.seconds += time.perf_counter() - clock._started

        self._listener = _Listener()
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._listener is not None:
            from numba.core import event

            event.unregister("numba:compile", self._listener)
            self._listener = None


@dataclass
class RunResult:
    state: Any
    curve: Curve
    learning_seconds: float
    phases: int
    stopped: bool  # a stop request ended the run early


def run(
    experiment: Experiment,
    *,
    time_budget: float | None = None,
    reporter: Reporter | None = None,
    state: Any = None,
    curve: Curve | None = None,
    learning_seconds: float = 0.0,
    should_stop: Callable[[], bool] | None = None,
    after_phase: Callable[[Any, Curve, float], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    ranks: RankSync | None = None,
) -> RunResult:
    """Learn until the step budget (or ``time_budget`` seconds of learning) is spent.

    Learning time counts only the phases (learning and sharing); warm-up, JIT
    compilation wherever it happens, and measurements are excluded. ``state``,
    ``curve`` and ``learning_seconds`` continue an earlier run. ``after_phase`` sees
    every new point (checkpoints hook in there). ``ranks`` keeps the ranks of a
    sharded job in step: they start learning together after every rank's warm-up (no
    rank's first phase counts another's compilation) and, in a ``time_budget`` run,
    count the same learning time after every phase (so all stop after the same one).
    """
    uses_numba = getattr(getattr(experiment, "backend", None), "name", None) == "numba"
    announce = lambda: _status(reporter, "compiling kernels (first run only)…")  # noqa: E731
    with CompileClock(announce, numba=uses_numba) as compiling:
        return _run(experiment, time_budget=time_budget, reporter=reporter, state=state, curve=curve,
                    learning_seconds=learning_seconds, should_stop=should_stop, after_phase=after_phase,
                    on_event=on_event, compiling=compiling, ranks=ranks)


def _run(experiment: Experiment, *, time_budget: float | None, reporter: Reporter | None, state: Any,
         curve: Curve | None, learning_seconds: float, should_stop: Callable[[], bool] | None,
         after_phase: Callable[[Any, Curve, float], None] | None, on_event: Callable[[str], None] | None,
         compiling: CompileClock, ranks: RankSync | None = None) -> RunResult:
    experiment.warmup()
    if ranks is not None:
        ranks.start()
    if state is None:
        state = experiment.initial_state()
    curve = curve if curve is not None else Curve()
    time_mode = time_budget is not None
    phases = 0
    stopped = False
    unit = getattr(experiment, "progress_unit", PER_TRIAL)
    # Knights' budget is in episodes; its agent-step total is only a projection.
    budget_units = getattr(experiment, "budget_progress", experiment.budget_agent_steps)

    def progress(done: bool) -> Progress:
        steps = experiment.total_agent_steps(state)
        return Progress(
            domain=experiment.domain, phase=len(curve), agent_steps=experiment.agent_steps(state),
            budget_agent_steps=None if time_mode or unit != PER_TRIAL else experiment.budget_agent_steps(),
            learning_seconds=learning_seconds, time_budget=time_budget,
            agent_steps_per_second=steps / learning_seconds if learning_seconds > 0 else 0.0,
            metrics={name: values[-1] for name, values in curve.metrics.items()}, done=done,
            total_agent_steps=steps, unit=unit, done_units=experiment.progress(state),
            budget_units=None if time_mode else budget_units(),
        )

    while True:
        # In time mode a domain may still end earlier on its own budget (knights:
        # whichever of episodes and time comes first); bandit and cart-pole never do.
        if experiment.finished(state, time_mode=time_mode):
            break
        if time_mode and learning_seconds >= time_budget:
            break
        if should_stop is not None and should_stop():
            stopped = True
            break
        time_left = time_budget - learning_seconds if time_mode else None
        started, compiled = time.perf_counter(), compiling.seconds
        state = experiment.phase(state, time_left=time_left)
        learning_seconds += max(0.0, time.perf_counter() - started - (compiling.seconds - compiled))
        if time_mode and ranks is not None:
            learning_seconds = ranks.seconds(learning_seconds)
        phases += 1
        # Diverged agents are reset before anything measures, stores or copies them.
        check = getattr(experiment, "check_finite", None)
        if check is not None:
            for event in check(state, phase=len(curve) + 1):
                if on_event is not None:
                    on_event(event)
        curve.append(experiment.agent_steps(state), learning_seconds, experiment.measure(state))
        if after_phase is not None:
            after_phase(state, curve, learning_seconds)
        if reporter is not None:
            reporter.update(progress(done=False))
    if reporter is not None:
        reporter.update(progress(done=True))
    return RunResult(state, curve, learning_seconds, phases, stopped)


# ---------------------------------------------------------------------------
# A whole training run: backend, experiment, loop, console, checkpoints, run file.


class UsageProblem(ValueError):
    """Bad user input, reported as one line with exit code 2."""


from popplay.checkpoints.lock import RunLock as _RunLock  # noqa: E402  (stdlib-only module)


@dataclass(frozen=True)
class CheckpointEvery:
    """How often to checkpoint: every ``amount`` seconds of wall time, or every
    ``amount`` units of the domain's progress (agent-time steps per trial, episodes)."""

    amount: float
    unit: str  # "seconds" or "progress"

    @classmethod
    def parse(cls, text: str) -> "CheckpointEvery":
        """``"30s"``, ``"5m"``, ``"2h"`` (wall time) or ``"100000"`` (progress units)."""
        raw = text.strip().lower()
        scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(raw[-1:]) if raw else None
        number = raw[:-1] if scale else raw
        try:
            amount = float(number)
        except ValueError:
            raise UsageProblem(f"--checkpoint-every: expected a count or a time such as 30s, 5m, 2h (got {text!r})") from None
        if not 0 < amount < float("inf"):
            raise UsageProblem(f"--checkpoint-every must be positive and finite (got {text!r})")
        if scale:
            return cls(amount * scale, "seconds")
        if amount != int(amount):
            raise UsageProblem(f"--checkpoint-every: a count must be a whole number (got {text!r})")
        return cls(amount, "progress")


@dataclass(frozen=True)
class TrainOptions:
    """How to run (as opposed to what to learn, which is the domain's parameters)."""

    backend: str = "auto"
    device: str = "auto"
    time_budget: float | None = None
    out: Any = None  # pathlib.Path
    overwrite: bool = False
    checkpoint_every: CheckpointEvery | None = None
    writer: bool = True  # False on ranks other than 0: they neither lock nor write the run file
    log_dir: Any = None  # pathlib.Path: CSV (and TensorBoard) scalar logs, see popplay.scalars


@dataclass
class TrainOutcome:
    summary: dict[str, Any]
    result: RunResult
    experiment: Any
    warnings: list[str]


class RunLock(_RunLock):
    """Refuses a second writer of the same run file (see :mod:`popplay.checkpoints.lock`)."""

    def __init__(self, path: Any) -> None:
        super().__init__(path, UsageProblem)


class RunWriter:
    """Writes the complete run (state, curves, results) into one file, atomically."""

    def __init__(self, out: Any, domain: str, params: Any, backend: Any, options: TrainOptions,
                 experiment: Any) -> None:
        self.out = out
        self.domain = domain
        self.config = {**params.to_dict(), "backend": backend.name, "device": backend.device,
                       "time_budget": options.time_budget}
        self.experiment = experiment
        self.events: list[str] = []
        self.enabled = bool(getattr(options, "writer", True))
        # Collected once, when the run starts: the command that made this file.
        from popplay import provenance

        self.provenance = provenance.collect(backend.device)

    def write(self, state: Any, curve: Curve, learning_seconds: float, *, complete: bool) -> None:
        from popplay.checkpoints import runfile

        # A sharded state that only rank 0 may write but every rank must assemble
        # (the cart-pole trial layout): every rank takes part up to here.
        if not self.enabled and not getattr(self.experiment, "collective_save", False):
            return
        arrays, results = self.experiment.state_arrays(state), self.experiment.results(state)
        if not self.enabled:
            return

        metrics = {name: values[-1] for name, values in curve.metrics.items()} if len(curve) else {}
        contents = dict(
            domain=self.domain, config=self.config,
            state=arrays, state_counters=_measured(self.experiment.state_counters(state)),
            static=self.experiment.static_arrays(),
            curves={"agent_steps": curve.agent_steps, "seconds": curve.seconds, **curve.metrics},
            results=results, result_attrs={**metrics, "events_json": self.events},
            attrs={"learning_seconds": learning_seconds, "phases": len(curve), **self.provenance},
            complete=complete,
        )
        try:
            runfile.write_run(self.out, **contents)
        except runfile.NoSpaceError as error:
            runfile.rescue(error, contents)  # keeps this state elsewhere if it can; always raises


def _measured(counters: dict[str, Any]) -> dict[str, Any]:
    """``counters`` without NaN values. A deep agent's ``last_loss`` is NaN until its first
    update, and readers take a missing one as NaN; a run file keeps finite numbers only
    (a NaN there is damage), so a run saved before its first update still resumes."""
    return {name: value for name, value in counters.items() if not (isinstance(value, float) and math.isnan(value))}


def curve_from_file(curves: dict[str, Any]) -> Curve:
    curve = Curve()
    curve.agent_steps = [int(x) for x in curves.get("agent_steps", [])]
    curve.seconds = [float(x) for x in curves.get("seconds", [])]
    curve.metrics = {name: [float(x) for x in values] for name, values in curves.items()
                     if name not in ("agent_steps", "seconds")}
    return curve


def train(domain: str, params: Any, options: TrainOptions, reporter: Reporter | None = None,
          should_stop: Callable[[], bool] | None = None, resume: Any = None,
          ranks: RankSync | None = None) -> TrainOutcome:
    """Run one experiment and write its run file; return the summary users see.

    ``resume`` is a :class:`popplay.checkpoints.runfile.RunFile` to continue (its
    state, curves and learning time), written back to ``options.out``. Without
    ``options.out`` nothing is written: the outcome holds the curves and final state.
    """
    import contextlib
    import time as _time
    from pathlib import Path

    from popplay.checkpoints import runfile
    from popplay.populations import registry
    from popplay.populations.base import BackendError, resolve_backend

    try:
        params.validate()
        backend = resolve_backend(options.backend, options.device)
    except (ValueError, BackendError) as error:
        raise UsageProblem(str(error)) from None
    if options.time_budget is not None and not options.time_budget > 0:
        raise UsageProblem(f"--time-budget must be positive (got {options.time_budget})")
    # No ``out``: learn in memory only (a notebook), nothing written.
    out = Path(options.out) if options.out is not None else None
    if out is None and (resume is not None or options.checkpoint_every is not None):
        raise UsageProblem("resuming and --checkpoint-every need a run file (out)")
    from popplay.validation import check_before_training

    try:  # everything a save needs, before any learning: settings, memory, the file
        check_before_training(domain, params, options, resume=resume is not None)
    except ValueError as error:
        raise UsageProblem(str(error)) from None
    log = None
    notes: list[str] = []  # for the user, not the run file
    if options.log_dir is not None and options.writer:
        from popplay.scalars import LogError, ScalarLog

        try:
            log = ScalarLog(Path(options.log_dir))
        except LogError as error:
            raise UsageProblem(str(error)) from None
        if log.warning:
            notes.append(f"--log-dir: wrote the CSV but no TensorBoard event files: {log.warning}")
    held = getattr(resume, "lock", None)  # --resume took it before reading the file
    with held if held is not None else RunLock(out) if out is not None and options.writer else contextlib.nullcontext():
        experiment = registry.build(domain, params, backend)
        if options.writer:  # once the settings proved buildable: a refusal stays one line
            _status(reporter, f"{'resuming' if resume is not None else 'training'} {domain} with {backend.name} "
                              f"on {backend.device}; " + (f"run file {out}" if out is not None else "no run file"))
        state, curve, learning_seconds = None, None, 0.0
        if resume is not None:
            try:
                state = experiment.restore(resume.state, resume.state_counters)
            except (KeyError, ValueError, TypeError) as error:
                raise UsageProblem(f"{out}: cannot resume from this run file ({error})") from None
            # The state now lives in the experiment (a rank's own trials, in a sharded
            # run): the file's whole arrays are not kept for the run's length.
            resume.state = {}
            curve = curve_from_file(resume.curves)
            learning_seconds = float(resume.attrs.get("learning_seconds", 0.0))
        writer = RunWriter(out, domain, params, backend, options, experiment)
        if resume is not None:
            writer.events = list(_json_list(resume.result_attrs.get("events_json")))
            # A resumed file keeps the command lines of the runs before this one.
            earlier = [str(c) for c in _json_list(resume.attrs.get("history_json"))]
            if resume.attrs.get("command_line"):
                earlier.append(str(resume.attrs["command_line"]))
            writer.provenance["history_json"] = json.dumps(earlier)
        every = options.checkpoint_every
        last = {"wall": _time.monotonic(), "mark": None}

        def on_event(event: str) -> None:
            writer.events.append(event)
            if reporter is not None and hasattr(reporter, "warn"):
                reporter.warn(event)

        def after_phase(state: Any, curve: Curve, seconds: float) -> None:
            if log is not None:
                log.update(curve.agent_steps, curve.seconds, curve.metrics)
            if every is None:
                return
            if every.unit == "seconds":
                due = _time.monotonic() - last["wall"] >= every.amount
                if ranks is not None:  # clocks differ: a save that gathers needs every rank
                    due = ranks.agree(due)
            else:
                mark = int(experiment.progress(state) // every.amount)
                due = last["mark"] is not None and mark > last["mark"]
                last["mark"] = mark if last["mark"] is None or due else last["mark"]
            if due:
                _status(reporter, f"saving checkpoint into {out}…")
                writer.write(state, curve, seconds, complete=False)
                last["wall"] = _time.monotonic()

        if every is not None and every.unit == "progress":
            last["mark"] = int(experiment.progress(state if state is not None else experiment.initial_state())
                               // every.amount)
        result = run(experiment, time_budget=options.time_budget, reporter=reporter, state=state, curve=curve,
                     learning_seconds=learning_seconds, should_stop=should_stop, after_phase=after_phase,
                     on_event=on_event, ranks=ranks)
        if out is not None:
            _status(reporter, f"saving run file {out}…")
            writer.write(result.state, result.curve, result.learning_seconds, complete=not result.stopped)
    if log is not None:
        log.close()
    metrics = {name: values[-1] for name, values in result.curve.metrics.items()}
    total_steps = experiment.total_agent_steps(result.state)
    seconds = result.learning_seconds
    summary: dict[str, Any] = {
        "domain": domain,
        **metrics,
        "agent_steps": total_steps,
        "agent_steps_per_trial": experiment.agent_steps(result.state),
        "seconds": seconds,
        "agent_steps_per_second": total_steps / seconds if seconds > 0 else 0.0,
        "phases": len(result.curve),
        "backend": backend.name,
        "device": backend.device,
        "complete": not result.stopped,
        "out": str(out) if out is not None else None,
    }
    return TrainOutcome(summary, result, experiment, writer.events + notes)


def _json_list(value: Any) -> list[Any]:
    import json

    if not value or value == "none":
        return []
    try:
        loaded = json.loads(value) if isinstance(value, str) else list(value)
    except ValueError:
        return []
    return loaded if isinstance(loaded, list) else []

"""The run loop: an experiment's timed learning phases, untimed measurements and the
learning curves, until the step budget, the time budget or a stop request.

It alternates timed learning phases (each ending with the domain's population
operators) and untimed measurements, records the learning curves against agent-time
steps and against learning time, and feeds the console.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from popplay.core.experiment import PER_TRIAL, Curve, Experiment, Progress, RankSync, Reporter


def status(reporter: Any, message: str) -> None:
    if reporter is not None and hasattr(reporter, "status"):
        reporter.status(message)


class CompileClock:
    """Seconds spent compiling while active (numba's kernels, and ``torch.compile``'s
    graphs where the torch engine compiles), so that learning time leaves them out (a
    cold cache compiles during the first phases too, not only in the warm-up, and a
    compiled torch engine builds its graphs at its first steps), and the first
    compilation announced once: it takes seconds to tens of seconds and the console
    must not look frozen."""

    def __init__(self, announce: Callable[[], None] | None = None, *, numba: bool = False,
                 torch_compile: bool = False) -> None:
        self.seconds = 0.0
        self._numba = numba  # listen even if numba is not imported yet (its kernels load lazily)
        self._torch_compile = torch_compile
        self._announce = announce
        self._depth = 0
        self._started = 0.0
        self._listener: Any = None
        self._torch_callbacks: tuple[Callable[..., None], Callable[..., None]] | None = None

    def _start(self) -> None:
        if self._depth == 0:
            if self._announce is not None:
                announce, self._announce = self._announce, None
                announce()
            self._started = time.perf_counter()
        self._depth += 1

    def _end(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> "CompileClock":
        if self._torch_compile:
            import torch._dynamo  # defers torch

            # dynamo calls these around each outermost compilation (tracing and the
            # backend's build), with arguments in some torch versions and none in others
            handler = torch._dynamo.callback_handler
            self._torch_callbacks = (handler.register_start_callback(lambda *_: self._start()),
                                     handler.register_end_callback(lambda *_: self._end()))
        if "numba" not in sys.modules and not self._numba:  # nothing of numba's to compile
            return self
        from numba.core import event  # defers numba

        clock = self

        class _Listener(event.Listener):
            def on_start(self, ev: Any) -> None:
                clock._start()

            def on_end(self, ev: Any) -> None:
                clock._end()

        self._listener = _Listener()
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._torch_callbacks is not None:
            import torch._dynamo  # defers torch

            start, end = self._torch_callbacks
            torch._dynamo.callback_handler.remove_start_callback(start)
            torch._dynamo.callback_handler.remove_end_callback(end)
            self._torch_callbacks = None
        if self._listener is not None:
            from numba.core import event  # defers numba

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
    backend = getattr(experiment, "backend", None)
    uses_numba = getattr(backend, "name", None) == "numba"
    torch_compile = getattr(backend, "name", None) == "torch" and bool(getattr(backend, "compile", False))
    message = ("compiling the torch engine (torch.compile: seconds on a GPU, tens of seconds on a CPU)…"
               if torch_compile else "compiling kernels (first run only)…")
    announce = lambda: status(reporter, message)  # noqa: E731
    with CompileClock(announce, numba=uses_numba, torch_compile=torch_compile) as compiling:
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
    session_started, learned_before, compiled_before = time.perf_counter(), learning_seconds, compiling.seconds

    def progress(done: bool) -> Progress:
        steps = experiment.total_agent_steps(state)
        learned = learning_seconds - learned_before
        wall = time.perf_counter() - session_started - (compiling.seconds - compiled_before)
        return Progress(
            domain=experiment.domain, phase=len(curve), agent_steps=experiment.agent_steps(state),
            budget_agent_steps=None if time_mode or unit != PER_TRIAL else experiment.budget_agent_steps(),
            learning_seconds=learning_seconds, time_budget=time_budget,
            agent_steps_per_second=steps / learning_seconds if learning_seconds > 0 else 0.0,
            metrics={name: values[-1] for name, values in curve.metrics.items()}, done=done,
            total_agent_steps=steps, unit=unit, done_units=experiment.progress(state),
            budget_units=None if time_mode else budget_units(),
            step_name=getattr(experiment, "step_name", "agent-steps"),
            wall_per_learning=wall / learned if learned > 0 else 1.0,
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

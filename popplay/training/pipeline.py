"""``train()``: one experiment from parameters to run file, for every domain.

Validation, the run-file lock, checkpoints, scalar logs, resume and the summary users
see; the phases themselves are :func:`popplay.training.loop.run`'s.
"""
from __future__ import annotations

import contextlib
import json
import math
import time as _time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from popplay.checkpoints import provenance, runfile
from popplay.checkpoints.lock import RunLock as _RunLock
from popplay.checkpoints.scalars import open_log
from popplay.checkpoints.validation import check_before_training
from popplay.core import registry
from popplay.core.errors import UsageError
from popplay.core.experiment import Curve, RankSync, Reporter
from popplay.core.options import budget_fields, option_name, user_message
from popplay.core.registry import DEEP
from popplay.training.loop import RunResult, run, status


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
            raise UsageError(f"--checkpoint-every: expected a count or a time such as 30s, 5m, 2h (got {text!r})") from None
        if not 0 < amount < float("inf"):
            raise UsageError(f"--checkpoint-every must be positive and finite (got {text!r})")
        if scale:
            return cls(amount * scale, "seconds")
        if amount != int(amount):
            raise UsageError(f"--checkpoint-every: a count must be a whole number (got {text!r})")
        return cls(amount, "progress")


@dataclass(frozen=True)
class TrainOptions:
    """How to run (as opposed to what to learn, which is the domain's parameters)."""

    backend: str = "auto"
    device: str = "auto"
    compile: bool | None = None  # the torch engines' steps through torch.compile; None: on CUDA only
    time_budget: float | None = None
    out: Any = None  # pathlib.Path
    overwrite: bool = False
    checkpoint_every: CheckpointEvery | None = None
    writer: bool = True  # False on ranks other than 0: they neither lock nor write the run file
    log_dir: Any = None  # pathlib.Path: CSV (and TensorBoard) scalar logs, see popplay.checkpoints.scalars


@dataclass
class TrainOutcome:
    summary: dict[str, Any]
    result: RunResult
    experiment: Any
    warnings: list[str]


class RunLock(_RunLock):
    """Refuses a second writer of the same run file (see :mod:`popplay.checkpoints.lock`)."""

    def __init__(self, path: Any) -> None:
        super().__init__(path, UsageError)


class RunWriter:
    """Writes the complete run (state, curves, results) into one file, atomically."""

    def __init__(self, out: Any, domain: str, params: Any, backend: Any, options: TrainOptions,
                 experiment: Any) -> None:
        self.out = out
        self.domain = domain
        self.config = {**params.to_dict(), "backend": backend.name, "device": backend.device,
                       "compile": backend.compile, "time_budget": options.time_budget}
        self.experiment = experiment
        self.events: list[str] = []
        self.enabled = bool(getattr(options, "writer", True))
        # Collected once, when the run starts: the command that made this file.

        self.provenance = provenance.collect(backend.device)

    def write(self, state: Any, curve: Curve, learning_seconds: float, *, complete: bool) -> None:
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
            state=arrays, state_counters=_measured({**self.experiment.state_counters(state), **_diverged(self.experiment)}),
            static=self.experiment.static_arrays(),
            curves={"agent_steps": curve.agent_steps, "seconds": curve.seconds, **curve.metrics},
            results=results, result_attrs={**metrics, "events_json": self.events},
            # config_settings: every setting this version has, so a reader refuses a file
            # that lacks one of them instead of filling it in with a default, and still
            # defaults a setting added after the file was written (config_complete stays
            # for readers that predate the list)
            attrs={"learning_seconds": learning_seconds, "phases": len(curve), "config_complete": True,
                   "config_settings": json.dumps(sorted(self.config)), **self.provenance},
            complete=complete,
        )
        try:
            runfile.write_run(self.out, **contents)
        except runfile.NoSpaceError as error:
            runfile.rescue(error, contents)  # keeps this state elsewhere if it can; always raises


def _diverged(experiment: Any) -> dict[str, Any]:
    """The phase where a deep agent diverged, as a counter (a resume refuses such a run)."""
    phase = getattr(experiment, "diverged_phase", None)
    return {} if phase is None else {"diverged_phase": int(phase)}


def _measured(counters: dict[str, Any]) -> dict[str, Any]:
    """``counters`` without non-finite values. A deep agent's ``last_loss`` is NaN until
    its first update, and readers take a missing one as NaN; a run file keeps finite
    numbers only (a NaN there is damage), so a run saved before its first update still
    resumes, and a diverged run (an infinite loss, flagged by its event) can be read."""
    return {name: value for name, value in counters.items() if not (isinstance(value, float) and not math.isfinite(value))}


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


    spec = registry.get(domain)
    try:
        params.validate()
    except ValueError as error:
        raise UsageError(user_message(type(params), str(error))) from None
    backend = spec.backend(options.backend, options.device, compile=options.compile)
    if options.time_budget is not None and not options.time_budget > 0:
        raise UsageError(f"--time-budget must be positive (got {options.time_budget})")
    budgets = budget_fields(type(params))
    if budgets and options.time_budget is None and not any(getattr(params, name) for name in budgets):
        raise UsageError(" or ".join(option_name(type(params), name) for name in budgets)
                         + " must be positive (a budget is needed), or give --time-budget")
    # No ``out``: learn in memory only (a notebook), nothing written.
    out = Path(options.out) if options.out is not None else None
    if out is None and (resume is not None or options.checkpoint_every is not None):
        raise UsageError("resuming and --checkpoint-every need a run file (out)")

    try:  # everything a save needs, before any learning: settings, memory, the file
        check_before_training(domain, params, options, resume=resume is not None)
    except ValueError as error:
        raise UsageError(str(error)) from None
    log = None
    notes: list[str] = []  # for the user, not the run file
    if options.log_dir is not None and options.writer:
        log = open_log(options.log_dir, notes)
    held = getattr(resume, "lock", None)  # --resume took it before reading the file
    with held if held is not None else RunLock(out) if out is not None and options.writer else contextlib.nullcontext():
        experiment = spec.build(params, backend)
        if options.writer:  # once the settings proved buildable: a refusal stays one line
            status(reporter, f"{'resuming' if resume is not None else 'training'} {domain} with {backend.name} "
                              f"on {backend.device}; " + (f"run file {out}" if out is not None else "no run file"))
        state, curve, learning_seconds = None, None, 0.0
        if resume is not None:
            if "diverged_phase" in resume.state_counters:
                raise UsageError(f"{out}: this run diverged at phase {resume.state_counters['diverged_phase']} "
                                 "(its events say how); start a new one, with a smaller learning rate")
            try:
                state = experiment.restore(resume.state, resume.state_counters)
            except (KeyError, ValueError, TypeError) as error:
                raise UsageError(f"{out}: cannot resume from this run file ({error})") from None
            if spec.kind == DEEP and options.time_budget is None and experiment.finished(state, time_mode=False):
                raise UsageError(f"{out}: the run has already reached this budget "
                                 f"({experiment.progress(state):,} {experiment.progress_unit}); give a larger one")
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
            # The event that stops a run (every agent diverged) is the summary's
            # "diverged", which the command prints as its error: said once, not twice.
            if reporter is not None and hasattr(reporter, "warn") and event != getattr(experiment, "diverged", None):
                reporter.warn(event)

        def after_phase(state: Any, curve: Curve, seconds: float) -> None:
            stopped = log.follow(curve.agent_steps, curve.seconds, curve.metrics) if log is not None else None
            if stopped is not None:  # the run file goes on
                on_event(stopped)
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
                status(reporter, f"saving checkpoint into {out}…")
                writer.write(state, curve, seconds, complete=False)
                last["wall"] = _time.monotonic()

        if every is not None and every.unit == "progress":
            last["mark"] = int(experiment.progress(state if state is not None else experiment.initial_state())
                               // every.amount)
        result = run(experiment, time_budget=options.time_budget, reporter=reporter, state=state, curve=curve,
                     learning_seconds=learning_seconds, should_stop=should_stop, after_phase=after_phase,
                     on_event=on_event, ranks=ranks)
        if out is not None:
            status(reporter, f"saving run file {out}…")
            writer.write(result.state, result.curve, result.learning_seconds, complete=not result.stopped)
        close = getattr(experiment, "close", None)
        if close is not None:  # a topology's other ranks wait for word from this one
            close(result.state)
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
        "compile": backend.compile,
        "complete": not result.stopped,
        "out": str(out) if out is not None else None,
    }
    fields = getattr(experiment, "summary_fields", None)
    if fields is not None and options.writer:  # what this domain reports beside its curves
        summary.update(fields(result.state, seconds))
    return TrainOutcome(summary, result, experiment, writer.events + notes)


def _json_list(value: Any) -> list[Any]:
    if not value or value == "none":
        return []
    try:
        loaded = json.loads(value) if isinstance(value, str) else list(value)
    except ValueError:
        return []
    return loaded if isinstance(loaded, list) else []


"""Scalar logs beside the run file: a CSV of the curves and, when the optional
``tensorboard`` package is installed, TensorBoard event files (``--log-dir``, and
``popplay export RUN.h5 --csv`` for existing runs).

The CSV has one row per curve point: ``agent_steps`` (agent-time steps per trial, or
agent turns for knights), ``seconds`` (learning time) and one column per metric. The
event files hold the same scalars (tag = metric name, step = ``agent_steps``), written
with TensorBoard's own writer: no torch import.
"""
from __future__ import annotations

import csv
import math
import time
from pathlib import Path
from typing import Any, Sequence

from popplay.checkpoints.h5io import atomic_output, check_replaceable
from popplay.core.errors import UsageError

TENSORBOARD_HINT = 'pip install "popplay[tensorboard]"'
CSV_NAME = "curves.csv"


class LogError(Exception):
    """A log directory or file that cannot be written; one line for users."""


def tensorboard_missing() -> str | None:
    """None when TensorBoard event files can be written here, else why (with the fix)."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2  # defers tensorboard  # noqa: F401
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # defers tensorboard  # noqa: F401
    except ImportError:
        return f"the tensorboard package is not installed; install the extra: {TENSORBOARD_HINT}"
    return None


def write_csv(path: Path, agent_steps: Sequence[int], seconds: Sequence[float],
              metrics: dict[str, Sequence[float]], option: str = "--out") -> Path:
    """The curves as one CSV (written whole; a row per point), by the rule every file
    popplay writes follows: only a text file (or nothing) at ``path`` is replaced, never
    a run file, a device, a FIFO or a directory, whatever a symlink points at; written to
    a temporary file and renamed, so a crash leaves the previous CSV whole."""
    path = Path(path)
    names = list(metrics)
    check_replaceable(path, LogError, kind="text", option=option)
    try:
        with atomic_output(path) as temporary, open(temporary, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["agent_steps", "seconds", *names])
            for i in range(len(agent_steps)):
                writer.writerow([int(agent_steps[i]), _number(seconds[i]) if i < len(seconds) else "",
                                 *(_number(metrics[name][i]) for name in names)])
    except OSError as error:
        raise LogError(f"{option} {path}: cannot write ({error.strerror or error})") from None
    return path


def _number(value: Any) -> str:
    value = float(value)
    return "" if math.isnan(value) else repr(value)


class ScalarLog:
    """The live log of a training run in ``directory``: the CSV rewritten at every
    point (a few KB: always complete, even after a crash) and, when TensorBoard is
    installed, one scalar event per metric and point.

    A resumed run logs its earlier points again, so the directory describes the whole
    run. ``tensorboard`` is None when the package is missing (``warning`` says so).
    """

    def __init__(self, directory: Path, *, tensorboard: bool = True) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise LogError(f"--log-dir {self.directory}: cannot create ({error.strerror or error})") from None
        if not self.directory.is_dir():
            raise LogError(f"--log-dir {self.directory}: not a directory")
        self.csv_path = self.directory / CSV_NAME
        check_replaceable(self.csv_path, LogError, kind="text", option="--log-dir")  # before any learning
        self.warning = tensorboard_missing() if tensorboard else None
        self._events: Any = None
        if tensorboard and self.warning is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter  # defers tensorboard

            self._events = EventFileWriter(str(self.directory))
        self._logged = 0
        self._stopped = False

    def update(self, agent_steps: Sequence[int], seconds: Sequence[float], metrics: dict[str, Sequence[float]]
               ) -> None:
        """Log every point not logged yet (the whole curve so far is passed)."""
        write_csv(self.csv_path, agent_steps, seconds, metrics, option="--log-dir")
        if self._events is not None:

            from tensorboard.compat.proto import event_pb2, summary_pb2  # defers tensorboard

            for i in range(self._logged, len(agent_steps)):
                values = [summary_pb2.Summary.Value(tag=name, simple_value=float(series[i]))
                          for name, series in metrics.items()]
                values.append(summary_pb2.Summary.Value(tag="seconds", simple_value=float(seconds[i])))
                self._events.add_event(event_pb2.Event(wall_time=time.time(), step=int(agent_steps[i]),
                                                       summary=summary_pb2.Summary(value=values)))
            self._events.flush()
        self._logged = len(agent_steps)

    def follow(self, agent_steps: Sequence[int], seconds: Sequence[float], metrics: dict[str, Sequence[float]]
               ) -> str | None:
        """:meth:`update` during a run: a log that goes bad mid-run stops logging, not the
        run. Returns what to tell the user, once, when it stops (None otherwise)."""
        if self._stopped:
            return None
        try:
            self.update(agent_steps, seconds, metrics)
        except LogError as error:
            self._stopped = True
            return f"--log-dir: stopped logging ({error})"
        return None

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None


def open_log(directory: Path, notes: list[str]) -> ScalarLog:
    """The :class:`ScalarLog` of ``--log-dir``: a one-line usage error where it cannot
    be written, and a note for the user where TensorBoard is missing."""
    try:
        log = ScalarLog(Path(directory))
    except LogError as error:
        raise UsageError(str(error)) from None
    if log.warning:
        notes.append(f"--log-dir: wrote the CSV but no TensorBoard event files: {log.warning}")
    return log

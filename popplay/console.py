"""The live console: a pure :func:`render` and two reporters that show it.

``render(progress)`` turns a :class:`popplay.core.experiment.Progress` into a rich renderable
and does nothing else, so it is tested directly. :class:`LiveReporter` redraws it in
place on a terminal; :class:`PlainReporter` prints one plain line now and then for
logs and pipes (no escape codes). Both write to stderr: stdout belongs to results
and ``--json``.
"""
from __future__ import annotations

import sys
import time
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from popplay.core.experiment import PER_TRIAL, Progress


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:4.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_rate(rate: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.1f}{suffix}"
    return f"{rate:.0f}"


def format_metric(value: float) -> str:
    """Whole numbers as whole numbers (an episode stays ``20``, not ``100.0`` later),
    others to four significant digits, large ones with thousands separators."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.4g}" if abs(value) < 100 else f"{value:,.1f}"


def _budget_row(progress: Progress) -> tuple[str, str]:
    """The budget in its own unit: agent-time steps per trial, or episodes."""
    done = progress.done_units if progress.done_units is not None else progress.agent_steps
    budget = progress.budget_units if progress.budget_units is not None else progress.budget_agent_steps
    return progress.unit, f"{done:,}" + (f" / {budget:,}" if budget else "")


def _per_trial(progress: Progress) -> bool:
    return progress.unit == PER_TRIAL


def render(progress: Progress) -> RenderableType:
    """The console panel for one progress snapshot (pure: no I/O, no clock)."""
    bar = ProgressBar(total=1.0, completed=progress.fraction, width=40)
    head = Text.assemble(
        (f"{progress.domain} ", "bold"),
        (f"{100 * progress.fraction:5.1f}% ", "cyan"),
    )
    line = Table.grid(padding=(0, 1))
    line.add_row(head, bar, Text(f"ETA {format_seconds(progress.eta_seconds)}"))
    stats = Table.grid(padding=(0, 2))
    stats.add_column(style="dim")
    stats.add_column()
    for name, value in progress.metrics.items():
        stats.add_row(name, format_metric(value))
    stats.add_row(*_budget_row(progress))
    if _per_trial(progress):
        stats.add_row("shares", str(progress.phase))
    if progress.total_agent_steps is not None and progress.unit != progress.step_name:  # else the row above
        stats.add_row("agent-steps, all trials" if _per_trial(progress) else progress.step_name,
                      f"{progress.total_agent_steps:,}")
    stats.add_row(f"{progress.step_name}/s", format_rate(progress.agent_steps_per_second))
    stats.add_row("learning time", format_seconds(progress.learning_seconds) + (
        f" / {format_seconds(progress.time_budget)}" if progress.time_budget else ""))
    return Group(line, stats)


PLAIN_WIDTH = 120


def plain_line(progress: Progress, width: int = PLAIN_WIDTH) -> str:
    """One log line for non-terminal output, at most ``width`` characters: metrics
    that do not fit are left out (the run file and the summary hold them all)."""
    unit, budget = _budget_row(progress)
    unit = "steps/trial" if _per_trial(progress) else unit
    head = f"{progress.domain} {100 * progress.fraction:5.1f}% {unit} {budget.replace(' / ', '/')}"
    tail = (f"{format_rate(progress.agent_steps_per_second)} {progress.step_name}/s "
            f"learning {format_seconds(progress.learning_seconds).strip()} "
            f"eta {format_seconds(progress.eta_seconds).strip()}")
    room = width - len(head) - len(tail) - 2
    metrics: list[str] = []
    for name, value in progress.metrics.items():
        item = f"{name}={format_metric(value)}"
        if sum(len(m) + 1 for m in metrics) + len(item) > room:
            break
        metrics.append(item)
    return " ".join([head, *metrics, tail])


class LiveReporter:
    """Redraws :func:`render` in place (a terminal), at most ``fps`` times a second."""

    def __init__(self, stream: IO[str] | None = None, fps: float = 8.0) -> None:
        self._console = Console(file=stream or sys.stderr)
        self._live = Live(console=self._console, auto_refresh=False, transient=False)
        self._interval = 1.0 / fps
        self._last = 0.0
        self._started = False

    def status(self, message: str) -> None:
        """A line above the live panel (or before it appears)."""
        self._console.print(Text(message, style="dim"))

    def update(self, progress: Progress) -> None:
        now = time.monotonic()
        if not progress.done and now - self._last < self._interval:
            return
        self._last = now
        if not self._started:
            self._live.start()
            self._started = True
        self._live.update(render(progress), refresh=True)
        if progress.done:
            self.close()

    def close(self) -> None:
        if self._started:
            self._live.stop()
            self._started = False


class PlainReporter:
    """Prints :func:`plain_line` every ``interval`` seconds and at the end (once: the
    last phase's line is not repeated when the budget ends on it)."""

    def __init__(self, stream: IO[str] | None = None, interval: float = 2.0) -> None:
        self._stream = stream or sys.stderr
        self._interval = interval
        self._last = float("-inf")
        self._printed: tuple[int, float] | None = None

    def status(self, message: str) -> None:
        print(message, file=self._stream, flush=True)

    def update(self, progress: Progress) -> None:
        now = time.monotonic()
        key = (progress.phase, progress.learning_seconds)
        if progress.done and key == self._printed:
            return
        if progress.done or now - self._last >= self._interval:
            self._last = now
            self._printed = key
            print(plain_line(progress), file=self._stream, flush=True)

    def close(self) -> None:
        pass


class SilentReporter:
    def status(self, message: str) -> None:
        pass

    def update(self, progress: Progress) -> None:
        pass

    def close(self) -> None:
        pass


def reporter_for(stream: IO[str], *, quiet: bool = False) -> LiveReporter | PlainReporter | SilentReporter:
    """Live on a terminal, plain lines otherwise, nothing when ``quiet``."""
    if quiet:
        return SilentReporter()
    if stream.isatty():
        return LiveReporter(stream)
    return PlainReporter(stream)

"""The live console: a pure :func:`render` and two reporters that show it.

``render(progress)`` turns a :class:`popplay.runner.Progress` into a rich renderable
and does nothing else, so it is tested directly. :class:`LiveReporter` redraws it in
place on a terminal; :class:`PlainReporter` prints one plain line now and then for
logs and pipes (no escape codes).
"""
from __future__ import annotations

import sys
import time
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from popplay.runner import Progress


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
    return f"{value:.4g}" if abs(value) < 100 else f"{value:,.1f}"


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
    stats.add_row("agent-steps/s", format_rate(progress.agent_steps_per_second))
    stats.add_row("shares" if progress.domain != "knights" else "episodes", str(progress.phase))
    stats.add_row("agent-steps", f"{progress.agent_steps:,}" + (
        f" / {progress.budget_agent_steps:,}" if progress.budget_agent_steps else ""))
    stats.add_row("learning time", format_seconds(progress.learning_seconds) + (
        f" / {format_seconds(progress.time_budget)}" if progress.time_budget else ""))
    return Group(line, stats)


def plain_line(progress: Progress) -> str:
    """One log line for non-terminal output."""
    metrics = " ".join(f"{name}={format_metric(value)}" for name, value in progress.metrics.items())
    return (
        f"{progress.domain} {100 * progress.fraction:5.1f}% phase {progress.phase} "
        f"agent-steps {progress.agent_steps:,} {metrics} "
        f"{format_rate(progress.agent_steps_per_second)} agent-steps/s "
        f"learning {format_seconds(progress.learning_seconds)} eta {format_seconds(progress.eta_seconds)}"
    )


class LiveReporter:
    """Redraws :func:`render` in place (a terminal), at most ``fps`` times a second."""

    def __init__(self, stream: IO[str] | None = None, fps: float = 8.0) -> None:
        from rich.live import Live

        self._console = Console(file=stream or sys.stdout)
        self._live = Live(console=self._console, auto_refresh=False, transient=False)
        self._interval = 1.0 / fps
        self._last = 0.0
        self._started = False

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
    """Prints :func:`plain_line` every ``interval`` seconds and at the end."""

    def __init__(self, stream: IO[str] | None = None, interval: float = 2.0) -> None:
        self._stream = stream or sys.stdout
        self._interval = interval
        self._last = float("-inf")

    def update(self, progress: Progress) -> None:
        now = time.monotonic()
        if progress.done or now - self._last >= self._interval:
            self._last = now
            print(plain_line(progress), file=self._stream, flush=True)

    def close(self) -> None:
        pass


class SilentReporter:
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

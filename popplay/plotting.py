"""PNG plots of run files and of reproduced figures (matplotlib, the ``plot`` extra).

matplotlib is optional: :func:`missing_matplotlib` says whether it can be used, and
every drawing function raises :class:`PlotUnavailable` (one line, with the install
command) when it cannot. Figures are drawn on ``matplotlib.figure.Figure`` objects
with the Agg canvas, never through pyplot, so no display or global state is involved.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

INSTALL_HINT = 'pip install "popplay[plot]"'
_DPI = 100  # keeps a figure's PNG around 50-100 KB


class PlotUnavailable(RuntimeError):
    """matplotlib is missing; the message is one line with the install command."""


class PlotInputError(ValueError):
    """A file that cannot be plotted; the message is one line for users."""


def missing_matplotlib() -> str | None:
    """None when matplotlib can draw PNGs here, else a one-line reason with the fix."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        return f"matplotlib is not installed; install the plot extra: {INSTALL_HINT}"
    return None


def new_figure(width: float = 8.0, height: float = 5.0) -> Any:
    """A matplotlib Figure on the Agg canvas (raises :class:`PlotUnavailable`)."""
    problem = missing_matplotlib()
    if problem:
        raise PlotUnavailable(problem)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` as PNG atomically (no half-written image under the name)."""
    from popplay.checkpoints.h5io import atomic_output

    with atomic_output(Path(path)) as tmp_name:
        fig.savefig(tmp_name, format="png", dpi=_DPI)
    return Path(path)


def draw_figure(figure: Any, data: Any, path: Path) -> Path:
    """Draw a reproduced figure (a :class:`popplay.reproduce.Figure` and its data)."""
    fig = new_figure()
    figure.draw(data, fig)
    return save_png(fig, path)


# ---------------------------------------------------------------------------
# Run files of any domain


def plot_run(run: Any, path: Path) -> Path:
    """Every ``/curves/<metric>`` of a run file (a :class:`popplay.checkpoints.runfile.RunFile`)
    against agent-time steps and against learning seconds, one row per metric."""
    curves = run.curves
    if "agent_steps" not in curves or np.asarray(curves["agent_steps"]).size == 0:
        raise PlotInputError(f"{run.path}: the run file holds no learning-curve points to plot")
    steps = np.asarray(curves["agent_steps"], dtype=np.float64).ravel()
    seconds = np.asarray(curves["seconds"], dtype=np.float64).ravel() if "seconds" in curves else None
    metrics = {name: np.asarray(values, dtype=np.float64).ravel() for name, values in curves.items()
               if name not in ("agent_steps", "seconds")}
    if not metrics:
        raise PlotInputError(f"{run.path}: the run file has no metric under /curves to plot")
    for name, values in metrics.items():
        if values.shape != steps.shape or (seconds is not None and seconds.shape != steps.shape):
            raise PlotInputError(f"{run.path}: /curves/{name} does not match /curves/agent_steps in length")
    axes_x = [("agent-time steps", steps)]
    if seconds is not None:
        axes_x.append(("learning time (s)", seconds))
    rows = len(metrics)
    fig = new_figure(5.0 * len(axes_x) + 1.0, 2.6 * rows + 1.0)
    marker = "o" if len(steps) <= 60 else None
    for row, (name, values) in enumerate(metrics.items()):
        for col, (xlabel, x) in enumerate(axes_x):
            ax = fig.add_subplot(rows, len(axes_x), row * len(axes_x) + col + 1)
            finite = np.isfinite(values) & np.isfinite(x)
            if finite.any():
                ax.plot(x, values, marker=marker, markersize=3, linewidth=1.3)
            else:
                ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(name)
            ax.grid(True, alpha=0.3)
    fig.suptitle(_run_title(run), fontsize=10)
    return save_png(fig, path)


def _run_title(run: Any) -> str:
    config = run.config or {}
    shown = [f"{key} {config[key]}" for key in ("agents", "trials", "arms", "games_per_agent", "share_every")
             if key in config]
    if config.get("differentiation") not in (None, "none"):
        shown.append(f"differentiation {config['differentiation']}")
    where = " on ".join(str(config[k]) for k in ("backend", "device") if config.get(k))
    head = f"{Path(run.path).name}: {run.domain} run" + ("" if run.complete else " (stopped early)")
    return f"{head}\n{', '.join(shown)}" + (f" ({where})" if where else "")


# ---------------------------------------------------------------------------
# `popplay plot FILE`: run files and figure data files


@dataclass
class PlotResult:
    kind: str  # "run" or "figure"
    source: Path
    png: Path
    domain: str
    name: str  # the figure's name, or the run's domain


def default_png(path: Path) -> Path:
    return Path(path).with_suffix(".png")


def plot_file(path: Path, out: Path | None = None) -> PlotResult:
    """Draw a run file's curves, or redraw a figure data file written by ``popplay
    reproduce``. Raises :class:`PlotInputError` or :class:`PlotUnavailable`."""
    from popplay.checkpoints import runfile
    from popplay.reproduce import data as figure_data

    path = Path(path)
    png = Path(out) if out is not None else default_png(path)
    if png.exists() and png.is_dir():
        raise PlotInputError(f"--out {png}: is a directory")
    if png.resolve() == path.resolve():
        raise PlotInputError(f"--out {png}: would overwrite the file being plotted")
    directory = png.parent if str(png.parent) else Path(".")
    if not directory.is_dir():
        raise PlotInputError(f"--out {png}: directory {directory} does not exist")
    try:
        kind = figure_data.file_format(path)
    except figure_data.FigureFileError as error:
        raise PlotInputError(str(error)) from None
    if kind == figure_data.FORMAT:
        try:
            data = figure_data.read_figure(path)
        except figure_data.FigureFileError as error:
            raise PlotInputError(str(error)) from None
        _check_writable(png)
        from popplay.reproduce.driver import draw_data
        from popplay.runner import UsageProblem

        try:
            draw_data(data, png)
        except UsageProblem as error:
            raise PlotInputError(f"{path}: {error}") from None
        return PlotResult("figure", path, png, data.domain, data.figure)
    try:
        run = runfile.read_run(path)
    except runfile.RunFileError as error:
        raise PlotInputError(str(error)) from None
    _check_writable(png)
    plot_run(run, png)
    return PlotResult("run", path, png, run.domain, run.domain)


def _check_writable(png: Path) -> None:
    from popplay.checkpoints.h5io import check_replaceable, probe_directory

    check_replaceable(png, PlotInputError, kind="png")  # never a run file, a device or a directory

    directory = png.parent if str(png.parent) else Path(".")
    problem = probe_directory(directory)
    if problem:
        raise PlotInputError(f"--out {png}: cannot write in {directory} ({problem})")


__all__ = ["INSTALL_HINT", "PlotInputError", "PlotResult", "PlotUnavailable", "draw_figure", "missing_matplotlib",
           "new_figure", "plot_file", "plot_run", "save_png"]

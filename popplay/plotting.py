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

from popplay.checkpoints.h5io import atomic_output, check_replaceable, make_parent, probe_directory
from popplay.checkpoints.runfile import RunFileError, display_name
from popplay.checkpoints.validation import load_run
from popplay.core import registry

INSTALL_HINT = 'pip install "popplay[plot]"'
_DPI = 100  # keeps a figure's PNG around 50-100 KB


class PlotUnavailable(RuntimeError):
    """matplotlib is missing; the message is one line with the install command."""


class PlotInputError(ValueError):
    """A file that cannot be plotted; the message is one line for users."""


def missing_matplotlib() -> str | None:
    """None when matplotlib can draw PNGs here, else a one-line reason with the fix."""
    try:
        import matplotlib  # defers matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # defers matplotlib  # noqa: F401
        from matplotlib.figure import Figure  # defers matplotlib  # noqa: F401
    except ImportError:
        return f"matplotlib is not installed; install the plot extra: {INSTALL_HINT}"
    return None


def new_figure(width: float = 8.0, height: float = 5.0) -> Any:
    """A matplotlib Figure on the Agg canvas (raises :class:`PlotUnavailable`)."""
    problem = missing_matplotlib()
    if problem:
        raise PlotUnavailable(problem)
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # defers matplotlib
    from matplotlib.figure import Figure  # defers matplotlib

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` as PNG atomically (no half-written image under the name)."""
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


_STATS = ("best", "mean", "worst")
_STYLE = {"best": "--", "mean": "-", "worst": ":"}
_RANGE = ("min", "mean", "max")  # a spread over agents (a deep population's hyper-parameters)
_RANGE_STYLE = {"min": ":", "mean": "-", "max": "--"}
_HIDDEN = ("eval_episode",)  # bookkeeping (which evaluation a point repeats), not a curve
#: The panel that holds every opponent's best/mean/worst curves together, for domains
#: whose spec labels it (knights: every benchmark opponent on one axis, all scores).
QUALITY_AGAINST = "quality against"


class _Missing(dict):
    """``str.format_map`` values from a run's config, ``?`` for what it lacks."""

    def __missing__(self, key: str) -> str:
        return "?"


def _units(domain: str, name: str, config: dict[str, Any]) -> str:
    """The y-axis label of a panel: what the numbers are, in their units (the domain's
    own label where its spec gives one)."""
    label = registry.get(domain).plot_units.get(name) if registry.known(domain) else None
    if label is not None:
        return label.format_map(_Missing(config))
    if name.endswith("_mean") and name[:-5] in ("alpha", "lam", "epsilon"):
        return {"alpha": "mean α", "lam": "mean λ", "epsilon": "mean ε"}[name[:-5]]
    return name


def _panels(domain: str, metrics: dict[str, np.ndarray]) -> list[tuple[str, list[tuple[str, str, str | None]]]]:
    """Group curves into panels of one unit: [(panel, [(curve, label, linestyle)])].

    ``<prefix>_best/_mean/_worst`` curves of the same prefix share a panel (knights:
    every benchmark opponent on one axis, since all are scores); a ``<name>_se`` curve
    is drawn as the band of ``<name>``, never as a curve of its own."""
    used: set[str] = set()
    panels: list[tuple[str, list[tuple[str, str, str | None]]]] = []
    opponents = [name[:-len("_best")] for name in metrics if name.endswith("_best")
                 and all(f"{name[:-5]}_{s}" in metrics for s in _STATS)]
    quality_opponents = [o for o in opponents if o != "score"]
    if quality_opponents and registry.known(domain) and QUALITY_AGAINST in registry.get(domain).plot_units:
        panels.append((QUALITY_AGAINST, [(f"{o}_{s}", f"{s} agent vs {o}", _STYLE[s])
                                           for o in quality_opponents for s in _STATS]))
        used.update(f"{o}_{s}" for o in quality_opponents for s in _STATS)
        used.add("quality")  # the mean against the strongest opponent: already drawn
    else:
        for o in quality_opponents:
            panels.append((o, [(f"{o}_{s}", f"{s}", _STYLE[s]) for s in _STATS]))
            used.update(f"{o}_{s}" for s in _STATS)
    score = [name for name in ("score_best", "score_mean", "score_worst") if name in metrics]
    if score:
        panels.append(("score", [(n, f"{n[6:]} agent", _STYLE[n[6:]]) for n in score]))
        used.update(score)
    spreads = [name[:-len("_min")] for name in metrics if name.endswith("_min")
               and all(f"{name[:-4]}_{s}" in metrics for s in _RANGE)]
    for prefix in spreads:
        panels.append((prefix, [(f"{prefix}_{s}", s, _RANGE_STYLE[s]) for s in _RANGE]))
        used.update(f"{prefix}_{s}" for s in _RANGE)
    for name in metrics:
        if name in used or name in _HIDDEN or (name.endswith("_se") and name[:-3] in metrics):
            continue
        panels.append((name, [(name, name, "-")]))
    return panels


def _member_returns(state: dict[str, Any], window: int = 10) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each member's training returns, a running mean over ``window`` episodes, against
    the population's env-steps (a deep population's run file; none otherwise)."""
    needed = ("episode_member", "episode_returns", "episode_env_steps")
    if not all(name in state for name in needed):
        return []
    member, returns, steps = (np.asarray(state[name]).ravel() for name in needed)
    if not member.size or not member.shape == returns.shape == steps.shape:
        return []
    out = []
    for k in np.unique(member):
        mine = member == k
        values = returns[mine].astype(np.float64)
        smooth = np.convolve(values, np.ones(window) / window, mode="valid") if values.size >= window else values
        out.append((steps[mine][len(values) - len(smooth):].astype(np.float64), smooth))
    return out


def plot_run(run: Any, path: Path) -> Path:
    """The curves of a run file (a :class:`popplay.checkpoints.runfile.RunFile`) against
    agent-time steps per trial and against learning seconds, one row per panel of
    curves in one unit, each labelled with its units and a legend. A ``<metric>_se``
    curve is drawn as a ±1 standard-error band around its metric. Knights runs: best,
    mean and worst agent against every benchmark opponent on one axis, with markers at
    the evaluation points only (between them the curves repeat the last evaluation)."""
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
    config = run.config or {}
    evaluated = np.ones(steps.shape, dtype=bool)
    if "eval_episode" in metrics:  # a point is an evaluation where eval_episode changes
        episodes = metrics["eval_episode"]
        evaluated = np.concatenate([[True], episodes[1:] != episodes[:-1]])
    # A standard error drawn around another curve than its own: knights' quality_se is
    # that of the mean agent against the strongest opponent (quality is that curve).
    band_of = {name: f"{name}_se" for name in metrics if f"{name}_se" in metrics}
    if "quality_se" in metrics and "quality" in metrics:
        for name, values in metrics.items():
            if name.endswith("_mean") and name != "quality" and np.array_equal(values, metrics["quality"],
                                                                               equal_nan=True):
                band_of[name] = "quality_se"
    # Evaluated curves (knights: the benchmark qualities) only have values at the
    # evaluation points; between them they repeat the last one, which is not data.
    repeated = {name for name in metrics if "eval_episode" in metrics and
                (name.endswith(_STATS) and not name.startswith("score_") or name.startswith("quality"))}
    panels = _panels(run.domain, metrics)
    if not panels:
        raise PlotInputError(f"{run.path}: the run file has no metric under /curves to plot")
    step_label = registry.get(run.domain).steps_label if registry.known(run.domain) else "agent-time steps"
    axes_x = [(step_label, steps)]
    if seconds is not None:
        axes_x.append(("learning time (s)", seconds))
    member_curves = _member_returns(run.state or {})
    rows = len(panels) + bool(member_curves)
    fig = new_figure(4.6 * len(axes_x) + 2.6, 2.8 * rows + 1.0)
    from matplotlib.ticker import (
        EngFormatter,  # after new_figure: it says when matplotlib is missing; defers matplotlib
    )

    colours: dict[str, str] = {}
    for row, (panel, members) in enumerate(panels):
        for col, (xlabel, x) in enumerate(axes_x):
            ax = fig.add_subplot(rows, len(axes_x), row * len(axes_x) + col + 1)
            drawn = False
            for name, label, style in members:
                values = metrics[name]
                finite = np.isfinite(values) & np.isfinite(x)
                if name in repeated:
                    finite &= evaluated
                if not finite.any():
                    continue
                group = name.rsplit("_", 1)[0] if name.endswith(_STATS) else name
                colour = colours.setdefault(group, f"C{len(colours) % 10}")
                marker = "o" if name in repeated or finite.sum() <= 30 else None
                ax.plot(x[finite], values[finite], linestyle=style, color=colour, linewidth=1.3, label=label,
                        marker=marker, markersize=3)
                error = metrics.get(band_of[name]) if name in band_of else None
                if error is not None:
                    ok = finite & np.isfinite(error)
                    ax.fill_between(x[ok], values[ok] - error[ok], values[ok] + error[ok], color=colour,
                                    alpha=0.2, linewidth=0, label=f"{label} ± 1 s.e.")
                drawn = True
            if not drawn:
                ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
            elif col == len(axes_x) - 1:  # one legend per row, beside it: it never hides a curve
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
            if col == 0:
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, not 200000 (labels never collide)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(_units(run.domain, panel, config), fontsize=8)
            ax.grid(True, alpha=0.3)
    if member_curves:  # one thin line per member, on the steps axis (episodes carry no learning time)
        ax = fig.add_subplot(rows, len(axes_x), (rows - 1) * len(axes_x) + 1)
        for x, y in member_curves:
            ax.plot(x, y, linewidth=0.6, alpha=0.6)
        ax.set_xlabel(step_label)
        ax.set_ylabel("every member's return\n(mean of 10 episodes)", fontsize=8)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
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
    head = f"{display_name(run.path)}: {run.domain} run" + ("" if run.complete else " (stopped early)")
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


def output_png(path: Path, out: Path | None = None) -> Path:
    """The PNG to draw ``path`` into (``out``, or the input's name with .png), refused
    (:class:`PlotInputError`) where it cannot be written or would replace the input."""
    path = Path(path)
    png = Path(out) if out is not None else default_png(path)
    if png.exists() and png.is_dir():
        raise PlotInputError(f"--out {png}: is a directory")
    if png.resolve() == path.resolve():
        raise PlotInputError(f"--out {png}: would overwrite the file being plotted")
    directory = png.parent if str(png.parent) else Path(".")
    if directory.exists() and not directory.is_dir():
        raise PlotInputError(f"--out {png}: {directory} is not a directory")
    return png


def plot_run_file(path: Path, png: Path) -> PlotResult:
    """Draw a run file's curves into ``png``. Raises :class:`PlotInputError` or
    :class:`PlotUnavailable`."""
    try:
        run = load_run(path)
    except RunFileError as error:
        raise PlotInputError(str(error)) from None
    check_writable(png)
    plot_run(run, png)
    return PlotResult("run", Path(path), png, run.domain, run.domain)


def check_writable(png: Path) -> None:
    """Refuse an --out that is not a PNG's to replace or name; create a missing --out
    directory (as ``reproduce`` does), then probe it."""
    check_replaceable(png, PlotInputError, kind="png")  # never a run file, a device or a directory
    if png.suffix.lower() != ".png":  # the figure is always a PNG: another name would mislabel it
        raise PlotInputError(f"--out {png}: plot writes a PNG image; give a name ending in .png")
    make_parent(png, PlotInputError)
    problem = probe_directory(png.parent)
    if problem:
        raise PlotInputError(f"--out {png}: cannot write in {png.parent} ({problem})")


__all__ = ["INSTALL_HINT", "PlotInputError", "PlotResult", "PlotUnavailable", "draw_figure", "missing_matplotlib",
           "new_figure", "output_png", "plot_run", "plot_run_file", "save_png"]

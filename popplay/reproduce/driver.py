"""The shared driver: compute the chosen figures, write their data, draw their PNGs."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from popplay import plotting
from popplay.checkpoints.h5io import probe_directory
from popplay.core.backend import BackendError, resolve_backend
from popplay.core.errors import UsageError
from popplay.reproduce.data import FigureFileError, read_figure, write_figure
from popplay.reproduce.registry import SCALES, Figure, figures, resolve


@dataclass(frozen=True)
class ReproduceConfig:
    """What ``popplay reproduce`` was asked for."""

    target: str  # a figure (figure2), a domain (bandit) or all
    scale: str = "small"
    out: Path = Path("figures")
    seed: int = 0
    backend: str = "auto"
    device: str = "auto"
    fresh: bool = False  # recompute figures already in ``out``


#: The figure file attribute naming what the figure was computed with, so that a
#: reproduce interrupted and run again keeps exactly the figures it had finished.
SETTINGS_ATTR = "reproduce_settings"


@dataclass
class Session:
    """The :class:`popplay.reproduce.registry.Context` figures compute in: one scale,
    seed and backend, and a memo so that figures share their experiments."""

    scale: str
    seed: int
    backend: Any
    note: Callable[[str], None] = lambda message: None
    _memo: dict[str, Any] = field(default_factory=dict)

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


@dataclass
class FigureOutcome:
    figure: str
    data_path: Path
    png_path: Path | None  # None when matplotlib is missing
    summary: dict[str, Any]
    seconds: float  # wall time spent computing (shared experiments count once)
    kept: bool = False  # computed by an earlier reproduce with the same settings


@dataclass
class ReproduceOutcome:
    figures: list[FigureOutcome]
    scale: str
    seconds: float
    backend: str
    device: str
    plot_error: str | None = None  # set when the PNGs could not be drawn (data still written)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale, "seconds": self.seconds, "backend": self.backend, "device": self.device,
            "figures": [{"figure": f.figure, "data": str(f.data_path),
                         "png": None if f.png_path is None else str(f.png_path), "seconds": f.seconds, "kept": f.kept,
                         **f.summary} for f in self.figures],
        }


def reproduce(config: ReproduceConfig, note: Callable[[str], None] = lambda message: None) -> ReproduceOutcome:
    """Compute every figure ``config.target`` names and write ``<figure>.h5`` (and,
    when matplotlib is installed, ``<figure>.png``) into ``config.out``.

    Raises :class:`popplay.core.errors.UsageError` for bad input, before any learning.
    A missing matplotlib does not stop the computation: the data files are written
    and ``plot_error`` says how to draw them.
    """

    try:
        chosen = resolve(config.target)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if config.scale not in SCALES:
        raise UsageError(f"--scale must be one of {', '.join(SCALES)} (got {config.scale!r})")
    try:
        backend = resolve_backend(config.backend, config.device)
    except BackendError as error:
        raise UsageError(str(error)) from None
    out = Path(config.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot create the directory ({error.strerror})") from None
    problem = probe_directory(out)
    if problem:
        raise UsageError(f"--out {out}: cannot write there ({problem})")

    plot_error = plotting.missing_matplotlib()
    if plot_error:
        note(f"Warning: {plot_error}; computing and writing the data anyway")
    session = Session(config.scale, config.seed, backend, note)
    settings = json.dumps({"scale": config.scale, "seed": config.seed, "backend": backend.name,
                           "device": backend.device}, sort_keys=True)
    kept = {} if config.fresh else _finished_earlier(chosen, out, settings)
    started = time.perf_counter()
    outcomes: list[FigureOutcome] = []
    for figure in chosen:
        if figure.prepare is not None and figure.name not in kept:
            figure.prepare(session)
    for figure in chosen:
        began = time.perf_counter()
        data_path = out / f"{figure.name}.h5"
        png_path = out / f"{figure.name}.png"
        try:  # a full disk or something other than a file under the name: one line
            if figure.name in kept:
                data = kept[figure.name]
                note(f"{figure.name}: kept {data_path}, computed earlier with these settings (--fresh recomputes)")
                if not plot_error and not png_path.exists():
                    plotting.draw_figure(figure, data, png_path)
            else:
                note(f"{figure.name}: {figure.description}")
                data = figure.compute(session)
                data.attrs[SETTINGS_ATTR] = settings
                write_figure(data_path, data)  # as each finishes: an interrupted reproduce keeps it
                if not plot_error:
                    plotting.draw_figure(figure, data, png_path)
        except (FigureFileError, OSError) as error:
            raise UsageError(str(error)) from None
        if plot_error:
            png_path = None
        outcomes.append(FigureOutcome(figure.name, data_path, png_path, figure.summary(data),
                                      time.perf_counter() - began, kept=figure.name in kept))
    result = ReproduceOutcome(outcomes, config.scale, time.perf_counter() - started, backend.name, backend.device)
    if plot_error:
        files = " ".join(str(o.data_path) for o in outcomes)
        result.plot_error = (f"{plot_error}, so no PNG was drawn; the data is in {files}: "
                             f"install it and run `popplay plot FILE.h5` to draw each figure")
    return result


def _finished_earlier(chosen: list[Figure], out: Path, settings: str) -> dict[str, Any]:
    """The chosen figures whose data file in ``out`` was written by a reproduce with the
    same settings (an unreadable or foreign file is computed again and replaced)."""
    kept = {}
    for figure in chosen:
        path = out / f"{figure.name}.h5"
        if not path.is_file():
            continue
        try:
            data = read_figure(path)
        except FigureFileError:
            continue
        if data.figure == figure.name and data.attrs.get(SETTINGS_ATTR) == settings:
            kept[figure.name] = data
    return kept


def redraw_file(path: Path, png: Path) -> plotting.PlotResult:
    """Draw a figure data file's figure again (``popplay plot FIGURE.h5``). Raises
    :class:`popplay.plotting.PlotInputError` or :class:`~popplay.plotting.PlotUnavailable`."""
    try:
        data = read_figure(path)
    except FigureFileError as error:
        raise plotting.PlotInputError(str(error)) from None
    plotting.check_writable(png)
    figure: Figure | None = figures().get(data.figure)
    if figure is None:
        raise plotting.PlotInputError(f"{path}: figure {data.figure!r} is not known to this popplay version")
    plotting.draw_figure(figure, data, png)
    return plotting.PlotResult("figure", Path(path), png, data.domain, data.figure)

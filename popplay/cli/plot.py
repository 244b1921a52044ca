"""``popplay plot FILE.h5``: draw a run file's learning curves (or redraw a figure)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from popplay import plotting
from popplay.cli.app import app
from popplay.cli.common import print_json
from popplay.core.errors import UsageError
from popplay.reproduce import data as figure_data
from popplay.reproduce import driver


@app.command("plot", short_help="Draw the learning curves of a run file (or redraw a figure) as a PNG.")
def plot(
    run: Annotated[Path, typer.Argument(
        help="A run file of any domain (`popplay train`), or a figure data file (`popplay reproduce`).",
        metavar="RUN.h5", dir_okay=False)],
    out: Annotated[Optional[Path], typer.Option(
        help="PNG to write. Default: the input's name with .png.", dir_okay=False, metavar="PNG")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on the last line.")] = False,
) -> None:
    """Draw every learning curve of a run file (each /curves/<metric> against agent-time
    steps and against learning seconds) as one PNG; a figure data file written by
    `popplay reproduce` is redrawn as its figure. Needs the plot extra:
    pip install "popplay\\[plot]"."""
    try:
        png = plotting.output_png(run, out)
        if figure_data.file_format(run) == figure_data.FORMAT:
            result = driver.redraw_file(run, png)
        else:
            result = plotting.plot_run_file(run, png)
    except (plotting.PlotInputError, plotting.PlotUnavailable, figure_data.FigureFileError) as error:
        raise UsageError(str(error)) from None
    if json_output:
        print_json({"kind": result.kind, "source": str(result.source), "png": str(result.png),
                    "domain": result.domain, "name": result.name})
    else:
        what = f"{result.domain} run curves" if result.kind == "run" else f"{result.name} ({result.domain})"
        print(f"{result.source}: drew {what}; wrote {result.png}")

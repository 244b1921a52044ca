"""``popplay reproduce FIGURE``: regenerate one of the report's figures (data + PNG)."""
from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from popplay.cli.app import app
from popplay.cli.common import BACKEND_HELP, DEVICE_HELP, BackendName, DeviceName, print_json
from popplay.core.errors import UsageError
from popplay.reproduce.driver import ReproduceConfig
from popplay.reproduce.driver import reproduce as run_reproduce


class Scale(str, Enum):
    tiny = "tiny"
    small = "small"
    paper = "paper"


SCALE_HELP = ("paper: the report's sizes (1024 trials; bandit under a minute, cart-pole about 4 minutes and "
              "16 GB of memory, knights about 8 minutes on a 2-core CPU; reinforce_workers: 8 seeds x 200 "
              "updates, about an hour; knights_ladder: 4 settings x 3 seeds x 30 minutes, about 6.5 hours); "
              "small: the report's groups with fewer trials or a shorter run (a couple of minutes in all; "
              "knights_ladder about 12); tiny: a seconds-long smoke run.")


@app.command("reproduce", short_help="Regenerate a figure of the report: data (HDF5) and a PNG.")
def reproduce(
    figure: Annotated[str, typer.Argument(
        help="figure2-figure4 (bandit, report §1.4), figure6-figure9 (cart-pole, §2.5), knights_replication "
             "(knights, §3.4), reinforce_workers (REINFORCE with 1-15 workers, the 'Distributed Reinforcement "
             "Learning: A draft' post), knights_ladder (does self-play keep improving? ladder Elo of four "
             "settings against learning time); a domain (bandit, cartpole, knights, reinforce, ladder) for all "
             "its figures; all for every figure.",
        metavar="FIGURE")],
    scale: Annotated[Scale, typer.Option(help=SCALE_HELP)] = Scale.small,
    out: Annotated[Path, typer.Option(
        help="Directory for <figure>.h5 (data) and <figure>.png; created if missing. Each figure is written as it "
             "finishes.",
        file_okay=False)] = Path("figures"),
    seed: Annotated[int, typer.Option(help="Seed of every random stream.")] = 0,
    backend: Annotated[BackendName, typer.Option(
        help=BACKEND_HELP + " The single agent's timing always runs on the CPU (numba), as in the report.")
    ] = BackendName.auto,
    device: Annotated[DeviceName, typer.Option(help=DEVICE_HELP)] = DeviceName.auto,
    fresh: Annotated[bool, typer.Option(
        help="Recompute every figure. Without it, a figure whose data file in --out was computed with the same "
             "scale, seed, backend and device is kept (an interrupted reproduce goes on where it stopped).")
    ] = False,
    json_output: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object (files written, headline numbers) on the last line of stdout.")
    ] = False,
) -> None:
    """Regenerate a figure of Bell's report: run its experiments, write the data as
    HDF5 (h5py only) and draw one PNG per figure (needs the plot extra:
    pip install "popplay\\[plot]"). Redraw a data file later with `popplay plot FILE.h5`.

    Learning time (Figure 3) is the time one trial takes alone, as in the report;
    quality is averaged over all trials. See docs/results.md.
    """

    config = ReproduceConfig(target=figure, scale=scale.value, out=out, seed=seed, backend=backend.value,
                             device=device.value, fresh=fresh)
    stream = sys.stderr if json_output else sys.stdout

    def note(message: str) -> None:
        print(message, file=sys.stderr if message.startswith("Warning:") else stream, flush=True)

    try:
        outcome = run_reproduce(config, note=note)
    except UsageError as error:
        raise UsageError(str(error)) from None
    for item in outcome.figures:
        shown = f" and {item.png_path}" if item.png_path is not None else ""
        print(f"{item.figure}: {'kept' if item.kept else 'wrote'} {item.data_path}{shown}", file=stream, flush=True)
    if json_output:
        print_json(outcome.to_dict())
    else:
        print(f"done in {outcome.seconds:.1f}s ({outcome.scale} scale, {outcome.backend} on {outcome.device})")
    if outcome.plot_error:
        raise UsageError(outcome.plot_error)

"""``popplay export RUN.h5 [--csv]``: a run file's learning curves as CSV."""
from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from popplay.checkpoints.h5io import NoSpace, check_new_output, make_parent, write_file_atomically
from popplay.checkpoints.runfile import RunFileError
from popplay.checkpoints.scalars import LogError, write_csv
from popplay.checkpoints.validation import load_run
from popplay.cli.app import app
from popplay.cli.common import OverwriteOption, print_json
from popplay.cli.evaluate_deep import restored
from popplay.core import registry
from popplay.core.errors import PopplayError, UsageError


@app.command("export", short_help="Write a run file's learning curves as CSV (e.g. for pandas or a spreadsheet).")
def export(
    run: Annotated[Path, typer.Argument(help="A run file written by `popplay train`.", metavar="RUN.h5",
                                        dir_okay=False)],
    csv_output: Annotated[bool, typer.Option("--csv", help="Write the curves as CSV (the default: the only format "
                                                           "so far).")] = False,
    out: Annotated[Optional[Path], typer.Option(
        help="CSV file to write; '-' for standard output. Default: the run's name with .csv.", dir_okay=False,
        metavar="FILE")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on the last line.")] = False,
    member: Annotated[Optional[int], typer.Option(
        min=0, help="A deep population (--agents): write member K's network as a torch state_dict file "
                    "(torch.load, then load_state_dict into the same nn.Sequential) instead of the curves.")] = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Export the curves of a run file: one row per curve point with agent_steps (agent-time
    steps per trial; knights: agent turns), seconds (learning time) and every metric, as
    `train --log-dir` writes while training. With --member, one member's network instead."""

    if member is not None:
        if csv_output:
            raise UsageError("--csv and --member export different things; give one of them")
        export_member(run, member, out, json_output, overwrite)
        return

    try:
        stored = load_run(run)
    except RunFileError as error:
        raise UsageError(str(error)) from None
    curves = stored.curves
    steps = [int(v) for v in curves.get("agent_steps", [])]
    seconds = [float(v) for v in curves.get("seconds", [])]
    metrics = {name: [float(v) for v in values] for name, values in curves.items()
               if name not in ("agent_steps", "seconds")}
    if any(len(values) != len(steps) for values in [*metrics.values(), seconds] if len(values)):
        raise UsageError(f"{run}: damaged run file (curves of different lengths)")
    if out is not None and str(out) == "-":

        writer = csv.writer(sys.stdout)
        writer.writerow(["agent_steps", "seconds", *metrics])
        for i, step in enumerate(steps):
            writer.writerow([step, repr(seconds[i]) if seconds else "", *(repr(metrics[m][i]) for m in metrics)])
        return
    target = out if out is not None else Path(run).with_suffix(".csv")
    if target.resolve() == Path(run).resolve():
        raise UsageError(f"--out {target}: would overwrite the run file")
    try:
        check_new_output(target, LogError, kind="text", overwrite=overwrite)
        make_parent(target, LogError)
        write_csv(target, steps, seconds, metrics)
    except LogError as error:
        raise UsageError(str(error)) from None
    if json_output:
        print_json({"source": str(run), "csv": str(target), "points": len(steps), "columns":
                    ["agent_steps", "seconds", *metrics]})
    else:
        points = f"{len(steps)} curve point{'' if len(steps) == 1 else 's'}"
        print(f"{run}: wrote {points} ({', '.join(metrics)}) to {target}")


def export_member(run: Path, member: int, out: Optional[Path], json_output: bool, overwrite: bool = False) -> None:
    """Member ``member``'s network of a deep population as a torch ``state_dict`` file."""
    import torch  # defers torch

    try:
        stored = load_run(run)
    except RunFileError as error:
        raise UsageError(str(error)) from None
    if not registry.known(stored.domain) or registry.get(stored.domain).kind != registry.DEEP \
            or int(stored.config.get("agents", 1)) < 2:
        raise UsageError(f"--member: {run} is not a deep population (train with --agents 2 or more)")
    agents = int(stored.config["agents"])
    if member >= agents:
        raise UsageError(f"--member must lie in [0, {agents - 1}] for {run} (got {member})")
    if out is not None and str(out) == "-":
        raise UsageError("--out -: a member's network is a binary torch file; name a file (or leave --out out)")
    target = out if out is not None else Path(run).with_name(f"{Path(run).stem}-member{member}.pt")
    check_new_output(target, UsageError, kind="binary", overwrite=overwrite)  # never a run file
    _, experiment, state = restored(run, stored)
    if experiment.diverged_members(state)[member]:
        raise UsageError(f"--member {member}: that member of {run} diverged (non-finite parameters); there is no "
                         "network to export")
    network = experiment.member_network(state, member)
    shape = " ".join(str(network).split())
    make_parent(target, UsageError)
    try:
        write_file_atomically(target, lambda handle: torch.save(network.state_dict(), handle))
    except NoSpace:
        raise PopplayError(f"no space left on device: {target} was not written", 1) from None
    except OSError as error:
        raise UsageError(f"--out {target}: cannot write ({error.strerror or error})") from None
    if json_output:
        print_json({"source": str(run), "member": member, "state_dict": str(target), "network": shape})
    else:
        print(f"{run}: wrote member {member}'s network to {target} (load_state_dict into {shape})")

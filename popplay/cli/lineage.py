"""``popplay lineage RUN.h5``: the family tree of a run's current population."""
from __future__ import annotations

import csv
import io
import json
import math
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer
from rich.console import Console
from rich.tree import Tree

from popplay.checkpoints.h5io import NoSpace, check_new_output, make_parent, write_file_atomically
from popplay.checkpoints.runfile import RunFileError
from popplay.checkpoints.validation import load_run
from popplay.cli.app import app
from popplay.cli.common import OverwriteOption
from popplay.core import registry
from popplay.core.errors import PopplayError, UsageError
from popplay.operators.evolution import RECORD_COLUMNS, Lineage

PREFIX = "lineage_"


class Format(str, Enum):
    tree = "tree"
    csv = "csv"
    json = "json"


@app.command("lineage")
def lineage(
    run: Annotated[Path, typer.Argument(help="A run file written by `popplay train`.", metavar="RUN.h5",
                                        dir_okay=False)],
    format: Annotated[Format, typer.Option(  # noqa: A002  (the option is --format)
        "--format", help="tree (rich, on the terminal), csv (one row per agent) or json.")] = Format.tree,
    out: Annotated[Optional[Path], typer.Option(help="Write to this file instead of stdout.", dir_okay=False)] = None,
    everyone: Annotated[bool, typer.Option(
        "--all", help="Every agent ever recorded, not only the current population and its ancestors; "
                      "json then also holds the raw event log.")] = False,
    group: Annotated[Optional[int], typer.Option(
        help="Populations with leading batch axes (e.g. trials x agents): only this one (flat index).")] = None,
    json_output: Annotated[bool, typer.Option(
        "--json", help="Same as --format json (the spelling every other command uses).")] = False,
    overwrite: OverwriteOption = False,
) -> None:
    """Who descends from whom: every copy, mutation and reset recorded during training.
    Founders are the initial agents (and agents reset after diverging); each node shows
    the generation (episode) it was born in, its slot and its learning parameters."""

    if json_output:
        if format not in (Format.tree, Format.json):
            raise UsageError(f"--json and --format {format.value} disagree; give one of them")
        format = Format.json  # noqa: A001
    try:
        stored = load_run(run)
    except RunFileError as error:
        raise UsageError(str(error)) from None
    log, living = _load(stored, run, group)
    nodes = log.family(living, everyone=everyone)
    if group is not None:
        nodes = [n for n in nodes if n.group == group]
    if format is Format.tree:
        text = _tree_text(nodes, log, living, run, to_terminal=out is None and sys.stdout.isatty())
    elif format is Format.csv:
        text = _csv(nodes, log.parameters)
    else:
        payload: dict[str, Any] = {
            "path": str(run), "domain": stored.domain, "population": living.tolist(),
            "parameters": list(log.parameters), "events": len(log), "next_id": log.next_id,
            "nodes": [_node_dict(n) for n in nodes],
        }
        if everyone:
            payload["records"] = {name: [_plain(v) for v in values.tolist()]
                                  for name, values in log.records.items()}
        text = json.dumps(payload, sort_keys=True) + "\n"
    if out is None:
        if text:
            typer.echo(text, nl=False)
        return

    check_new_output(out, UsageError, kind="text", overwrite=overwrite)  # never a run file
    make_parent(out, UsageError)
    try:
        write_file_atomically(out, lambda handle: handle.write(text.encode()))
    except NoSpace:
        raise PopplayError(f"no space left on device: {out} was not written", 1) from None
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write ({error.strerror or error})") from None


def _load(stored: Any, run: Path, group: int | None = None) -> tuple[Any, np.ndarray]:
    """The lineage log and the ids of the current population (one group of it), from /state."""

    state = stored.state
    if "agent_id" not in state:
        raise UsageError(f"{run}: a {stored.domain} run has no agent ids to trace")
    living = np.asarray(state["agent_id"], dtype=np.int64)
    if living.ndim == 0:
        raise UsageError(f"{run}: damaged agent ids")
    if group is not None:
        groups = living.reshape(-1, living.shape[-1])
        if not 0 <= group < len(groups):
            raise UsageError(f"--group must lie in [0, {len(groups) - 1}] for {run} (got {group})")
    columns = {name[len(PREFIX):]: value for name, value in state.items() if name.startswith(PREFIX)}
    if not columns:  # written before lineage was recorded: every agent is a founder
        log = Lineage.start(living)
        return log, (living.reshape(-1, living.shape[-1])[group] if group is not None else living.reshape(-1))

    parameters = tuple(sorted(set(columns) - set(RECORD_COLUMNS) - {"next_id"}))
    order = registry.get(stored.domain).lineage_parameters if registry.known(stored.domain) else ()
    if order:  # the domain's own order (α, λ, ε, noise), not alphabetical
        parameters = tuple(p for p in order if p in parameters) + tuple(p for p in parameters if p not in order)
    try:
        log = Lineage.from_arrays(columns, parameters)
    except ValueError as error:
        raise UsageError(f"{run}: damaged lineage ({error})") from None
    if living.size and (living.min() < 0 or living.max() >= max(log.next_id, 1)):
        raise UsageError(f"{run}: damaged lineage (agent ids outside the log)")
    return log, (living.reshape(-1, living.shape[-1])[group] if group is not None else living.reshape(-1))


def _plain(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _node_dict(node: Any) -> dict[str, Any]:
    return {"agent": node.agent, "parent": node.parent, "born": node.born, "event": node.event,
            "group": node.group, "slot": node.slot, "alive": node.alive, "records": node.events,
            **{name: _plain(v) for name, v in node.values.items()}}


def _csv(nodes: list[Any], parameters: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["agent", "parent", "born", "event", "group", "slot", "alive", "records", *parameters])
    for n in nodes:
        writer.writerow([n.agent, n.parent, n.born, n.event, n.group, n.slot, int(n.alive), n.events,
                         *("" if math.isnan(n.values[p]) else repr(n.values[p]) for p in parameters)])
    return buffer.getvalue()


def _label(node: Any, slot_of: dict[int, int]) -> str:
    values = " ".join(f"{'λ' if k == 'lam' else 'α' if k == 'alpha' else 'ε' if k == 'epsilon' else k}="
                      f"{v:.3g}" for k, v in node.values.items() if not math.isnan(v) and not (k == "noise" and v == 0))
    where = f"[bold green]slot {slot_of[node.agent]}[/]" if node.alive else "[dim]gone[/]"
    how = "founder" if node.event == "initial" else ("reset" if node.event == "reset" else f"born gen {node.born}")
    return f"[bold]#{node.agent}[/] {where} {how} [dim]{values}[/]"


def _tree_text(nodes: list[Any], log: Any, living: np.ndarray, run: Path, *, to_terminal: bool) -> str:
    """A rich tree; chains of gone agents with a single child are folded into one line."""

    by_id = {n.agent: n for n in nodes}
    children: dict[int, list[int]] = {n.agent: [] for n in nodes}
    roots = []
    for n in nodes:
        if n.parent >= 0 and n.parent in by_id:
            children[n.parent].append(n.agent)
        else:
            roots.append(n.agent)
    slot_of = {int(agent): slot for slot, agent in enumerate(living.tolist())}
    top = Tree(f"[bold]{run}[/]: {len(living)} agents now, {len(roots)} founding lines, "
               f"{len(log)} lineage records, {log.next_id} agents ever")
    stack = [(top, r) for r in reversed(roots)]
    while stack:  # iterative: lineages can be thousands of copies deep
        branch, agent = stack.pop()
        folded = 0
        start = agent
        while not by_id[agent].alive and len(children[agent]) == 1:
            agent = children[agent][0]
            folded += 1
        if folded:
            first = by_id[start]
            hidden = folded - 1
            branch = branch.add(_label(first, slot_of) + (
                f" [dim]… then {hidden} gone {'copy' if hidden == 1 else 'copies'} …[/]" if hidden else ""))
        node = branch.add(_label(by_id[agent], slot_of))
        for child in reversed(children[agent]):
            stack.append((node, child))
    console = Console(file=io.StringIO(), force_terminal=to_terminal, width=120 if not to_terminal else None,
                      color_system="auto" if to_terminal else None)
    console.print(top)
    return console.file.getvalue()

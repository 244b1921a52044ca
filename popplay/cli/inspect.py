"""``popplay inspect RUN.h5``: a quick look at a run file without loading its arrays."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from popplay.checkpoints.runfile import RunFileError
from popplay.checkpoints.validation import summarize
from popplay.cli.app import app
from popplay.cli.common import print_json
from popplay.core import registry
from popplay.core.errors import UsageError, spelled_out


@app.command("inspect")
def inspect(
    run: Annotated[Path, typer.Argument(help="A run file written by `popplay train`.", metavar="RUN.h5",
                                        dir_okay=False)],
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on the last line.")] = False,
) -> None:
    """Domain, config, progress, population size, last quality, checkpoint time and library versions."""

    try:
        info = summarize(run)
    except RunFileError as error:
        raise UsageError(str(error)) from None
    if json_output:
        print_json(info)
        return

    table = Table(title=_safe(str(run)), show_header=False, title_justify="left")
    table.add_column(style="dim")
    table.add_column()

    def row(key: str, value: Any) -> None:
        table.add_row(_safe(key), _safe(value))

    for key in ("domain", "complete", "written", "population", "progress", "learning_seconds", "phases", "checksum"):
        row(key, _text(info.get(key)))
    budget = _budget(info)
    if budget:
        row("budget", budget)
    for name, value in info.get("last", {}).items():
        row(f"last {name}", _text(value))
    provenance = info.get("provenance", {})
    if "command_line" in provenance:
        row("command", provenance["command_line"])
    if provenance.get("given"):
        row("given", " ".join(f"{k} {v}" for k, v in provenance["given"].items()))
    for earlier in provenance.get("history", []):
        row("resumed from", earlier)
    row("config", ", ".join(f"{k}={v}" for k, v in sorted(info["config"].items())))
    row("versions", ", ".join(f"{k} {v}" for k, v in sorted(info["versions"].items())))
    shown = [f"popplay {provenance['popplay_version']}" if "popplay_version" in provenance else "",
             f"commit {provenance['git_commit']}" if "git_commit" in provenance else "",
             f"host {provenance['host']}" if "host" in provenance else "",
             f"{provenance['platform']}" if "platform" in provenance else "",
             f"CPU {provenance['cpu']} ({provenance.get('cpu_count')} cores)" if "cpu" in provenance else "",
             f"GPU {provenance['gpu']}" if "gpu" in provenance else ""]
    if any(shown):
        row("made by", "; ".join(s for s in shown if s))
    Console().print(table)


def _budget(info: dict[str, Any]) -> str:
    """What ended the run, said where the config alone would mislead: a time-budget run
    keeps its configured step budget, which it may have passed or not reached."""
    config, progress = info.get("config", {}), info.get("progress", {})
    seconds = config.get("time_budget")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
        return ""
    said = f"{seconds:g} s of learning (time budget)"
    spec = registry.get(info["domain"]) if registry.known(str(info.get("domain"))) else None
    counter, field = spec.budget_counter if spec is not None and spec.budget_counter else ("", "")
    if field in config and counter in progress and progress[counter] != config[field]:
        said += f"; {counter} reached {_text(progress[counter])}, not the configured {field}={_text(config[field])}"
    return said


def _safe(text: str) -> Text:
    """What a file says, shown as written: control characters (a crafted attribute's
    terminal escapes) spelled out, and no rich markup interpreted."""
    return Text(spelled_out(str(text)))


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)

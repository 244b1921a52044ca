"""Where a run file came from: the command as typed, the options the user gave, the
popplay version and git commit, the host and its CPU/GPU (stored as root attributes
of every run file, shown by ``popplay inspect``; see ``docs/runfile.md``).

Everything here is best effort: a value that cannot be found is ``"unknown"``, never
an error, since provenance must not stop a run from being saved.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from enum import Enum
from importlib import import_module
from pathlib import Path
from typing import Any

import popplay

_COMMAND: list[list[str]] = []  # the popplay command line being run (set by the CLI)

KEYS = ("command_line", "given_json", "popplay_version", "git_commit", "host", "platform", "cpu", "cpu_count",
        "gpu", "history_json")


def set_command(argv: list[str]) -> None:
    """Record the command line as typed (``popplay`` and its arguments)."""
    _COMMAND[:] = [["popplay", *argv]]


def command_line() -> str:
    if _COMMAND:
        return shlex.join(_COMMAND[0])

    return shlex.join([Path(sys.argv[0]).name or "python", *sys.argv[1:]])


def given_options() -> dict[str, Any]:
    """The options given on the command line (or in the environment) of the running
    click/typer command, as typed (``{"--agent-steps": 131072}``); {} outside one."""
    ctx = None
    for name in ("typer._click.globals", "click.globals"):
        try:
            ctx = import_module(name).get_current_context(silent=True)
        except ImportError:
            continue
        if ctx is not None:
            break
    if ctx is None:
        return {}
    given: dict[str, Any] = {}
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if source is None or getattr(source, "name", "") not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        value = ctx.params.get(param.name)
        label = max(param.opts, key=len) if param.opts else param.name
        given[label] = _plain(value)
    return given


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def git_commit() -> str:
    """The commit of the popplay source tree (with ``-dirty`` when it has uncommitted
    changes), or ``unknown`` for an installed package without git."""
    source = Path(__file__).resolve().parent.parent
    if not (source / ".git").exists():
        return "unknown"
    try:
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def gpu_name(device: str) -> str:
    """The GPU a run used (``none`` on the CPU); torch is already loaded when it did."""
    if not str(device).startswith("cuda"):
        return "none"
    try:
        import torch  # defers torch

        return torch.cuda.get_device_name(torch.device(device))
    except Exception:  # a provenance detail must never fail a save
        return "unknown"


def collect(device: str = "cpu", history: list[str] | None = None) -> dict[str, Any]:
    """The provenance attributes of a run file written now (``history``: the command
    lines of the runs this one resumes, oldest first)."""

    return {
        "command_line": command_line(), "given_json": json.dumps(given_options(), sort_keys=True),
        "popplay_version": popplay.__version__, "git_commit": git_commit(), "host": platform.node() or "unknown",
        "platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count() or 0,
        "gpu": gpu_name(device), "history_json": json.dumps(list(history or [])),
    }

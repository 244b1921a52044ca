"""Failures users see as one line, each carrying the exit code its command ends with.

Lower layers raise these and never import the command line; the command line
(:func:`popplay.cli.main.main`) prints ``Error: <message>`` and exits with ``exit_code``.
"""
from __future__ import annotations

import re
import sys
import warnings
from typing import Any

#: Exit codes every command shares.
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_LOST = 3  # a multi-process job lost a rank
EXIT_PEER_LOST = 75  # a rank stopped because a peer vanished or stopped answering
EXIT_CANNOT_SAVE = 74  # a rank could not save its files, most often on a full disk (EX_IOERR)
EXIT_INTERRUPTED = 130


class PopplayError(Exception):
    """A failure to report as one line; ``exit_code`` is the command's exit code."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(PopplayError, ValueError):
    """Bad input: an option, a setting, a file that cannot be used (exit code 2)."""

    exit_code = EXIT_USAGE


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def spelled_out(text: str) -> str:
    """``text`` with its control characters spelled out (``\\x1b``): a crafted file's names
    or values may carry terminal escapes, which must not reach the terminal."""
    return _CONTROL.sub(lambda match: "\\x%02x" % ord(match.group()), text)


def one_line(message: object) -> str:
    """``message`` on a single line, its control characters spelled out."""
    return spelled_out(" ".join(str(message).split()))


def error_line(message: object) -> str:
    """The one line a failure shows users: ``Error: <message>`` (:func:`one_line`)."""
    return "Error: " + one_line(message)


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def show_warnings_plainly(prefix: str = "", *, deprecations: bool = True) -> None:
    """Show library warnings (gymnasium's deprecations) as popplay shows its own: one
    ``Warning: <prefix><text>`` line, colour codes dropped, other control characters
    spelled out, each text once. Python's form is two lines naming a library's source
    line, and gymnasium colours its text even into a file. ``deprecations=False`` drops
    deprecations: in a rank, they concern the command line (an old environment id),
    which the launcher or rank 0 has met and said already. For a program's own process
    only (the executable, a rank): a host program keeps its own handling."""
    shown: set[str] = set()

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        if not deprecations and issubclass(category, DeprecationWarning):
            return
        text = one_line(_COLOUR.sub("", str(message))).removeprefix("WARN: ")
        if text in shown:  # Python tells a warning once per place that raised it: the same text from two, once
            return
        shown.add(text)
        try:
            print(f"Warning: {prefix}{text}", file=file if file is not None else sys.stderr)
        except (OSError, ValueError):  # a closed or broken stderr: as Python's own, never fail the run
            pass

    warnings.showwarning = show

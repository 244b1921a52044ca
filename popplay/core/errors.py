"""Failures users see as one line, each carrying the exit code its command ends with.

Lower layers raise these and never import the command line; the command line
(:func:`popplay.cli.main.main`) prints ``Error: <message>`` and exits with ``exit_code``.
"""
from __future__ import annotations

import re

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


def error_line(message: object) -> str:
    """The one line a failure shows users: ``Error: <message>`` on a single line, its
    control characters spelled out."""
    return "Error: " + spelled_out(" ".join(str(message).split()))

"""Entry point of one rank started by :func:`popplay.distributed.launch.launch_local`.

``python -m popplay.distributed.rank "popplay rank R/N" ARGV...``: the first argument
is the role (shown by ``ps``; the environment carries the same string as
``POPPLAY_ROLE``), the rest is the ``popplay`` command line, run unchanged.
"""
from __future__ import annotations

import ctypes
import signal
import sys


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when the launcher dies, so that a killed
    launcher never leaves orphan ranks behind (best effort elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].startswith("popplay rank "):
        print("Error: usage: python -m popplay.distributed.rank 'popplay rank R/N' ARGV...", file=sys.stderr)
        return 2
    _die_with_parent()
    from popplay.cli import main as cli_main

    return cli_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
